package radix

import (
	"maps"
	"slices"
	"testing"
)

func TestHolderStatsCountTiersAndAliasesOnce(t *testing.T) {
	ix := New(Config{})
	a, b := WorkerKey{"a", 0}, WorkerKey{"b", 1}
	mustStore := func(w WorkerKey, parent uint64, hasParent bool, hashes, keys []uint64, tier Tier) {
		t.Helper()
		if _, err := ix.Stored(w, 7, parent, hasParent, hashes, keys, tier); err != nil {
			t.Fatal(err)
		}
	}
	mustStore(a, 0, false, []uint64{1, 2, 3}, []uint64{10, 20, 30}, TierGPU)
	mustStore(a, 1, true, []uint64{2}, []uint64{20}, TierCPU)   // block 2 now on GPU and CPU
	mustStore(a, 0, false, []uint64{4}, []uint64{10}, TierDisk) // alias of block 1's node
	mustStore(a, 99, true, []uint64{5}, []uint64{50}, TierGPU)  // detached
	mustStore(b, 0, false, []uint64{1}, []uint64{10}, TierCPU)

	got := ix.HolderStats(nil)
	want := []HolderStats{
		{Worker: a, PerTier: [NumTiers]int{3, 1, 1}, Detached: 1},
		{Worker: b, PerTier: [NumTiers]int{0, 1, 0}},
	}
	if !slices.Equal(got, want) {
		t.Errorf("HolderStats = %+v, want %+v", got, want)
	}
	if got := ix.DetachedBlocks(); !maps.Equal(got, map[string]int{"a": 1}) {
		t.Errorf("DetachedBlocks = %v, want a: 1", got)
	}
	if got := ix.HolderStats([]string{"b"}); len(got) != 1 || got[0].Worker != b {
		t.Errorf("filtered HolderStats = %+v", got)
	}
	if n := ix.HeldBlocks(a); n != 4 { // engine hashes 1, 2, 3, 4
		t.Errorf("HeldBlocks(a) = %d, want 4", n)
	}
	if n := ix.HeldBlocks(WorkerKey{"c", 0}); n != 0 {
		t.Errorf("HeldBlocks(unknown) = %d", n)
	}

	ns, keys, ok := ix.BlockPath(a, 3, []uint64{42})
	if !ok || ns != 7 || !slices.Equal(keys, []uint64{42, 10, 20, 30}) {
		t.Errorf("BlockPath(a, 3) = %d %v %v", ns, keys, ok)
	}
	for _, h := range []uint64{5, 6} { // detached, unknown
		if _, _, ok := ix.BlockPath(a, h, nil); ok {
			t.Errorf("BlockPath(a, %d) found a path", h)
		}
	}

	nodes := ix.Nodes()
	if len(nodes) != 4 { // namespace root 7, then 10, 20, 30
		t.Fatalf("Nodes = %+v", nodes)
	}
	if nodes[0].Parent != -1 || nodes[0].Key != 7 || len(nodes[0].Holders) != 0 {
		t.Errorf("namespace root = %+v", nodes[0])
	}
	for i, key := range []uint64{10, 20, 30} {
		n := nodes[i+1]
		if n.ID != i+1 || n.Parent != i || n.Key != key {
			t.Errorf("node %d = %+v", i+1, n)
		}
	}
	wantHolders := []Holding{{a, 1<<TierGPU | 1<<TierDisk}, {b, 1 << TierCPU}}
	if !slices.Equal(nodes[1].Holders, wantHolders) {
		t.Errorf("holders of block 10 = %+v, want %+v", nodes[1].Holders, wantHolders)
	}
	if !slices.Equal(nodes[2].Holders, []Holding{{a, 1<<TierGPU | 1<<TierCPU}}) {
		t.Errorf("holders of block 20 = %+v", nodes[2].Holders)
	}
}
