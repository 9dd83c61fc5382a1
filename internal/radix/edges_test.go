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
