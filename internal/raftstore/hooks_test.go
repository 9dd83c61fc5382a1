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
// batch of an unregistered worker, and OnWorkerRemoved runs once the worker's
// blocks are gone, with the entry's index.
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
	stored := ingest.Op{Kind: ingest.OpStored, Namespace: 1, Hashes: []uint64{1, 2}, Keys: []uint64{11, 12}, Tier: radix.TierGPU}
	w := sampleWorker()
	w.ID = "w"
	applyEntry(t, f, 1, Entry{Type: EntryRegisterWorker, Worker: w})
	applyEntry(t, f, 2, batchesEntry(ingest.StreamBatch{Stream: ws("w", 0), Seq: 1, Ops: []ingest.Op{stored}}))
	applyEntry(t, f, 3, batchesEntry(ingest.StreamBatch{Stream: ws("w", 0), Seq: 1, Ops: []ingest.Op{stored}}))
	applyEntry(t, f, 4, Entry{Type: EntryUnregisterWorker, ID: "w"})
	applyEntry(t, f, 5, batchesEntry(ingest.StreamBatch{Stream: ws("w", 0), Seq: 2, Ops: []ingest.Op{stored}}))
	want := []string{
		"before 2 w/0 seq 1 residencies 0",
		"after 2 w/0 seq 1 applied residencies 2",
		"before 3 w/0 seq 1 residencies 2",
		"after 3 w/0 seq 1 duplicate residencies 2",
		"removed 4 w residencies 0",
		"after 5 w/0 seq 2 removed-worker residencies 0",
	}
	if !slices.Equal(calls, want) {
		t.Errorf("hook calls:\n%q\nwant\n%q", calls, want)
	}
}
