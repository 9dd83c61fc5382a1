package radix

import (
	"math/rand/v2"
	"testing"
)

// TestEdgeTableAgreesWithAMap drives the edge table through growth, shard
// splits and directory doublings, with removals throughout, and compares it
// with a map after every phase.
func TestEdgeTableAgreesWithAMap(t *testing.T) {
	type edge struct {
		parent uint32
		key    uint64
	}
	for _, tc := range []struct {
		name           string
		inserts, churn int // churn: remove one random edge, insert one new
	}{
		{"one shard", 1000, 1000},
		{"splits", 10 * maxEdgeShardSlots, 2 * maxEdgeShardSlots},
		{"splits under churn", 3 * maxEdgeShardSlots, 20 * maxEdgeShardSlots},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(11, uint64(tc.inserts)))
			table := newEdgeTable(rng.Uint64())
			var nodes nodeArena
			nodes.push(node{parent: noNode})
			model := map[edge]uint32{}
			var present []edge
			add := func() {
				// Few parents with many children each, as a branching point has.
				e := edge{parent: rng.Uint32N(64) + 1, key: rng.Uint64()}
				child := nodes.push(node{key: e.key, parent: e.parent})
				model[e] = child
				present = append(present, e)
				table.insert(e.parent, e.key, child)
			}
			check := func() {
				t.Helper()
				if table.count != len(model) {
					t.Fatalf("count %d, want %d", table.count, len(model))
				}
				for e, want := range model {
					if got := table.find(&nodes, e.parent, e.key); got != want {
						t.Fatalf("find(%d, %x) = %d, want %d", e.parent, e.key, got, want)
					}
				}
				for range 1000 {
					if got := table.find(&nodes, rng.Uint32N(64)+1, rng.Uint64()); got != 0 {
						t.Fatalf("found node %d for an edge never inserted", got)
					}
				}
			}
			for range tc.inserts {
				add()
			}
			check()
			for range tc.churn {
				k := rng.IntN(len(present))
				e := present[k]
				present[k] = present[len(present)-1]
				present = present[:len(present)-1]
				table.remove(e.parent, e.key, model[e])
				delete(model, e)
				add()
			}
			check()
			if tc.inserts > maxEdgeShardSlots && table.depth == 0 {
				t.Fatalf("%d edges in one shard: the table never split", table.count)
			}
			for _, d := range table.dir {
				if len(d.slots) > maxEdgeShardSlots || &d.slots[0] != &d.shard.slots[0] {
					t.Fatalf("a directory entry of %d slots, not its shard's %d", len(d.slots), len(d.shard.slots))
				}
			}
		})
	}
}

// TestEdgeTableSplitsUnevenly is TestBlockTableSplitsUnevenly for edges.
func TestEdgeTableSplitsUnevenly(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 3))
	table := newEdgeTable(rng.Uint64())
	var nodes nodeArena
	nodes.push(node{parent: noNode})
	fill := func(n int, top uint64) { // n edges whose hash has top 3 bits == top
		for added := 0; added < n; {
			parent, key := rng.Uint32N(64)+1, rng.Uint64()
			if table.hash(parent, key)>>61 != top {
				continue
			}
			table.insert(parent, key, nodes.push(node{key: key, parent: parent}))
			added++
		}
	}
	check := func() {
		t.Helper()
		if table.count != nodes.len()-1 {
			t.Fatalf("count %d, want %d", table.count, nodes.len()-1)
		}
		for c := uint32(1); int(c) < nodes.len(); c++ {
			if n := nodes.at(c); table.find(&nodes, n.parent, n.key) != c {
				t.Fatalf("edge to node %d not found", c)
			}
		}
		for i, d := range table.dir {
			if &d.slots[0] != &d.shard.slots[0] {
				t.Fatalf("directory entry %d does not repeat its shard's slots", i)
			}
			prefix := uint64(i) >> (table.depth - d.shard.depth)
			for _, slot := range d.slots {
				if slot != 0 && d.shard.depth > 0 && slot>>(64-d.shard.depth) != prefix {
					t.Fatalf("directory entry %d: slot %x outside its shard's prefix %b", i, slot, prefix)
				}
			}
		}
	}
	fill(12*maxEdgeShardSlots, 0b111)
	shallow := table.dir[0].shard
	if span := 1 << (table.depth - shallow.depth); span < 4 {
		t.Fatalf("the shard of prefix 0 fills %d directory entries, want >= 4", span)
	}
	check()
	fill(2*maxEdgeShardSlots, 0b000)
	if table.dir[0].shard == shallow {
		t.Fatal("the shallow shard never split")
	}
	check()
}
