package radix

import (
	"fmt"
	"math/bits"
	"math/rand/v2"
	"reflect"
	"testing"
)

// chainLayout says, for one long chain of blocks, which tiers each worker holds
// each block on (0: not held).
type chainLayout struct {
	workers, blocks int
	mask            func(w, block int) uint8
}

// build stores the chain for every worker, block by block on each tier of its
// mask, then removes the blocks a worker does not hold (holes below blocks it
// keeps stay in the tree, as after LRU eviction).
func (c chainLayout) build(t *testing.T) (*Index, []uint64) {
	t.Helper()
	ix := New(Config{})
	keys := make([]uint64, c.blocks)
	for i := range keys {
		keys[i] = uint64(i)*0x9E3779B97F4A7C15 + 1
	}
	hash := func(i int) uint64 { return uint64(i + 1) }
	for w := range c.workers {
		wk := WorkerKey{Worker: fmt.Sprintf("w%03d", w)}
		var evicted []uint64
		for i := range c.blocks {
			mask := c.mask(w, i)
			tiers := mask
			if tiers == 0 {
				tiers = 1 << TierGPU // stored to keep the chain, removed below
				evicted = append(evicted, hash(i))
			}
			for m := tiers; m != 0; m &= m - 1 {
				if _, err := ix.Stored(wk, ns1, hash(i-1), i > 0, []uint64{hash(i)}, keys[i:i+1], Tier(bits.TrailingZeros8(m))); err != nil {
					t.Fatal(err)
				}
			}
		}
		if _, err := ix.Removed(wk, evicted, TierGPU); err != nil {
			t.Fatal(err)
		}
	}
	return ix, keys
}

// want computes Match's answer from the layout directly.
func (c chainLayout) want(filter map[int]bool) []WorkerMatch {
	var out []WorkerMatch
	for w := range c.workers {
		if filter != nil && !filter[w] {
			continue
		}
		m := WorkerMatch{Worker: WorkerKey{Worker: fmt.Sprintf("w%03d", w)}}
		for i := 0; i < c.blocks && c.mask(w, i) != 0; i++ {
			m.Blocks++
			m.PerTier[bits.TrailingZeros8(c.mask(w, i))]++
		}
		if m.Blocks > 0 {
			out = append(out, m)
		}
	}
	return out
}

// TestMatchLongRuns covers Match's runs of nodes held by the same workers: tiers
// varying block to block, identical stretches, runs longer than the counts hold
// between two settles (maxCounted), odd and even holder counts, holes and
// workers dropping out mid-run, with and without a filter.
func TestMatchLongRuns(t *testing.T) {
	const long = 2*maxCounted + 77
	rng := rand.New(rand.NewPCG(11, 12))
	random := make([][]uint8, 13) // per worker and block: a random non-empty mask, in stretches
	for w := range random {
		random[w] = make([]uint8, long)
		mask := uint8(1)
		for i := range random[w] {
			if rng.IntN(5) == 0 {
				mask = uint8(1 + rng.IntN(7))
			}
			random[w][i] = mask
		}
	}
	tests := []struct {
		name   string
		layout chainLayout
	}{
		{"64 workers, tiers vary every block", chainLayout{64, long, func(w, i int) uint8 { return 1 << ((w + i) % NumTiers) }}},
		{"5 workers, one on the same tier throughout, lists differ", chainLayout{5, long, func(w, i int) uint8 {
			if w == 3 {
				return 1 << TierCPU
			}
			return 1 << ((w + i) % NumTiers)
		}}},
		{"7 workers, one tier each, identical lists", chainLayout{7, long, func(w, i int) uint8 { return 1 << (w % NumTiers) }}},
		{"4 workers, tiers change once", chainLayout{4, long, func(w, i int) uint8 {
			if i < 1500 {
				return 1 << TierDisk
			}
			return 1<<TierCPU | 1<<TierDisk
		}}},
		{"2 workers", chainLayout{2, 40, func(w, i int) uint8 { return 1 << ((w * i) % NumTiers) }}},
		{"1 worker", chainLayout{1, 40, func(w, i int) uint8 { return 1 << (i % NumTiers) }}},
		{"13 workers, random masks in stretches", chainLayout{13, long, func(w, i int) uint8 { return random[w][i] }}},
		{"workers drop out at different depths", chainLayout{10, long, func(w, i int) uint8 {
			if i >= 200*(w+1) {
				return 0
			}
			return 1 << ((w + i/3) % NumTiers)
		}}},
		{"holes: a worker misses blocks, keeps later ones", chainLayout{9, 3000, func(w, i int) uint8 {
			if w%3 == 0 && i >= 500+w*100 && i < 600+w*100 {
				return 0
			}
			return 1 << ((w + i) % NumTiers)
		}}},
		{"a worker joins below the first block", chainLayout{5, 3000, func(w, i int) uint8 {
			if w == 2 && i < 1000 {
				return 0
			}
			return 1 << (i % NumTiers)
		}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ix, keys := tt.layout.build(t)
			var dst []WorkerMatch
			for _, n := range []int{1, 2, maxCounted, maxCounted + 1, len(keys)} {
				n = min(n, len(keys))
				dst = ix.Match(ns1, keys[:n], nil, dst)
				short := tt.layout
				short.blocks = n
				if want := short.want(nil); !reflect.DeepEqual(dst, want) {
					t.Fatalf("Match of %d blocks:\n got  %+v\n want %+v", n, dst, want)
				}
			}
			filter := map[int]bool{0: true, tt.layout.workers - 1: true}
			names := []string{"w000", fmt.Sprintf("w%03d", tt.layout.workers-1)}
			if got, want := ix.Match(ns1, keys, names, nil), tt.layout.want(filter); !reflect.DeepEqual(got, want) {
				t.Fatalf("Match filtered to %v:\n got  %+v\n want %+v", names, got, want)
			}
		})
	}
}
