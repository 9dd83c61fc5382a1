package radix

import (
	"errors"
	"fmt"
)

// OpKind is what an Op does.
type OpKind uint8

// The kinds of Op, one per write method of Index.
const (
	OpStored  OpKind = iota + 1 // Stored(w, Namespace, Parent, HasParent, Hashes, Keys, Tier)
	OpRemoved                   // Removed(w, Hashes, Tier)
	OpCleared                   // Cleared(w)
)

// Op is one write of a batch (see ApplyOps); the fields an OpKind does not use
// are ignored.
type Op struct {
	Kind      OpKind
	Namespace uint64
	Parent    uint64
	HasParent bool
	Hashes    []uint64
	Keys      []uint64
	Tier      Tier
}

// ErrInvalidOp: an Op of no known kind.
var ErrInvalidOp = errors.New("radix: invalid op kind")

// OpError is the refusal of one Op of a batch.
type OpError struct {
	Op  int // its position in the batch
	Err error
}

func (e *OpError) Error() string { return fmt.Sprintf("op %d: %v", e.Op, e.Err) }
func (e *OpError) Unwrap() error { return e.Err }

// BatchResult says what one ApplyOps call did.
type BatchResult struct {
	Stored  StoreResult  // summed over the OpStored ops applied
	Removed RemoveResult // summed over the OpRemoved ops
	// Refused counts ops refused with the error Stored or Removed would return
	// (or ErrInvalidOp); they changed nothing, and the others were applied.
	Refused int
	Err     error // the first refusal, an *OpError; nil when none
	// DetachedParent is the parent hash of the first stored op whose blocks
	// were kept detached or dropped (Stored.Detached, Stored.Dropped): the
	// engine hash the worker never reported.
	DetachedParent uint64
}

// prefetchWindow is how many blocks ApplyOps reads ahead: enough to overlap the
// cache misses of several small ops, few enough that what it reads is still in
// the first-level cache when the ops get to it. In BenchmarkApply's steady state,
// 8 to 16 did best; 32 and more were slower (10-15% at 256 for one-block events),
// and prefetching op by op, which cannot overlap an op's dependent loads, about a
// third slower.
const prefetchWindow = 16

// ApplyOps applies ops, in order, for worker w, each exactly as the matching
// method (Stored, Removed, Cleared) would, under one lock acquisition and one
// lookup of w. It is the write path for an ingest batch: with one block per
// event the lock, the worker lookup and the cache misses of each event are what
// an event costs, and a batch shares the first two and overlaps the misses. The
// whole batch is applied atomically: Match sees it all or none of it.
func (ix *Index) ApplyOps(w WorkerKey, ops []Op) BatchResult {
	var res BatchResult
	ix.mu.Lock()
	defer ix.mu.Unlock()
	st := &ix.st
	wid, known := st.workerIDs[w]
	refuse := func(i int, err error) {
		res.Refused++
		if res.Err == nil {
			res.Err = &OpError{Op: i, Err: err}
		}
	}
	prefetched := 0 // ops[:prefetched] have been read ahead
	for i := range ops {
		if i >= prefetched && known {
			prefetched = st.prefetchOps(st.workers[wid], ops, i)
		}
		op := &ops[i]
		switch op.Kind {
		case OpStored:
			if err := checkStored(op.Hashes, op.Keys, op.Tier); err != nil {
				refuse(i, err)
				continue
			}
			if len(op.Hashes) == 0 {
				continue
			}
			if !known {
				var err error
				if wid, err = st.internWorker(w); err != nil {
					refuse(i, err)
					continue
				}
				known = true
			}
			r := st.stored(wid, op.Namespace, op.Parent, op.HasParent, op.Hashes, op.Keys, op.Tier.bit())
			if r.Detached+r.Dropped > 0 && res.Stored.Detached+res.Stored.Dropped == 0 {
				res.DetachedParent = op.Parent
			}
			res.Stored.add(r)
		case OpRemoved:
			if op.Tier >= NumTiers {
				refuse(i, fmt.Errorf("%w: %d", ErrInvalidTier, op.Tier))
				continue
			}
			var r RemoveResult
			if known {
				r = st.removed(wid, op.Hashes, op.Tier.bit())
			} else {
				r = st.removedByUnknown(op.Hashes)
			}
			res.Removed.Removed += r.Removed
			res.Removed.Unknown += r.Unknown
		case OpCleared:
			if known {
				st.clearWorker(wid)
			}
		default:
			refuse(i, fmt.Errorf("%w: %d", ErrInvalidOp, op.Kind))
		}
	}
	return res
}

func (r *StoreResult) add(o StoreResult) {
	r.Attached += o.Attached
	r.Duplicate += o.Duplicate
	r.Detached += o.Detached
	r.Dropped += o.Dropped
	r.Replaced += o.Replaced
	r.Reattached += o.Reattached
}

// prefetchOps reads ahead the memory of ops[from:], up to prefetchWindow blocks
// (at least one op), and returns the end of what it read. Each level of loads is
// issued for every op before the next level, which depends on it: the slots of
// the worker's table, then the nodes they point to (parents of stored blocks,
// removed blocks) and the edge slots and parents a removal will touch.
func (st *state) prefetchOps(ws *workerState, ops []Op, from int) int {
	end, blocks := from, 0
	for end < len(ops) && (end == from || blocks+len(ops[end].Hashes) <= prefetchWindow) {
		blocks += len(ops[end].Hashes)
		end++
	}
	window := ops[from:end]
	var sink uint64
	for i := range window {
		op := &window[i]
		if op.Kind == OpStored && op.HasParent {
			sink += ws.blocks.peek(op.Parent)
		}
		for _, h := range op.Hashes {
			sink += ws.blocks.peek(h)
		}
	}
	for i := range window {
		switch op := &window[i]; op.Kind {
		case OpStored:
			if e, ok := ws.blocks.get(op.Parent); ok && op.HasParent {
				sink += st.nodes.at(st.nodes.at(e.node).hint).key
			}
		case OpRemoved:
			for _, h := range op.Hashes {
				if e, ok := ws.blocks.get(h); ok {
					n := st.nodes.at(e.node)
					sink += st.edges.peek(n.parent, n.key) + st.nodes.at(n.parent).key
				}
			}
		}
	}
	st.sink = sink
	return end
}
