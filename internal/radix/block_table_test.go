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
			checkBlockTable(t, &table, model)
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
			checkBlockTable(t, &table, model)
			for _, h := range present[:len(present)/2] { // shrink the count, keep the shards
				delete(model, h)
				table.delete(h)
			}
			checkBlockTable(t, &table, model)
			if tc.inserts > maxShardSlots && table.depth == 0 {
				t.Fatalf("%d entries in one shard: the table never split", table.count)
			}
		})
	}
}

func checkBlockTable(t *testing.T, table *blockTable, model map[uint64]entry) {
	t.Helper()
	if table.count != len(model) {
		t.Fatalf("count %d, want %d", table.count, len(model))
	}
	for h, want := range model {
		if got, ok := table.get(h); !ok || got != want {
			t.Fatalf("get(%x) = %v, %v; want %v", h, got, ok, want)
		}
	}
	for range 1000 {
		if h := rand.Uint64(); model[h] == (entry{}) {
			if e, ok := table.get(h); ok {
				t.Fatalf("get(%x) = %v for a hash never set", h, e)
			}
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
	// The directory: every entry repeats its shard's slots, a shard of local
	// depth d fills the 1<<(depth-d) entries of its prefix, and every hash in
	// it has that prefix; the shards' counts add up.
	counted := 0
	for s := range table.shards() {
		counted += s.count
		if len(s.slots) > maxShardSlots {
			t.Fatalf("a shard of %d slots, over %d", len(s.slots), maxShardSlots)
		}
	}
	if counted != table.count {
		t.Fatalf("shards count %d entries, the table %d", counted, table.count)
	}
	for i, d := range table.dir {
		if &d.slots[0] != &d.shard.slots[0] || len(d.slots) != len(d.shard.slots) {
			t.Fatalf("directory entry %d does not repeat its shard's slots", i)
		}
		prefix := uint64(i) >> (table.depth - d.shard.depth)
		for _, slot := range d.slots {
			if slot.node != 0 && table.mix(slot.hash)>>(64-d.shard.depth) != prefix && d.shard.depth > 0 {
				t.Fatalf("directory entry %d: hash %x outside its shard's prefix %b", i, slot.hash, prefix)
			}
		}
	}
}

// TestBlockTableSplitsUnevenly fills one corner of the hash space until its
// shards are several levels deeper than the rest, then splits a shallow shard
// that fills many directory entries (the case random hashes never reach).
func TestBlockTableSplitsUnevenly(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 5))
	table := newBlockTable(rng.Uint64())
	model := map[uint64]entry{}
	fill := func(n int, top uint64) { // n hashes whose mix has top 3 bits == top
		for added := 0; added < n; {
			h := rng.Uint64()
			if table.mix(h)>>61 != top {
				continue
			}
			e := entry{node: uint32(added + 1), tiers: 1}
			model[h] = e
			table.set(h, e)
			added++
		}
	}
	fill(12*maxShardSlots, 0b111)
	if table.depth < 4 {
		t.Fatalf("directory depth %d after filling one corner, want >= 4", table.depth)
	}
	shallow := table.dir[0].shard
	if span := 1 << (table.depth - shallow.depth); span < 4 {
		t.Fatalf("the shard of prefix 0 fills %d directory entries, want >= 4", span)
	}
	checkBlockTable(t, &table, model)
	fill(2*maxShardSlots, 0b000) // splits the shallow shard of many entries
	if table.dir[0].shard == shallow {
		t.Fatal("the shallow shard never split")
	}
	checkBlockTable(t, &table, model)
}
