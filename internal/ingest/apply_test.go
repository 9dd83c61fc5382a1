package ingest

import (
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/kvindex/kvindex/internal/radix"
)

func storedOp(hashes, keys []uint64) Op {
	return Op{Kind: OpStored, Namespace: 7, Hashes: hashes, Keys: keys, Tier: radix.TierGPU}
}

func matchedBlocks(t *testing.T, ix *radix.Index, s Stream, keys []uint64) int {
	t.Helper()
	for _, m := range ix.Match(7, keys, nil, nil) {
		if m.Worker == s {
			return m.Blocks
		}
	}
	return 0
}

func TestApplierAppliesEachBatchOnce(t *testing.T) {
	w := Stream{Worker: "w1"}
	tests := []struct {
		name        string
		batches     []StreamBatch
		wantApplied []bool
		wantBlocks  int
		wantCursor  Cursor
	}{
		{
			name: "in order",
			batches: []StreamBatch{
				{Stream: w, Seq: 0, Ops: []Op{storedOp([]uint64{100}, []uint64{1})}},
				{Stream: w, Seq: 1, Ops: []Op{{Kind: OpStored, Namespace: 7, Parent: 100, HasParent: true, Hashes: []uint64{101}, Keys: []uint64{2}}}},
			},
			wantApplied: []bool{true, true}, wantBlocks: 2, wantCursor: Cursor{Seq: 1},
		},
		{
			name: "re-delivered batch is dropped",
			batches: []StreamBatch{
				{Stream: w, Seq: 5, Ops: []Op{storedOp([]uint64{100}, []uint64{1})}},
				{Stream: w, Seq: 6, Ops: []Op{{Kind: OpRemoved, Hashes: []uint64{100}}}},
				{Stream: w, Seq: 5, Ops: []Op{storedOp([]uint64{100}, []uint64{1})}},
			},
			wantApplied: []bool{true, true, false}, wantBlocks: 0, wantCursor: Cursor{Seq: 6},
		},
		{
			name: "reset clears and starts a new epoch at a lower seq",
			batches: []StreamBatch{
				{Stream: w, Seq: 40, Ops: []Op{storedOp([]uint64{100, 101}, []uint64{1, 2})}},
				{Stream: w, Seq: 0, Epoch: 1, Reset: true, Ops: []Op{storedOp([]uint64{200}, []uint64{1})}},
			},
			wantApplied: []bool{true, true}, wantBlocks: 1, wantCursor: Cursor{Seq: 0, Epoch: 1},
		},
		{
			name: "re-delivered reset batch does not clear again",
			batches: []StreamBatch{
				{Stream: w, Seq: 0, Epoch: 1, Reset: true, Ops: []Op{storedOp([]uint64{200}, []uint64{1})}},
				{Stream: w, Seq: 1, Epoch: 1, Ops: []Op{{Kind: OpStored, Namespace: 7, Parent: 200, HasParent: true, Hashes: []uint64{201}, Keys: []uint64{2}}}},
				{Stream: w, Seq: 0, Epoch: 1, Reset: true, Ops: []Op{storedOp([]uint64{200}, []uint64{1})}},
			},
			wantApplied: []bool{true, true, false}, wantBlocks: 2, wantCursor: Cursor{Seq: 1, Epoch: 1},
		},
		{
			name: "batch of an older epoch is dropped",
			batches: []StreamBatch{
				{Stream: w, Seq: 0, Epoch: 2, Reset: true},
				{Stream: w, Seq: 9, Epoch: 1, Ops: []Op{storedOp([]uint64{100}, []uint64{1})}},
			},
			wantApplied: []bool{true, false}, wantBlocks: 0, wantCursor: Cursor{Seq: 0, Epoch: 2},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := NewApplier(radix.New(radix.Config{}))
			for i, b := range tt.batches {
				if got := a.Apply(b).Applied; got != tt.wantApplied[i] {
					t.Fatalf("batch %d (seq %d epoch %d): applied=%v, want %v", i, b.Seq, b.Epoch, got, tt.wantApplied[i])
				}
			}
			if got := matchedBlocks(t, a.Index(), w, []uint64{1, 2}); got != tt.wantBlocks {
				t.Errorf("matched blocks = %d, want %d", got, tt.wantBlocks)
			}
			if c, ok := a.Cursor(w); !ok || c != tt.wantCursor {
				t.Errorf("cursor = %+v (known %v), want %+v", c, ok, tt.wantCursor)
			}
		})
	}
}

