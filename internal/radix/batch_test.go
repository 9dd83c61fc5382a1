package radix

import (
	"errors"
	"fmt"
	"reflect"
	"testing"
)

// TestApplyOpsMatchesSingleCalls applies random batches (a few bad ops among
// them) with ApplyOps to one index and op by op with Stored, Removed and Cleared
// to another: results, refusals, Match answers, Stats with counters and Digest
// must agree at every step.
func TestApplyOpsMatchesSingleCalls(t *testing.T) {
	for seed := uint64(1); seed <= 4; seed++ {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			g := newEventGen(seed)
			batched, single := New(Config{MaxDetachedPerWorker: 6}), New(Config{MaxDetachedPerWorker: 6})
			var dst, want []WorkerMatch
			for step := range 600 {
				w := g.worker()
				if g.rng.IntN(40) == 0 {
					batched.RemoveWorker(w.Worker)
					single.RemoveWorker(w.Worker)
					continue
				}
				ops := make([]Op, 1+g.rng.IntN(12))
				for i := range ops {
					ops[i] = g.op(w)
				}
				got := batched.ApplyOps(w, ops)
				wantRes := applySingly(single, w, ops)
				if got.Stored != wantRes.Stored || got.Removed != wantRes.Removed || got.Refused != wantRes.Refused {
					t.Fatalf("seed %d step %d: ApplyOps(%v, %+v) = %+v, op by op %+v", seed, step, w, ops, got, wantRes)
				}
				if !sameRefusal(got.Err, wantRes.Err) {
					t.Fatalf("seed %d step %d: first refusal %v, op by op %v", seed, step, got.Err, wantRes.Err)
				}
				for range 3 {
					ns, keys := g.ns[g.rng.IntN(len(g.ns))], make([]uint64, 1+g.rng.IntN(5))
					for k := range keys {
						keys[k] = uint64(1 + g.rng.IntN(g.keys))
					}
					dst, want = batched.Match(ns, keys, nil, dst), single.Match(ns, keys, nil, want)
					if !reflect.DeepEqual(dst, want) {
						t.Fatalf("seed %d step %d: Match(%x, %x) = %+v, op by op %+v", seed, step, ns, keys, dst, want)
					}
				}
			}
			if b, s := batched.Stats(), single.Stats(); b != s {
				t.Errorf("Stats %+v, op by op %+v", b, s)
			}
			if batched.Digest() != single.Digest() {
				t.Error("Digest differs from the index built op by op")
			}
			if err := checkInvariants(batched); err != nil {
				t.Error(err)
			}
			if s := batched.Stats(); s.StoredReplaced == 0 || s.DetachedReattached == 0 || s.RemovedUnknown == 0 || s.StoredDuplicate == 0 {
				t.Errorf("seed %d did not exercise every path: %+v", seed, s)
			}
		})
	}
}

// op returns a random Op of worker w; one in ten is refused.
func (g *eventGen) op(w WorkerKey) Op {
	e := g.nextFor(w)
	op := Op{Namespace: e.ns, Parent: e.parent, HasParent: e.hasParent, Hashes: e.hashes, Keys: e.keys, Tier: e.tier}
	switch e.kind {
	case "stored":
		op.Kind = OpStored
	case "removed":
		op.Kind = OpRemoved
	default:
		op.Kind = OpCleared
	}
	switch g.rng.IntN(40) {
	case 0:
		op.Tier = NumTiers + 2
	case 1:
		op.Kind = OpKind(0)
	case 2:
		op.Kind = OpCleared + 1
	case 3:
		op.Kind, op.Keys = OpStored, op.Hashes[:0]
	}
	return op
}

// applySingly applies ops one call each and sums what they return, as ApplyOps does.
func applySingly(ix *Index, w WorkerKey, ops []Op) BatchResult {
	var res BatchResult
	for i, op := range ops {
		var err error
		switch op.Kind {
		case OpStored:
			var r StoreResult
			r, err = ix.Stored(w, op.Namespace, op.Parent, op.HasParent, op.Hashes, op.Keys, op.Tier)
			res.Stored.add(r)
		case OpRemoved:
			var r RemoveResult
			r, err = ix.Removed(w, op.Hashes, op.Tier)
			res.Removed.Removed += r.Removed
			res.Removed.Unknown += r.Unknown
		case OpCleared:
			ix.Cleared(w)
		default:
			err = ErrInvalidOp
		}
		if err != nil {
			res.Refused++
			if res.Err == nil {
				res.Err = &OpError{Op: i, Err: err}
			}
		}
	}
	return res
}

