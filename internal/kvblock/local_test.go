package kvblock

import (
	"math/rand/v2"
	"slices"
	"testing"
)

func randomTokens(rng *rand.Rand, n int) []uint32 {
	tokens := make([]uint32, n)
	for i := range tokens {
		tokens[i] = rng.Uint32()
	}
	return tokens
}

func TestBlockCount(t *testing.T) {
	tests := []struct {
		numTokens, blockSize, want int
	}{
		{0, 16, 0},
		{15, 16, 0},
		{16, 16, 1},
		{47, 16, 2},
		{48, 16, 3},
		{10, 0, 0},
		{10, -4, 0},
		{-3, 4, 0},
	}
	for _, tt := range tests {
		if got := BlockCount(tt.numTokens, tt.blockSize); got != tt.want {
			t.Errorf("BlockCount(%d, %d) = %d, want %d", tt.numTokens, tt.blockSize, got, tt.want)
		}
	}
}

func TestNonPositiveBlockSizeLeavesDstUnchanged(t *testing.T) {
	tokens := []uint32{1, 2, 3, 4, 5}
	for _, blockSize := range []int{0, -1, -1 << 62} {
		dst := []uint64{7, 8}
		got := AppendLocalHashes(dst, tokens, blockSize, "adapter-a")
		if !slices.Equal(got, []uint64{7, 8}) {
			t.Errorf("blockSize %d: got %v, want dst [7 8] unchanged", blockSize, got)
		}
	}
}

func TestAppendLocalHashesKeepsDstPrefix(t *testing.T) {
	tokens := []uint32{1, 2, 3, 4, 5, 6, 7, 8}
	fresh := AppendLocalHashes(nil, tokens, 4, "")
	got := AppendLocalHashes([]uint64{42}, tokens, 4, "")
	if want := append([]uint64{42}, fresh...); !slices.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}

func TestPartialTailBlockIsIgnored(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, blockSize := range []int{1, 4, 16, 64} {
		full := randomTokens(rng, 3*blockSize)
		want := AppendLocalHashes(nil, full, blockSize, "")
		for extra := 1; extra < blockSize; extra++ {
			withTail := append(slices.Clone(full), randomTokens(rng, extra)...)
			if got := AppendLocalHashes(nil, withTail, blockSize, ""); !slices.Equal(got, want) {
				t.Fatalf("block size %d, %d tail tokens: got %v, want %v", blockSize, extra, got, want)
			}
		}
	}
}

// Keys of a prompt's prefix are a prefix of the prompt's keys: the property
// prefix matching in the index rests on.
func TestKeysOfPrefixArePrefixOfKeys(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for range 200 {
		blockSize := 1 + rng.IntN(32)
		tokens := randomTokens(rng, rng.IntN(20*blockSize))
		cut := rng.IntN(len(tokens) + 1)
		local := AppendLocalHashes(nil, tokens, blockSize, "adapter-a")
		chain := AppendChainHashes(nil, local)
		prefixLocal := AppendLocalHashes(nil, tokens[:cut], blockSize, "adapter-a")
		prefixChain := AppendChainHashes(nil, prefixLocal)
		if n := len(prefixLocal); n != cut/blockSize || !slices.Equal(prefixLocal, local[:n]) {
			t.Fatalf("block size %d, cut %d of %d: prefix locals %v are not a prefix of %v",
				blockSize, cut, len(tokens), prefixLocal, local)
		}
		if !slices.Equal(prefixChain, chain[:len(prefixChain)]) {
			t.Fatalf("block size %d, cut %d: prefix chain %v is not a prefix of %v",
				blockSize, cut, prefixChain, chain)
		}
	}
}

func TestChangingOneTokenChangesItsBlockAndLaterChainHashes(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	const blockSize, blocks = 16, 8
	tokens := randomTokens(rng, blockSize*blocks)
	local := AppendLocalHashes(nil, tokens, blockSize, "")
	chain := AppendChainHashes(nil, local)
	for pos := range tokens {
		changed := slices.Clone(tokens)
		changed[pos] ^= 1 << rng.IntN(32)
		changedLocal := AppendLocalHashes(nil, changed, blockSize, "")
		changedChain := AppendChainHashes(nil, changedLocal)
		hit := pos / blockSize
		for i := range blocks {
			if sameLocal := changedLocal[i] == local[i]; sameLocal != (i != hit) {
				t.Fatalf("token %d changed: local[%d] unchanged=%v, want %v", pos, i, sameLocal, i != hit)
			}
			if sameChain := changedChain[i] == chain[i]; sameChain != (i < hit) {
				t.Fatalf("token %d changed: chain[%d] unchanged=%v, want %v", pos, i, sameChain, i < hit)
			}
		}
	}
}

func TestLoRASeparatesKeys(t *testing.T) {
	tokens := randomTokens(rand.New(rand.NewPCG(7, 8)), 64)
	base := AppendLocalHashes(nil, tokens, 16, "")
	adapterA := AppendLocalHashes(nil, tokens, 16, "adapter-a")
	adapterB := AppendLocalHashes(nil, tokens, 16, "adapter-b")
	for i := range base {
		if base[i] == adapterA[i] || base[i] == adapterB[i] || adapterA[i] == adapterB[i] {
			t.Fatalf("block %d: base %d, adapter-a %d, adapter-b %d must all differ",
				i, base[i], adapterA[i], adapterB[i])
		}
	}
}

func TestLocalSeedDomains(t *testing.T) {
	tests := []struct {
		name string
		a, b uint64
		same bool
	}{
		{"no adapter is Dynamo's seed", LocalSeed("", ""), DynamoSeed, true},
		{"lora differs from base", LocalSeed("a", ""), DynamoSeed, false},
		{"namespace differs from base", LocalSeed("", "a"), DynamoSeed, false},
		{"same string as lora or namespace differs", LocalSeed("a", ""), LocalSeed("", "a"), false},
		{"lora and namespace combine", LocalSeed("a", "t"), LocalSeed("a", ""), false},
	}
	for _, tt := range tests {
		if (tt.a == tt.b) != tt.same {
			t.Errorf("%s: %d vs %d, want equal=%v", tt.name, tt.a, tt.b, tt.same)
		}
	}
}

// The in-place little-endian view and the explicit encoding must agree, or
// big-endian machines would compute other keys. Sizes straddle the
// portable path's stack buffer (256 tokens).
func TestPortableHashingMatchesInPlace(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	for _, size := range []int{1, 3, 4, 16, 60, 61, 64, 255, 256, 257, 1000} {
		block := randomTokens(rng, size)
		seed := rng.Uint64()
		if fast, portable := hashBlock(block, seed), hashBlockPortable(block, seed); fast != portable {
			t.Errorf("%d tokens: in-place %d, portable %d", size, fast, portable)
		}
	}
}

func TestLocalHashingAllocatesNothing(t *testing.T) {
	tokens := randomTokens(rand.New(rand.NewPCG(11, 12)), 128*16)
	dst := make([]uint64, 0, 128)
	allocs := testing.AllocsPerRun(100, func() {
		dst = AppendLocalHashes(dst[:0], tokens, 16, "adapter-a")
	})
	if allocs != 0 {
		t.Errorf("AppendLocalHashes with room in dst: %v allocations per run, want 0", allocs)
	}
	if seedAllocs := testing.AllocsPerRun(100, func() { _ = LocalSeed("adapter-a", "tenant") }); seedAllocs != 0 {
		t.Errorf("LocalSeed: %v allocations per run, want 0", seedAllocs)
	}
}
