package kvblock

import (
	"math/rand/v2"
	"slices"
	"testing"
)

func TestAppendChainHashes(t *testing.T) {
	tests := []struct {
		name   string
		dst    []uint64
		locals []uint64
		want   []uint64
	}{
		{"no blocks", nil, nil, nil},
		{"no blocks keeps dst", []uint64{9}, nil, []uint64{9}},
		{"root chain hash is its local hash", nil, []uint64{11}, []uint64{11}},
		{"appends after dst", []uint64{9}, []uint64{11, 22},
			[]uint64{9, 11, NextChainHash(11, 22)}},
		{"each step chains on the previous", nil, []uint64{11, 22, 33},
			[]uint64{11, NextChainHash(11, 22), NextChainHash(NextChainHash(11, 22), 33)}},
	}
	for _, tt := range tests {
		if got := AppendChainHashes(tt.dst, tt.locals); !slices.Equal(got, tt.want) {
			t.Errorf("%s: got %v, want %v", tt.name, got, tt.want)
		}
	}
}

// Continuing a chain from a known parent must give what hashing the whole
// sequence gives, so ingest can extend stored chains block by block.
func TestNextChainHashContinuesChain(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 14))
	locals := make([]uint64, 32)
	for i := range locals {
		locals[i] = rng.Uint64()
	}
	whole := AppendChainHashes(nil, locals)
	for split := 1; split < len(locals); split++ {
		seq := whole[split-1]
		for i, local := range locals[split:] {
			seq = NextChainHash(seq, local)
			if seq != whole[split+i] {
				t.Fatalf("split at %d: block %d chain %d, want %d", split, split+i, seq, whole[split+i])
			}
		}
	}
}

func TestNextChainHashIsOrderSensitive(t *testing.T) {
	if NextChainHash(1, 2) == NextChainHash(2, 1) {
		t.Error("NextChainHash(1, 2) == NextChainHash(2, 1): parent and child must not commute")
	}
}

func TestChainHashingAllocatesNothing(t *testing.T) {
	locals := make([]uint64, 128)
	for i := range locals {
		locals[i] = uint64(i) * 0x9E3779B97F4A7C15
	}
	dst := make([]uint64, 0, len(locals))
	allocs := testing.AllocsPerRun(100, func() {
		dst = AppendChainHashes(dst[:0], locals)
	})
	if allocs != 0 {
		t.Errorf("AppendChainHashes with room in dst: %v allocations per run, want 0", allocs)
	}
}
