package radix

import (
	"errors"
	"reflect"
	"testing"
)

const ns1, ns2 = uint64(0xA1), uint64(0xB2)

var (
	wA  = WorkerKey{Worker: "a"}
	wA1 = WorkerKey{Worker: "a", DPRank: 1}
	wB  = WorkerKey{Worker: "b"}
	wC  = WorkerKey{Worker: "c"}
)

// op is one step of a table test; exactly one of its fields is set.
type op struct {
	store   *storeOp
	remove  *removeOp
	clear   *WorkerKey
	dropAll string // RemoveWorker
}

type storeOp struct {
	w         WorkerKey
	ns        uint64
	parent    uint64
	hasParent bool
	hashes    []uint64
	keys      []uint64
	tier      Tier
	want      StoreResult
}

type removeOp struct {
	w      WorkerKey
	hashes []uint64
	tier   Tier
	want   RemoveResult
}

// root stores hashes under the root of ns; under stores them under parent.
func root(w WorkerKey, ns uint64, hashes, keys []uint64, tier Tier, want StoreResult) op {
	return op{store: &storeOp{w: w, ns: ns, hashes: hashes, keys: keys, tier: tier, want: want}}
}

func under(w WorkerKey, parent uint64, hashes, keys []uint64, tier Tier, want StoreResult) op {
	return op{store: &storeOp{w: w, parent: parent, hasParent: true, hashes: hashes, keys: keys, tier: tier, want: want}}
}

func remove(w WorkerKey, hashes []uint64, tier Tier, want RemoveResult) op {
	return op{remove: &removeOp{w: w, hashes: hashes, tier: tier, want: want}}
}

type query struct {
	ns     uint64
	keys   []uint64
	filter []string
	want   []WorkerMatch
}

func m(w WorkerKey, gpu, cpu, disk int) WorkerMatch {
	return WorkerMatch{Worker: w, Blocks: gpu + cpu + disk, PerTier: [NumTiers]int{gpu, cpu, disk}}
}

func u(v ...uint64) []uint64 { return v }

func run(t *testing.T, ix *Index, ops []op) {
	t.Helper()
	for i, o := range ops {
		switch {
		case o.store != nil:
			s := o.store
			got, err := ix.Stored(s.w, s.ns, s.parent, s.hasParent, s.hashes, s.keys, s.tier)
			if err != nil || got != s.want {
				t.Fatalf("op %d Stored(%v %x): got %+v, %v; want %+v", i, s.w, s.hashes, got, err, s.want)
			}
		case o.remove != nil:
			r := o.remove
			got, err := ix.Removed(r.w, r.hashes, r.tier)
			if err != nil || got != r.want {
				t.Fatalf("op %d Removed(%v %x): got %+v, %v; want %+v", i, r.w, r.hashes, got, err, r.want)
			}
		case o.clear != nil:
			ix.Cleared(*o.clear)
		default:
			ix.RemoveWorker(o.dropAll)
		}
		if err := checkInvariants(ix); err != nil {
			t.Fatalf("after op %d: %v", i, err)
		}
	}
}