func TestApplierRefusedOpDoesNotStopTheBatch(t *testing.T) {
	a := NewApplier(radix.New(radix.Config{}))
	w := Stream{Worker: "w1"}
	res := a.Apply(StreamBatch{Stream: w, Seq: 0, Ops: []Op{
		storedOp([]uint64{100, 101}, []uint64{1}), // length mismatch: refused
		{Kind: OpKind(99)},                        // unknown kind: refused
		storedOp([]uint64{300}, []uint64{1}),
	}})
	if !res.Applied || res.OpErrors != 2 {
		t.Fatalf("got %+v, want applied with 2 op errors", res)
	}
	if !errors.Is(res.FirstErr, radix.ErrLengthMismatch) {
		t.Errorf("first error = %v, want radix.ErrLengthMismatch", res.FirstErr)
	}
	if got := matchedBlocks(t, a.Index(), w, []uint64{1}); got != 1 {
		t.Errorf("the valid op was not applied: matched %d, want 1", got)
	}
}

func TestApplierReportsTheFirstRefusedOpByItsPositionInTheBatch(t *testing.T) {
	w := Stream{Worker: "w1"}
	tests := []struct {
		name    string
		batch   StreamBatch
		wantErr error
		wantPos string
		errors  int
	}{
		{"unknown kind after a valid op", StreamBatch{Stream: w, Ops: []Op{storedOp([]uint64{100}, []uint64{1}), {Kind: OpKind(42)}}},
			radix.ErrInvalidOp, "seq 0 op 1:", 1},
		{"in a reset batch, positions do not count the reset", StreamBatch{Stream: w, Seq: 3, Reset: true, Epoch: 1, Ops: []Op{
			storedOp([]uint64{100}, []uint64{1}), {Kind: OpRemoved, Tier: radix.Tier(7)}, {Kind: OpKind(0)}}},
			radix.ErrInvalidTier, "seq 3 op 1:", 2},
		{"zero kind", StreamBatch{Stream: w, Ops: []Op{{Kind: OpKind(0)}, storedOp([]uint64{100}, []uint64{1})}},
			radix.ErrInvalidOp, "seq 0 op 0:", 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := NewApplier(radix.New(radix.Config{}))
			res := a.Apply(tt.batch)
			if !res.Applied || res.OpErrors != tt.errors || !errors.Is(res.FirstErr, tt.wantErr) {
				t.Fatalf("got %+v, want applied, %d errors, first %v", res, tt.errors, tt.wantErr)
			}
			if !strings.Contains(res.FirstErr.Error(), tt.wantPos) {
				t.Errorf("first error %q does not name %q", res.FirstErr, tt.wantPos)
			}
			if got := matchedBlocks(t, a.Index(), w, []uint64{1}); got != 1 {
				t.Errorf("the valid op was not applied: matched %d, want 1", got)
			}
		})
	}
}

// TestApplierBatchIsAtomicForReaders applies batches that each store a 2-block
// chain as two Ops while readers Match it: a reader must never see the first
// block without the second.
func TestApplierBatchIsAtomicForReaders(t *testing.T) {
	a := NewApplier(radix.New(radix.Config{}))
	w := Stream{Worker: "w1"}
	keys := []uint64{1, 2}
	done := make(chan struct{})
	var wg sync.WaitGroup
	var torn atomic.Int64
	for range 2 {
		wg.Go(func() {
			var dst []radix.WorkerMatch
			for {
				select {
				case <-done:
					return
				default:
				}
				dst = a.Index().Match(7, keys, nil, dst)
				if len(dst) == 1 && dst[0].Blocks == 1 {
					torn.Add(1)
				}
			}
		})
	}
	for seq := range uint64(30000) {
		h := 1000 + 2*seq
		ops := []Op{
			{Kind: OpCleared},
			storedOp([]uint64{h}, keys[:1]),
			{Kind: OpStored, Namespace: 7, Parent: h, HasParent: true, Hashes: []uint64{h + 1}, Keys: keys[1:]},
		}
		if res := a.Apply(StreamBatch{Stream: w, Seq: seq, Ops: ops}); !res.Applied || res.OpErrors != 0 {
			t.Fatalf("batch %d: %+v", seq, res)
		}
	}
	close(done)
	wg.Wait()
	if n := torn.Load(); n != 0 {
		t.Errorf("readers saw a half-applied batch %d times", n)
	}
}

