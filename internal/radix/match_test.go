package radix

import (
	"fmt"
	"maps"
	"math/bits"
	"math/rand/v2"
	"reflect"
	"slices"
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
// between two settles (maxCounted), holder counts crossing 64, holes and
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
		{"130 workers (three plane words), masks vary every block", chainLayout{130, 700, func(w, i int) uint8 { return uint8(1 + (w*5+i*3)%7) }}},
		{"65 workers, the last drops out", chainLayout{65, 600, func(w, i int) uint8 {
			if w == 64 && i >= 300 {
				return 0
			}
			return 1 << ((w + i) % NumTiers)
		}}},
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

// TestHolderSetsAgreeWithAMap sets, changes and removes the holders of one node
// in random order, up to 150 workers (three words of tier planes, inline and
// spilled forms both ways), and compares every holder and Match with a map.
func TestHolderSetsAgreeWithAMap(t *testing.T) {
	const workers = 150
	rng := rand.New(rand.NewPCG(21, 22))
	ix := New(Config{})
	want := map[int]uint8{} // worker -> tier mask
	key := []uint64{10}
	name := func(w int) WorkerKey { return WorkerKey{Worker: fmt.Sprintf("w%03d", w)} }
	most, fewestAfter := 0, workers // fewest holders seen after the most
	for step := range 6000 {
		w, tier := rng.IntN(workers), Tier(rng.IntN(NumTiers))
		// Grow for a while, then shrink, then grow again, so counts cross 2 and 64
		// both ways. A removal mostly takes a tier some holder has.
		if grow := step%3000 < 1500; grow == (rng.IntN(10) != 0) {
			if _, err := ix.Stored(name(w), ns1, 0, false, u(1), key, tier); err != nil {
				t.Fatal(err)
			}
			want[w] |= tier.bit()
		} else {
			if held := slices.Sorted(maps.Keys(want)); len(held) > 0 && rng.IntN(5) != 0 {
				w = held[rng.IntN(len(held))]
				tier = Tier(bits.TrailingZeros8(want[w]))
			}
			if _, err := ix.Removed(name(w), u(1), tier); err != nil {
				t.Fatal(err)
			}
			if want[w] &^= tier.bit(); want[w] == 0 {
				delete(want, w)
			}
		}
		if len(want) > most {
			most, fewestAfter = len(want), len(want)
		}
		fewestAfter = min(fewestAfter, len(want))
		if step%50 != 0 {
			continue
		}
		if err := checkInvariants(ix); err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		var wantMatch []WorkerMatch
		for w := range workers {
			if mask, ok := want[w]; ok {
				m := WorkerMatch{Worker: name(w), Blocks: 1}
				m.PerTier[bits.TrailingZeros8(mask)] = 1
				wantMatch = append(wantMatch, m)
			}
		}
		if got := ix.Match(ns1, key, nil, nil); !reflect.DeepEqual(got, wantMatch) && len(got)+len(wantMatch) > 0 {
			t.Fatalf("step %d: Match = %+v, want %+v", step, got, wantMatch)
		}
	}
	if most <= 128 || fewestAfter > 2 {
		t.Errorf("holder counts went up to %d and down to %d, want beyond 128 and to 2 or fewer", most, fewestAfter)
	}
}