func TestEdgeCases(t *testing.T) {
	attached := func(n int) StoreResult { return StoreResult{Attached: n} }
	tests := []struct {
		name    string
		ops     []op
		queries []query
		stats   Stats // sizes only
	}{{
		name: "match is the longest contiguous prefix, per worker",
		ops: []op{
			root(wA, ns1, u(1, 2, 3), u(10, 20, 30), TierGPU, attached(3)),
			root(wB, ns1, u(1, 2), u(10, 20), TierGPU, attached(2)),
			root(wC, ns1, u(7), u(99), TierGPU, attached(1)),
		},
		queries: []query{
			{ns: ns1, keys: u(10, 20, 30, 40), want: []WorkerMatch{m(wA, 3, 0, 0), m(wB, 2, 0, 0)}},
			{ns: ns1, keys: u(10, 21, 30), want: []WorkerMatch{m(wA, 1, 0, 0), m(wB, 1, 0, 0)}},
			{ns: ns1, keys: u(20, 30), want: nil},
			{ns: ns1, keys: nil, want: nil},
		},
		stats: Stats{Workers: 3, Namespaces: 1, Nodes: 4, Residencies: 6},
	}, {
		name: "per-tier counts use the fastest tier held and sum to Blocks",
		ops: []op{
			root(wA, ns1, u(1, 2, 3), u(10, 20, 30), TierDisk, attached(3)),
			under(wA, 1, u(2), u(20), TierCPU, attached(1)),
			root(wA, ns1, u(1), u(10), TierGPU, attached(1)),
		},
		queries: []query{{ns: ns1, keys: u(10, 20, 30), want: []WorkerMatch{m(wA, 1, 1, 1)}}},
		stats:   Stats{Workers: 1, Namespaces: 1, Nodes: 3, Residencies: 3},
	}, {
		name: "Removed drops only its tier",
		ops: []op{
			root(wA, ns1, u(1, 2), u(10, 20), TierGPU, attached(2)),
			root(wA, ns1, u(1, 2), u(10, 20), TierCPU, attached(2)),
			remove(wA, u(1, 2), TierGPU, RemoveResult{Removed: 2}),
			remove(wA, u(1, 2), TierGPU, RemoveResult{Unknown: 2}),
		},
		queries: []query{{ns: ns1, keys: u(10, 20), want: []WorkerMatch{m(wA, 0, 2, 0)}}},
		stats:   Stats{Workers: 1, Namespaces: 1, Nodes: 2, Residencies: 2},
	}, {
		name: "Removed of unknown hashes and unknown workers is counted and changes nothing",
		ops: []op{
			root(wA, ns1, u(1), u(10), TierGPU, attached(1)),
			remove(wA, u(99), TierGPU, RemoveResult{Unknown: 1}),
			remove(wB, u(1), TierGPU, RemoveResult{Unknown: 1}),
		},
		queries: []query{{ns: ns1, keys: u(10), want: []WorkerMatch{m(wA, 1, 0, 0)}}},
		stats:   Stats{Workers: 1, Namespaces: 1, Nodes: 1, Residencies: 1},
	}, {
		name: "duplicate Stored is idempotent and counted",
		ops: []op{
			root(wA, ns1, u(1, 2), u(10, 20), TierGPU, attached(2)),
			root(wA, ns1, u(1, 2), u(10, 20), TierGPU, StoreResult{Duplicate: 2}),
			under(wA, 1, u(2), u(20), TierGPU, StoreResult{Duplicate: 1}),
		},
		queries: []query{{ns: ns1, keys: u(10, 20), want: []WorkerMatch{m(wA, 2, 0, 0)}}},
		stats:   Stats{Workers: 1, Namespaces: 1, Nodes: 2, Residencies: 2},
	}, {
		name: "a child whose parent was evicted cannot match until the parent is stored again",
		ops: []op{
			root(wA, ns1, u(1, 2, 3), u(10, 20, 30), TierGPU, attached(3)),
			remove(wA, u(2), TierGPU, RemoveResult{Removed: 1}),
		},
		queries: []query{{ns: ns1, keys: u(10, 20, 30), want: []WorkerMatch{m(wA, 1, 0, 0)}}},
		stats:   Stats{Workers: 1, Namespaces: 1, Nodes: 3, Residencies: 2},
	}, {
		name: "... and comes back into reach when it is",
		ops: []op{
			root(wA, ns1, u(1, 2, 3), u(10, 20, 30), TierGPU, attached(3)),
			remove(wA, u(2), TierGPU, RemoveResult{Removed: 1}),
			under(wA, 1, u(2), u(20), TierCPU, attached(1)),
		},
		queries: []query{{ns: ns1, keys: u(10, 20, 30), want: []WorkerMatch{m(wA, 2, 1, 0)}}},
		stats:   Stats{Workers: 1, Namespaces: 1, Nodes: 3, Residencies: 3},
	}, {
		name: "when the last holder of an inner node leaves, descendants others hold are kept",
		ops: []op{
			root(wA, ns1, u(1, 2), u(10, 20), TierGPU, attached(2)),
			root(wB, ns1, u(1, 2, 3), u(10, 20, 30), TierGPU, attached(3)),
			remove(wB, u(1, 2), TierGPU, RemoveResult{Removed: 2}),
			remove(wA, u(1, 2), TierGPU, RemoveResult{Removed: 2}),
			root(wC, ns1, u(1, 2), u(10, 20), TierGPU, attached(2)),
			root(wB, ns1, u(1, 2), u(10, 20), TierGPU, attached(2)),
		},
		queries: []query{{ns: ns1, keys: u(10, 20, 30), want: []WorkerMatch{m(wB, 3, 0, 0), m(wC, 2, 0, 0)}}},
		stats:   Stats{Workers: 3, Namespaces: 1, Nodes: 3, Residencies: 5},
	}, {
		name: "holder-less inner nodes stay while a descendant is held",
		ops: []op{
			root(wA, ns1, u(1, 2, 3), u(10, 20, 30), TierGPU, attached(3)),
			remove(wA, u(1, 2), TierGPU, RemoveResult{Removed: 2}),
		},
		queries: []query{{ns: ns1, keys: u(10, 20, 30), want: nil}},
		stats:   Stats{Workers: 1, Namespaces: 1, Nodes: 3, Residencies: 1},
	}, {
		name: "empty nodes are freed up the chain, namespace root included",
		ops: []op{
			root(wA, ns1, u(1, 2, 3), u(10, 20, 30), TierGPU, attached(3)),
			remove(wA, u(1, 2), TierGPU, RemoveResult{Removed: 2}),
			remove(wA, u(3), TierGPU, RemoveResult{Removed: 1}),
		},
		stats: Stats{Workers: 1},
	}, {
		name: "unknown parent: blocks are detached, invisible, removable",
		ops: []op{
			under(wA, 77, u(1, 2), u(10, 20), TierGPU, StoreResult{Detached: 2}),
			remove(wA, u(2), TierGPU, RemoveResult{Removed: 1}),
		},
		queries: []query{{ns: ns1, keys: u(10, 20), want: nil}},
		stats:   Stats{Workers: 1, Detached: 1},
	}, {
		name: "detached blocks attach when their parent is stored, transitively",
		ops: []op{
			under(wA, 2, u(3), u(30), TierCPU, StoreResult{Detached: 1}),
			under(wA, 3, u(4), u(40), TierGPU, StoreResult{Detached: 1}),
			under(wA, 1, u(2), u(20), TierGPU, StoreResult{Detached: 1}),
			root(wA, ns1, u(1), u(10), TierGPU, StoreResult{Attached: 1, Reattached: 3}),
		},
		queries: []query{{ns: ns1, keys: u(10, 20, 30, 40, 50), want: []WorkerMatch{m(wA, 3, 1, 0)}}},
		stats:   Stats{Workers: 1, Namespaces: 1, Nodes: 4, Residencies: 4},
	}, {
		name: "detached blocks beyond the bound are dropped and counted",
		ops: []op{
			under(wA, 77, u(1, 2, 3, 4, 5), u(10, 20, 30, 40, 50), TierGPU, StoreResult{Detached: 4, Dropped: 1}),
			under(wB, 77, u(1), u(10), TierGPU, StoreResult{Detached: 1}),
		},
		stats: Stats{Workers: 2, Detached: 5},
	}, {
		name: "a hash stored again elsewhere moves, with all its tiers",
		ops: []op{
			root(wA, ns1, u(1), u(10), TierGPU, attached(1)),
			root(wA, ns1, u(1), u(10), TierCPU, attached(1)),
			root(wA, ns2, u(1), u(11), TierDisk, StoreResult{Attached: 1, Replaced: 1}),
		},
		queries: []query{
			{ns: ns1, keys: u(10), want: nil},
			{ns: ns2, keys: u(11), want: []WorkerMatch{m(wA, 0, 0, 1)}},
		},
		stats: Stats{Workers: 1, Namespaces: 1, Nodes: 1, Residencies: 1},
	}, {
		name: "a held hash stored under an unknown parent becomes detached",
		ops: []op{
			root(wA, ns1, u(1, 2), u(10, 20), TierGPU, attached(2)),
			under(wA, 77, u(2), u(20), TierGPU, StoreResult{Detached: 1, Replaced: 1}),
		},
		queries: []query{{ns: ns1, keys: u(10, 20), want: []WorkerMatch{m(wA, 1, 0, 0)}}},
		stats:   Stats{Workers: 1, Namespaces: 1, Nodes: 1, Residencies: 1, Detached: 1},
	}, {
		name: "two hashes on one node: a tier stays while either hash holds it",
		ops: []op{
			root(wA, ns1, u(1), u(10), TierGPU, attached(1)),
			root(wA, ns1, u(2), u(10), TierGPU, attached(1)),
			root(wA, ns1, u(2), u(10), TierCPU, attached(1)),
			remove(wA, u(1), TierGPU, RemoveResult{Removed: 1}),
		},
		queries: []query{{ns: ns1, keys: u(10), want: []WorkerMatch{m(wA, 1, 0, 0)}}},
		stats:   Stats{Workers: 1, Namespaces: 1, Nodes: 1, Residencies: 1},
	}, {
		name: "namespaces never share nodes",
		ops: []op{
			root(wA, ns1, u(1), u(10), TierGPU, attached(1)),
			root(wB, ns2, u(1), u(10), TierGPU, attached(1)),
		},
		queries: []query{
			{ns: ns1, keys: u(10), want: []WorkerMatch{m(wA, 1, 0, 0)}},
			{ns: ns2, keys: u(10), want: []WorkerMatch{m(wB, 1, 0, 0)}},
			{ns: 0xC3, keys: u(10), want: nil},
		},
		stats: Stats{Workers: 2, Namespaces: 2, Nodes: 2, Residencies: 2},
	}, {
		name: "a block under a parent joins the parent's namespace",
		ops: []op{
			root(wA, ns1, u(1), u(10), TierGPU, attached(1)),
			{store: &storeOp{w: wA, ns: ns2, parent: 1, hasParent: true, hashes: u(2), keys: u(20), want: attached(1)}},
		},
		queries: []query{{ns: ns1, keys: u(10, 20), want: []WorkerMatch{m(wA, 2, 0, 0)}}},
		stats:   Stats{Workers: 1, Namespaces: 1, Nodes: 2, Residencies: 2},
	}, {
		name: "filter by worker name covers all dp ranks; empty filter matches nobody",
		ops: []op{
			root(wA, ns1, u(1), u(10), TierGPU, attached(1)),
			root(wA1, ns1, u(1), u(10), TierGPU, attached(1)),
			root(wB, ns1, u(1), u(10), TierGPU, attached(1)),
		},
		queries: []query{
			{ns: ns1, keys: u(10), filter: []string{"a"}, want: []WorkerMatch{m(wA, 1, 0, 0), m(wA1, 1, 0, 0)}},
			{ns: ns1, keys: u(10), filter: []string{"b", "zz"}, want: []WorkerMatch{m(wB, 1, 0, 0)}},
			{ns: ns1, keys: u(10), filter: []string{}, want: nil},
			{ns: ns1, keys: u(10), want: []WorkerMatch{m(wA, 1, 0, 0), m(wA1, 1, 0, 0), m(wB, 1, 0, 0)}},
		},
		stats: Stats{Workers: 3, Namespaces: 1, Nodes: 1, Residencies: 3},
	}, {
		name: "Cleared drops blocks, detached ones too, and keeps the worker known",
		ops: []op{
			root(wA, ns1, u(1), u(10), TierGPU, attached(1)),
			under(wA, 9, u(5), u(50), TierGPU, StoreResult{Detached: 1}),
			root(wB, ns1, u(1), u(10), TierGPU, attached(1)),
			{clear: &wA},
		},
		queries: []query{{ns: ns1, keys: u(10), want: []WorkerMatch{m(wB, 1, 0, 0)}}},
		stats:   Stats{Workers: 2, Namespaces: 1, Nodes: 1, Residencies: 1},
	}, {
		name: "RemoveWorker forgets every dp rank of the name",
		ops: []op{
			root(wA, ns1, u(1), u(10), TierGPU, attached(1)),
			root(wA1, ns1, u(1, 2), u(10, 20), TierGPU, attached(2)),
			root(wB, ns1, u(1), u(10), TierGPU, attached(1)),
			{dropAll: "a"},
			root(wC, ns1, u(1), u(10), TierGPU, attached(1)), // reuses a freed worker id
		},
		queries: []query{{ns: ns1, keys: u(10, 20), want: []WorkerMatch{m(wB, 1, 0, 0), m(wC, 1, 0, 0)}}},
		stats:   Stats{Workers: 2, Namespaces: 1, Nodes: 1, Residencies: 2},
	}, {
		name: "many holders on one node spill past the inline slots and shrink back",
		ops: func() []op {
			var ops []op
			for i := range 6 {
				ops = append(ops, root(WorkerKey{Worker: "w", DPRank: uint32(i)}, ns1, u(1), u(10), TierGPU, attached(1)))
			}
			for _, i := range []uint32{0, 4, 2, 5} {
				ops = append(ops, remove(WorkerKey{Worker: "w", DPRank: i}, u(1), TierGPU, RemoveResult{Removed: 1}))
			}
			return ops
		}(),
		queries: []query{{ns: ns1, keys: u(10), want: []WorkerMatch{
			m(WorkerKey{Worker: "w", DPRank: 1}, 1, 0, 0), m(WorkerKey{Worker: "w", DPRank: 3}, 1, 0, 0)}}},
		stats: Stats{Workers: 6, Namespaces: 1, Nodes: 1, Residencies: 2},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ix := New(Config{MaxDetachedPerWorker: 4})
			run(t, ix, tt.ops)
			for _, q := range tt.queries {
				if got := ix.Match(q.ns, q.keys, q.filter, nil); !reflect.DeepEqual(got, q.want) && len(got)+len(q.want) > 0 {
					t.Errorf("Match(%x, %x, %q) = %+v, want %+v", q.ns, q.keys, q.filter, got, q.want)
				}
			}
			if got := sizes(ix.Stats()); got != tt.stats {
				t.Errorf("Stats = %+v, want %+v", got, tt.stats)
			}
		})
	}
}