func sameRefusal(a, b error) bool {
	var ea, eb *OpError
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	if !errors.As(a, &ea) || !errors.As(b, &eb) || ea.Op != eb.Op {
		return false
	}
	for _, sentinel := range []error{ErrLengthMismatch, ErrInvalidTier, ErrInvalidOp} {
		if errors.Is(ea, sentinel) != errors.Is(eb, sentinel) {
			return false
		}
	}
	return true
}

func TestApplyOpsEdgeCases(t *testing.T) {
	tests := []struct {
		name    string
		ops     []Op
		want    BatchResult
		matches []WorkerMatch // Match(ns1, 10, 20, 30) afterwards
	}{{
		name: "a chain stored op by op, then its middle removed",
		ops: []Op{
			{Kind: OpStored, Namespace: ns1, Hashes: u(1), Keys: u(10)},
			{Kind: OpStored, Parent: 1, HasParent: true, Hashes: u(2), Keys: u(20), Tier: TierCPU},
			{Kind: OpStored, Parent: 2, HasParent: true, Hashes: u(3), Keys: u(30)},
			{Kind: OpRemoved, Hashes: u(2, 9), Tier: TierCPU},
		},
		want:    BatchResult{Stored: StoreResult{Attached: 3}, Removed: RemoveResult{Removed: 1, Unknown: 1}},
		matches: []WorkerMatch{m(wA, 1, 0, 0)},
	}, {
		name: "bad ops are refused, the others applied",
		ops: []Op{
			{Kind: OpStored, Namespace: ns1, Hashes: u(1, 2), Keys: u(10)},
			{Kind: OpStored, Namespace: ns1, Hashes: u(1), Keys: u(10), Tier: 5},
			{Kind: OpRemoved, Hashes: u(1), Tier: 3},
			{Kind: 9},
			{Kind: OpStored, Namespace: ns1, Hashes: u(1, 2), Keys: u(10, 20), Tier: TierDisk},
		},
		want:    BatchResult{Stored: StoreResult{Attached: 2}, Refused: 4, Err: &OpError{Op: 0, Err: ErrLengthMismatch}},
		matches: []WorkerMatch{m(wA, 0, 0, 2)},
	}, {
		name: "removes and clears of a worker the index does not know",
		ops: []Op{
			{Kind: OpRemoved, Hashes: u(1, 2)},
			{Kind: OpCleared},
			{Kind: OpStored, Namespace: ns1, Hashes: u(1), Keys: u(10)},
		},
		want:    BatchResult{Stored: StoreResult{Attached: 1}, Removed: RemoveResult{Unknown: 2}},
		matches: []WorkerMatch{m(wA, 1, 0, 0)},
	}, {
		name: "cleared mid-batch: only what follows stays",
		ops: []Op{
			{Kind: OpStored, Namespace: ns1, Hashes: u(1, 2), Keys: u(10, 20)},
			{Kind: OpCleared},
			{Kind: OpStored, Namespace: ns1, Hashes: u(1), Keys: u(10), Tier: TierCPU},
			{Kind: OpStored, Parent: 2, HasParent: true, Hashes: u(3), Keys: u(30)},
		},
		want:    BatchResult{Stored: StoreResult{Attached: 3, Detached: 1}, DetachedParent: 2},
		matches: []WorkerMatch{m(wA, 0, 1, 0)},
	}, {
		name: "empty batch and empty ops change nothing",
		ops:  []Op{{Kind: OpStored, Namespace: ns1}, {Kind: OpRemoved}},
		want: BatchResult{},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ix := New(Config{})
			got := ix.ApplyOps(wA, tt.ops)
			if got.Stored != tt.want.Stored || got.Removed != tt.want.Removed || got.Refused != tt.want.Refused ||
				!sameRefusal(got.Err, tt.want.Err) || got.DetachedParent != tt.want.DetachedParent {
				t.Errorf("ApplyOps = %+v (err %v), want %+v (err %v)", got, got.Err, tt.want, tt.want.Err)
			}
			if got := ix.Match(ns1, u(10, 20, 30), nil, nil); !reflect.DeepEqual(got, tt.matches) && len(got)+len(tt.matches) > 0 {
				t.Errorf("Match = %+v, want %+v", got, tt.matches)
			}
			if err := checkInvariants(ix); err != nil {
				t.Error(err)
			}
		})
	}
}
