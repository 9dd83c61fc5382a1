package kvblock

import (
	"encoding/binary"
	"slices"
	"testing"
)

// FuzzBlockKeys checks, for arbitrary tokens, block sizes and LoRA names,
// that hashing never panics and keeps its invariants: one key per full
// block, each block hashed on its own, the chain rule, and prefix stability.
func FuzzBlockKeys(f *testing.F) {
	f.Add([]byte{1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 4, 0, 0, 0}, 4, "")
	f.Add([]byte{1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 4, 0, 0, 0, 5, 0, 0}, 1, "adapter-a")
	f.Add([]byte{}, 16, "")
	f.Add([]byte{0xff, 0xff, 0xff, 0xff}, 0, "x")
	f.Add([]byte{0xff, 0xff, 0xff, 0xff}, -7, "")
	f.Fuzz(func(t *testing.T, data []byte, blockSize int, lora string) {
		tokens := make([]uint32, len(data)/4)
		for i := range tokens {
			tokens[i] = binary.LittleEndian.Uint32(data[4*i:])
		}
		seed := LocalSeed(lora, "")
		local := AppendLocalHashes(nil, tokens, blockSize, lora)
		if want := BlockCount(len(tokens), blockSize); len(local) != want {
			t.Fatalf("%d tokens, block size %d: %d local hashes, want %d", len(tokens), blockSize, len(local), want)
		}
		for i, got := range local {
			block := tokens[i*blockSize : (i+1)*blockSize]
			if want := hashBlockPortable(block, seed); got != want {
				t.Fatalf("block %d: local %d, hashing the block alone gives %d", i, got, want)
			}
		}
		chain := AppendChainHashes(nil, local)
		if len(chain) != len(local) {
			t.Fatalf("%d chain hashes for %d local hashes", len(chain), len(local))
		}
		for i := range chain {
			want := local[0]
			if i > 0 {
				want = NextChainHash(chain[i-1], local[i])
			}
			if chain[i] != want {
				t.Fatalf("chain[%d] = %d, want %d", i, chain[i], want)
			}
		}
		if len(tokens) > 0 {
			shorter := AppendLocalHashes(nil, tokens[:len(tokens)-1], blockSize, lora)
			if !slices.Equal(shorter, local[:len(shorter)]) {
				t.Fatalf("keys of the prompt minus its last token %v are not a prefix of %v", shorter, local)
			}
		}
	})
}