func TestApplierRemoveWorkerForgetsEveryRank(t *testing.T) {
	a := NewApplier(radix.New(radix.Config{}))
	for rank := uint32(0); rank < 2; rank++ {
		a.Apply(StreamBatch{Stream: Stream{Worker: "w1", DPRank: rank}, Seq: 3, Ops: []Op{storedOp([]uint64{100}, []uint64{1})}})
	}
	a.Apply(StreamBatch{Stream: Stream{Worker: "w2"}, Seq: 1, Ops: []Op{storedOp([]uint64{100}, []uint64{1})}})
	a.RemoveWorker("w1")
	if got := a.Cursors(); len(got) != 1 {
		t.Fatalf("cursors after removing w1 = %v, want only w2's", got)
	}
	if m := a.Index().Match(7, []uint64{1}, nil, nil); len(m) != 1 || m[0].Worker.Worker != "w2" {
		t.Errorf("match after removing w1 = %+v, want only w2", m)
	}
	// A removed worker that comes back starts fresh: its old seq is not held against it.
	if !a.Apply(StreamBatch{Stream: Stream{Worker: "w1"}, Seq: 0, Ops: nil}).Applied {
		t.Error("a batch of a re-added worker was dropped")
	}
}

// TestApplierFence: a fenced stream takes only a batch that starts a fresh
// stream in a newer epoch; its blocks are gone at once, other workers keep
// theirs, and Fence reports the fence until the fresh batch clears it.
func TestApplierFence(t *testing.T) {
	a := NewApplier(radix.New(radix.Config{}))
	w0, w1, other := Stream{Worker: "w"}, Stream{Worker: "w", DPRank: 1}, Stream{Worker: "x"}
	for _, s := range []Stream{w0, w1, other} {
		a.Apply(StreamBatch{Stream: s, Seq: 3, Epoch: 2, Ops: []Op{storedOp([]uint64{100}, []uint64{1})}})
	}
	if got := a.Fence(w0); got != 0 {
		t.Fatalf("Fence before any fence = %d, want 0", got)
	}
	if ranks := a.FenceWorker("w", 42); len(ranks) != 2 || ranks[0] != 0 || ranks[1] != 1 {
		t.Fatalf("FenceWorker fenced ranks %v, want [0 1]", ranks)
	}
	if a.Index().HeldBlocks(w0) != 0 || a.Index().HeldBlocks(w1) != 0 || a.Index().HeldBlocks(other) != 1 {
		t.Fatal("after the fence w must hold nothing and x its block")
	}
	if c, _ := a.Cursor(w0); c != (Cursor{Seq: 3, Epoch: 2, Fence: 42}) || a.Fence(w0) != 42 || a.Fence(other) != 0 {
		t.Fatalf("cursor %+v, fences %d and %d: want w's position kept, fenced at 42, x not fenced", c, a.Fence(w0), a.Fence(other))
	}
	steps := []struct {
		name    string
		b       StreamBatch
		applied bool
		fenced  bool
	}{
		{"in flight, not a reset", StreamBatch{Stream: w0, Seq: 4, Epoch: 2}, false, true},
		{"a reset of an old epoch", StreamBatch{Stream: w0, Seq: 2, Epoch: 2, Reset: true}, false, false},
		{"a fresh stream", StreamBatch{Stream: w0, Seq: 0, Epoch: 3, Reset: true}, true, false},
		{"the fresh stream goes on", StreamBatch{Stream: w0, Seq: 1, Epoch: 3}, true, false},
		{"the other rank is still fenced", StreamBatch{Stream: w1, Seq: 4, Epoch: 2}, false, true},
	}
	for _, st := range steps {
		st.b.Ops = []Op{storedOp([]uint64{200 + st.b.Seq}, []uint64{2 + st.b.Seq})}
		if res := a.Apply(st.b); res.Applied != st.applied || res.Fenced != st.fenced {
			t.Fatalf("%s: applied %v fenced %v, want %v %v", st.name, res.Applied, res.Fenced, st.applied, st.fenced)
		}
	}
	if a.Fence(w0) != 0 || a.Fence(w1) != 42 || a.Index().HeldBlocks(w0) != 2 {
		t.Errorf("fences %d and %d, w rank 0 holds %d: want rank 0 free with its 2 new blocks, rank 1 fenced", a.Fence(w0), a.Fence(w1), a.Index().HeldBlocks(w0))
	}
	// The fence count behind Fence's fast path follows removals and restores.
	a.RemoveWorker("w")
	if a.Fence(w1) != 0 || a.fenced.Load() != 0 {
		t.Errorf("after RemoveWorker: fence %d, count %d, want none", a.Fence(w1), a.fenced.Load())
	}
	a.SetCursors(map[Stream]Cursor{w1: {Seq: 1, Fence: 9}, other: {Seq: 1}})
	if a.Fence(w1) != 9 || a.fenced.Load() != 1 {
		t.Errorf("after SetCursors: fence %d, count %d, want 9 and 1", a.Fence(w1), a.fenced.Load())
	}
}
