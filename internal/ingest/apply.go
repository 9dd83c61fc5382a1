package ingest

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/kvindex/kvindex/internal/radix"
)

// Applier applies StreamBatches to a radix.Index exactly once each: it keeps every
// stream's Cursor and drops a batch at or behind it, so a batch delivered twice (a
// re-proposal after a Raft leader change, a replay that overlaps live traffic) changes
// nothing the second time. Its state (the index plus the cursors) is what a Raft
// snapshot holds, and it is deterministic: the same batches in the same order give the
// same index and cursors on every replica.
//
// Apply and RemoveWorker must be called from one goroutine (the apply loop); Cursor,
// Cursors and the Index's readers may run concurrently with it.
//
// A fenced stream (FenceWorker: its worker was declared dead, or unregistered) takes
// only a batch that starts a fresh stream (Reset); the others are dropped
// (ApplyResult.Fenced).
type Applier struct {
	index *radix.Index
	ops   []radix.Op // Apply's conversion buffer, reused: Apply runs on one goroutine

	mu      sync.RWMutex
	cursors map[Stream]Cursor // guarded by mu
	// fenced counts the cursors with a Fence (written under mu), so that ingest
	// can ask Fence before every batch at the cost of one atomic load while no
	// worker is dead.
	fenced atomic.Int64
}

var _ CursorSource = (*Applier)(nil)

// NewApplier returns an Applier over ix, with no cursors.
func NewApplier(ix *radix.Index) *Applier {
	return &Applier{index: ix, cursors: map[Stream]Cursor{}}
}

// Index is the index this Applier writes.
func (a *Applier) Index() *radix.Index { return a.index }

// ApplyResult says what Apply did with one batch.
type ApplyResult struct {
	Applied bool // false: the batch was at or behind the stream's cursor and was dropped
	// OpErrors counts Ops the index refused (for example a hash/key length mismatch);
	// the other Ops of the batch were applied. Refusals are deterministic, so replicas agree.
	OpErrors int
	FirstErr error
	// Detached counts stored blocks the index could not place because the
	// worker never reported their parent (kept detached, or dropped beyond the
	// bound); DetachedParent is the first such parent's engine hash.
	Detached       int
	DetachedParent uint64
	// Fenced: the batch was dropped because its stream is fenced and it does not
	// start a fresh stream (not Reset). Applied is false.
	Fenced bool
}

// Apply applies b unless the stream has already applied it: a batch is new when its
// Epoch is greater than the cursor's, or equal with a greater Seq. A Reset batch
// clears the stream's blocks before its Ops. The batch goes to the index in one
// radix.Index.ApplyOps call: one lock and one worker lookup for all its Ops, and
// readers see all of it or none.
func (a *Applier) Apply(b StreamBatch) ApplyResult {
	a.mu.RLock()
	cur, seen := a.cursors[b.Stream]
	a.mu.RUnlock()
	if seen && (b.Epoch < cur.Epoch || (b.Epoch == cur.Epoch && b.Seq <= cur.Seq)) {
		return ApplyResult{}
	}
	if seen && cur.Fence != 0 && !b.Reset {
		// Sent before ingest saw the fence (in flight when the worker was
		// declared dead): its blocks must not come back.
		return ApplyResult{Fenced: true}
	}
	ops, first := b.Ops, 0 // ops[first+i] is b.Ops[i]
	if b.Reset {
		// The clear goes in the same ApplyOps call so readers never see the stream
		// cleared but not yet refilled.
		ops = append(append(a.ops[:0], radix.Op{Kind: radix.OpCleared}), b.Ops...)
		first = 1
	}
	out := a.index.ApplyOps(b.Stream, ops)
	if b.Reset {
		clear(ops) // keep no reference to the batch's slices
		a.ops = ops[:0]
	}

	res := ApplyResult{Applied: true, OpErrors: out.Refused,
		Detached: out.Stored.Detached + out.Stored.Dropped, DetachedParent: out.DetachedParent}
	var refused *radix.OpError
	if errors.As(out.Err, &refused) {
		res.FirstErr = fmt.Errorf("stream %s/%d seq %d op %d: %w", b.Stream.Worker, b.Stream.DPRank, b.Seq, refused.Op-first, refused.Err)
	}
	a.mu.Lock()
	if cur.Fence != 0 {
		a.fenced.Add(-1)
	}
	a.cursors[b.Stream] = Cursor{Seq: b.Seq, Epoch: b.Epoch}
	a.mu.Unlock()
	return res
}

// RemoveWorker drops every block and cursor of every dp rank of worker.
func (a *Applier) RemoveWorker(worker string) {
	a.index.RemoveWorker(worker)
	a.mu.Lock()
	for s, c := range a.cursors {
		if s.Worker == worker {
			if c.Fence != 0 {
				a.fenced.Add(-1)
			}
			delete(a.cursors, s)
		}
	}
	a.mu.Unlock()
}

// FenceWorker drops every block of every dp rank of worker and fences each of its
// streams that has a cursor at gen (not 0; the raft log index of the decision
// that the worker is dead): from now on such a stream takes only a batch that
// starts a fresh stream (Reset), so that no batch in flight when the worker was
// declared dead brings its blocks back. The cursors keep their epoch, so the
// fresh stream, which ingest starts one epoch further, is never taken for an
// old one. A stream without a cursor holds no block and is not fenced. It
// returns the fenced dp ranks, ascending.
func (a *Applier) FenceWorker(worker string, gen uint64) []uint32 {
	a.index.RemoveWorker(worker)
	var ranks []uint32
	a.mu.Lock()
	for s, c := range a.cursors {
		if s.Worker != worker {
			continue
		}
		if c.Fence == 0 {
			a.fenced.Add(1)
		}
		c.Fence = gen
		a.cursors[s] = c
		ranks = append(ranks, s.DPRank)
	}
	a.mu.Unlock()
	slices.Sort(ranks)
	return ranks
}

// Fence returns the fence of stream s (0: none); see Cursor.Fence.
func (a *Applier) Fence(s Stream) uint64 {
	if a.fenced.Load() == 0 {
		return 0
	}
	c, _ := a.Cursor(s)
	return c.Fence
}

// Cursor returns how far stream s has been applied.
func (a *Applier) Cursor(s Stream) (Cursor, bool) {
	a.mu.RLock()
	defer a.mu.RUnlock()
	c, ok := a.cursors[s]
	return c, ok
}

// Cursors returns a copy of every stream's cursor (for snapshots and status pages).
func (a *Applier) Cursors() map[Stream]Cursor {
	a.mu.RLock()
	defer a.mu.RUnlock()
	out := make(map[Stream]Cursor, len(a.cursors))
	for s, c := range a.cursors {
		out[s] = c
	}
	return out
}

// SetCursors replaces every cursor (a snapshot restore, with the index restored beside it).
func (a *Applier) SetCursors(c map[Stream]Cursor) {
	cp := make(map[Stream]Cursor, len(c))
	fenced := int64(0)
	for s, v := range c {
		cp[s] = v
		if v.Fence != 0 {
			fenced++
		}
	}
	a.mu.Lock()
	a.cursors = cp
	a.fenced.Store(fenced)
	a.mu.Unlock()
}