func TestStoredRejectsBadInputAndAppliesNothing(t *testing.T) {
	ix := New(Config{})
	if _, err := ix.Stored(wA, ns1, 0, false, u(1, 2), u(10), TierGPU); !errors.Is(err, ErrLengthMismatch) {
		t.Errorf("length mismatch: err = %v, want ErrLengthMismatch", err)
	}
	if _, err := ix.Stored(wA, ns1, 0, false, u(1), u(10), Tier(NumTiers)); !errors.Is(err, ErrInvalidTier) {
		t.Errorf("bad tier: err = %v, want ErrInvalidTier", err)
	}
	if _, err := ix.Removed(wA, u(1), Tier(7)); !errors.Is(err, ErrInvalidTier) {
		t.Errorf("Removed bad tier: err = %v, want ErrInvalidTier", err)
	}
	if s := ix.Stats(); s != (Stats{}) {
		t.Errorf("after rejected calls Stats = %+v, want zero", s)
	}
}

func TestStatsCountersAccumulate(t *testing.T) {
	ix := New(Config{MaxDetachedPerWorker: 1})
	run(t, ix, []op{
		root(wA, ns1, u(1, 2), u(10, 20), TierGPU, StoreResult{Attached: 2}),
		root(wA, ns1, u(1), u(10), TierGPU, StoreResult{Duplicate: 1}),
		under(wA, 8, u(3, 4), u(30, 40), TierGPU, StoreResult{Detached: 1, Dropped: 1}),
		root(wA, ns1, u(8), u(80), TierGPU, StoreResult{Attached: 1, Reattached: 1}),
		root(wA, ns2, u(8), u(80), TierGPU, StoreResult{Attached: 1, Replaced: 1}),
		remove(wA, u(1, 99), TierGPU, RemoveResult{Removed: 1, Unknown: 1}),
	})
	want := Counters{StoredAttached: 4, StoredDuplicate: 1, StoredDetached: 1, StoredDropped: 1,
		StoredReplaced: 1, DetachedReattached: 1, RemovedBlocks: 1, RemovedUnknown: 1}
	if got := ix.Stats().Counters; got != want {
		t.Errorf("Counters = %+v, want %+v", got, want)
	}
}

