package raftstore

import (
	"fmt"
	"slices"
	"testing"

	"github.com/kvindex/kvindex/internal/ingest"
	"github.com/kvindex/kvindex/internal/radix"
)

// TestFSMApplyHooks checks the order and arguments of the apply-path hooks an
// observer of the index (the server's change feed) relies on: BeforeBatch sees
// the index before the batch, OnBatch after it, neither runs BeforeBatch for a
// batch of an unregistered worker, OnWorkerRemoved runs once the worker's
// blocks are gone, with the entry's index, and AfterEntry once per entry after
// every other hook of it (an entry of two batches included), entries that
// change nothing (refused, skipped) included.
func TestFSMApplyHooks(t *testing.T) {
	f := newTestFSM(t, nil)
	var calls []string
	ix := f.applier.Index()
	f.beforeBatch = func(index uint64, b *ingest.StreamBatch) {
		calls = append(calls, fmt.Sprintf("before %d %s/%d seq %d residencies %d", index, b.Stream.Worker, b.Stream.DPRank, b.Seq, ix.Stats().Residencies))
	}
	f.onBatch = func(index uint64, b *ingest.StreamBatch, outcome BatchOutcome, _ ingest.ApplyResult) {
		calls = append(calls, fmt.Sprintf("after %d %s/%d seq %d %s residencies %d", index, b.Stream.Worker, b.Stream.DPRank, b.Seq, outcome, ix.Stats().Residencies))
	}
	f.onRemoved = func(index uint64, id string) {
		calls = append(calls, fmt.Sprintf("removed %d %s residencies %d", index, id, ix.Stats().Residencies))
	}
	f.afterEntry = func(index uint64) {
		calls = append(calls, fmt.Sprintf("entry %d applied %d", index, f.lastIndex.Load()))
	}
	stored := ingest.Op{Kind: ingest.OpStored, Namespace: 1, Hashes: []uint64{1, 2}, Keys: []uint64{11, 12}, Tier: radix.TierGPU}
	w := sampleWorker()
	w.ID = "w"
	applyEntry(t, f, 1, Entry{Type: EntryRegisterWorker, Worker: w})
	applyEntry(t, f, 2, batchesEntry(ingest.StreamBatch{Stream: ws("w", 0), Seq: 1, Ops: []ingest.Op{stored}}))
	applyEntry(t, f, 3, batchesEntry(ingest.StreamBatch{Stream: ws("w", 0), Seq: 1, Ops: []ingest.Op{stored}},
		ingest.StreamBatch{Stream: ws("w", 1), Seq: 1, Ops: []ingest.Op{stored}}))
	applyEntry(t, f, 4, Entry{Type: EntryUnregisterWorker, ID: "w"})
	applyEntry(t, f, 5, batchesEntry(ingest.StreamBatch{Stream: ws("w", 0), Seq: 2, Ops: []ingest.Op{stored}}))
	applyData(f, 6, rawIDEntry(EntryUnregisterWorker, ""))               // refused: a no-op
	applyData(f, 7, []byte{entryVersion, ignorableFlag | 0x33, 1, 2, 3}) // skipped
	want := []string{
		"entry 1 applied 0",
		"before 2 w/0 seq 1 residencies 0",
		"after 2 w/0 seq 1 applied residencies 2",
		"entry 2 applied 1",
		"before 3 w/0 seq 1 residencies 2",
		"after 3 w/0 seq 1 duplicate residencies 2",
		"before 3 w/1 seq 1 residencies 2",
		"after 3 w/1 seq 1 applied residencies 4",
		"entry 3 applied 2",
		"removed 4 w residencies 0",
		"entry 4 applied 3",
		"after 5 w/0 seq 2 removed-worker residencies 0",
		"entry 5 applied 4",
		"entry 6 applied 5",
		"entry 7 applied 6",
	}
	if !slices.Equal(calls, want) {
		t.Errorf("hook calls:\n%q\nwant\n%q", calls, want)
	}
}
