package radix

import (
	"maps"
	"math/rand/v2"
	"testing"
)

// TestBlockTableAgreesWithAMap drives a table through growth, shard splits and
// directory doublings, with deletions throughout, and compares it with a map
// after every phase.
func TestBlockTableAgreesWithAMap(t *testing.T) {
	for _, tc := range []struct {
		name           string
		inserts, churn int // churn: delete one random present hash, insert one new
	}{
		{"one shard", 1000, 1000},
		{"splits", 10 * maxShardSlots, 2 * maxShardSlots},
		{"splits under churn", 3 * maxShardSlots, 20 * maxShardSlots},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(7, uint64(tc.inserts)))
			table := newBlockTable(rng.Uint64())
			model := map[uint64]entry{}
			var present []uint64
			add := func() {
				h := rng.Uint64()
				e := entry{node: rng.Uint32N(1<<20) + 1, tiers: uint8(rng.IntN(3) + 1)}
				if _, dup := model[h]; !dup {
					present = append(present, h)
				}
				model[h] = e
				table.set(h, e)
			}
			for range tc.inserts {
				add()
			}
			check(t, &table, model)
			for range tc.churn {
				k := rng.IntN(len(present))
				h := present[k]
				present[k] = present[len(present)-1]
				present = present[:len(present)-1]
				delete(model, h)
				table.delete(h)
				table.delete(h) // absent now: a no-op
				add()
			}
			check(t, &table, model)
			for _, h := range present[:len(present)/2] { // shrink the count, keep the shards
				delete(model, h)
				table.delete(h)
			}
			check(t, &table, model)
			if tc.inserts > maxShardSlots && table.depth == 0 {
				t.Fatalf("%d entries in one shard: the table never split", table.count)
			}
		})
	}
}

func check(t *testing.T, table *blockTable, model map[uint64]entry) {
	t.Helper()
	if table.count != len(model) {
		t.Fatalf("count %d, want %d", table.count, len(model))
	}
	for h, want := range model {
		if got, ok := table.get(h); !ok || got != want {
			t.Fatalf("get(%x) = %v, %v; want %v", h, got, ok, want)
		}
	}
	if got := maps.Collect(table.all()); !maps.Equal(got, model) {
		t.Fatalf("all() yields %d entries, want %d", len(got), len(model))
	}
	copied := 0
	for _, s := range table.copySlots() {
		if s.node != 0 {
			if model[s.hash] != s.entry {
				t.Fatalf("copySlots holds %x -> %v, want %v", s.hash, s.entry, model[s.hash])
			}
			copied++
		}
	}
	if copied != len(model) {
		t.Fatalf("copySlots holds %d entries, want %d", copied, len(model))
	}
	shards := 0
	for s := range table.shards() {
		shards++
		if len(s.slots) > maxShardSlots {
			t.Fatalf("a shard of %d slots, over %d", len(s.slots), maxShardSlots)
		}
	}
	if shards > len(table.dir) {
		t.Fatalf("%d shards for %d directory entries", shards, len(table.dir))
	}
}
