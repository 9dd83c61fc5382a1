package kvblock

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// reportTokenRate adds tokens/s next to the MB/s that b.SetBytes gives
// (4 bytes per token).
func reportTokenRate(b *testing.B, tokensPerOp int) {
	b.ReportMetric(float64(tokensPerOp)*float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
}

func BenchmarkAppendLocalHashes(b *testing.B) {
	const numTokens = 8192
	tokens := randomTokens(rand.New(rand.NewPCG(1, 1)), numTokens)
	for _, blockSize := range []int{16, 64, 128} {
		for _, lora := range []string{"", "adapter-a"} {
			name := fmt.Sprintf("block=%d/lora=%t", blockSize, lora != "")
			b.Run(name, func(b *testing.B) {
				dst := make([]uint64, 0, numTokens/blockSize)
				b.SetBytes(4 * numTokens)
				b.ReportAllocs()
				for b.Loop() {
					dst = AppendLocalHashes(dst[:0], tokens, blockSize, lora)
				}
				reportTokenRate(b, numTokens)
			})
		}
	}
}

// Chain hashing costs one 16-byte hash per block whatever the block size;
// tokens/s is given for blocks of 16 tokens.
func BenchmarkAppendChainHashes(b *testing.B) {
	const blocks, blockSize = 512, 16
	locals := AppendLocalHashes(nil, randomTokens(rand.New(rand.NewPCG(2, 2)), blocks*blockSize), blockSize, "")
	dst := make([]uint64, 0, blocks)
	b.SetBytes(4 * blocks * blockSize)
	b.ReportAllocs()
	for b.Loop() {
		dst = AppendChainHashes(dst[:0], locals)
	}
	reportTokenRate(b, blocks*blockSize)
}

// BenchmarkPromptKeys is a router's per-request cost: local and chain keys
// of a 128-block prompt (2048 tokens at block size 16).
func BenchmarkPromptKeys(b *testing.B) {
	const blocks, blockSize = 128, 16
	tokens := randomTokens(rand.New(rand.NewPCG(3, 3)), blocks*blockSize)
	local := make([]uint64, 0, blocks)
	chain := make([]uint64, 0, blocks)
	b.SetBytes(4 * blocks * blockSize)
	b.ReportAllocs()
	for b.Loop() {
		local = AppendLocalHashes(local[:0], tokens, blockSize, "")
		chain = AppendChainHashes(chain[:0], local)
	}
	reportTokenRate(b, blocks*blockSize)
}

func BenchmarkNamespaceID(b *testing.B) {
	ns := Namespace{Model: "meta-llama/Llama-3.1-8B-Instruct", LoRA: "adapter-a", CacheSalt: "tenant-7"}
	b.ReportAllocs()
	for b.Loop() {
		_ = ns.ID()
	}
}