func TestMatchDoesNotAllocate(t *testing.T) {
	ix := New(Config{})
	keys := make([]uint64, 64)
	hashes := make([]uint64, 64)
	for i := range keys {
		keys[i], hashes[i] = uint64(i+1)*7919, uint64(i+1)
	}
	for w := range 8 {
		if _, err := ix.Stored(WorkerKey{Worker: "w", DPRank: uint32(w)}, ns1, 0, false, hashes[:8*(w+1)], keys[:8*(w+1)], Tier(w%NumTiers)); err != nil {
			t.Fatal(err)
		}
	}
	dst := make([]WorkerMatch, 0, 16)
	filter := []string{"w"}
	if got := len(ix.Match(ns1, keys, filter, dst)); got != 8 {
		t.Fatalf("Match returned %d workers, want 8", got)
	}
	if a := testing.AllocsPerRun(200, func() { dst = ix.Match(ns1, keys, nil, dst) }); a != 0 {
		t.Errorf("Match allocates %v times per call, want 0", a)
	}
	if a := testing.AllocsPerRun(200, func() { dst = ix.Match(ns1, keys, filter, dst) }); a != 0 {
		t.Errorf("Match with filter allocates %v times per call, want 0", a)
	}
}

func TestTierString(t *testing.T) {
	for tier, want := range map[Tier]string{TierGPU: "gpu", TierCPU: "cpu", TierDisk: "disk", 9: "tier(9)"} {
		if got := tier.String(); got != want {
			t.Errorf("Tier(%d).String() = %q, want %q", tier, got, want)
		}
	}
}
