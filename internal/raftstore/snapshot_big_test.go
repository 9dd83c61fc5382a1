package raftstore

import (
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/kvindex/kvindex/internal/ingest"
	"github.com/kvindex/kvindex/internal/radix"
)

// bigFSM returns an FSM holding blocks blocks over 16 streams (chains of 64 blocks,
// half of them branching off an earlier block, over shared keys so that streams
// share nodes), with a cursor per stream and a small registry.
func bigFSM(t testing.TB, blocks int) *fsm {
	t.Helper()
	f := newTestFSM(t, nil)
	rng := rand.New(rand.NewPCG(1, 2))
	const streams, chain = 16, 64
	index := uint64(1)
	var batch []ingest.StreamBatch
	hash := uint64(1)
	var lastOf [streams]uint64 // last block of each stream's previous chain
	for s := 0; s*chain < blocks; s++ {
		st := ws(fmt.Sprintf("worker-%02d", s%streams), 0)
		op := ingest.Op{Kind: ingest.OpStored, Namespace: 7, Tier: radix.Tier(s % 2)}
		if lastOf[s%streams] != 0 && rng.IntN(2) == 0 {
			op.HasParent, op.Parent = true, lastOf[s%streams]
		}
		for range chain {
			op.Hashes = append(op.Hashes, hash)
			op.Keys = append(op.Keys, rng.Uint64()%uint64(4*blocks/chain)) // repeats: shared nodes
			hash++
		}
		lastOf[s%streams] = hash - 1
		batch = append(batch, ingest.StreamBatch{Stream: st, Seq: uint64(s / streams), Ops: []ingest.Op{op}})
		if len(batch) == 256 {
			applyEntry(t, f, index, batchesEntry(batch...))
			index++
			batch = batch[:0]
		}
	}
	applyEntry(t, f, index, batchesEntry(batch...))
	applyEntry(t, f, index+1, Entry{Type: EntryRegisterWorker, Worker: sampleWorker()})
	return f
}

// TestSnapshotRoundTripOfAMillionBlocks snapshots an index of a million blocks,
// restores it into a fresh state machine and compares; it logs the size and times.
func TestSnapshotRoundTripOfAMillionBlocks(t *testing.T) {
	const blocks = 1 << 20
	start := time.Now()
	src := bigFSM(t, blocks)
	built := time.Since(start)
	stats := src.applier.Index().Stats()
	if stats.Residencies < blocks*9/10 {
		t.Fatalf("built %+v, want about %d blocks", stats, blocks)
	}

	start = time.Now()
	snap, err := src.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	captured := time.Since(start)
	var sink bufferSink
	start = time.Now()
	if err := snap.Persist(&sink); err != nil {
		t.Fatal(err)
	}
	persisted := time.Since(start)
	snap.Release()
	size := sink.Len()

	dst := newTestFSM(t, nil)
	start = time.Now()
	if err := dst.Restore(io.NopCloser(bytes.NewReader(sink.Bytes()))); err != nil {
		t.Fatal(err)
	}
	restored := time.Since(start)
	start = time.Now()
	want := src.applier.Index().Digest()
	digested := time.Since(start)
	if got := dst.applier.Index().Digest(); got != want {
		t.Fatal("restored index digest differs")
	}
	if !reflect.DeepEqual(dst.applier.Cursors(), src.applier.Cursors()) || !reflect.DeepEqual(dst.Workers(), src.Workers()) {
		t.Error("restored cursors or registry differ")
	}
	t.Logf("%d blocks (%d nodes, %d residencies): snapshot %.1f MiB (%.1f bytes/block); capture %v (apply blocked), persist %v, restore %v, digest %v; building took %v",
		blocks, stats.Nodes, stats.Residencies, float64(size)/(1<<20), float64(size)/float64(stats.Residencies),
		captured.Round(time.Millisecond), persisted.Round(time.Millisecond), restored.Round(time.Millisecond),
		digested.Round(time.Millisecond), built.Round(time.Millisecond))
}

// BenchmarkSnapshotRestore measures capture+persist and restore of a 1M-block state.
func BenchmarkSnapshotRestore(b *testing.B) {
	src := bigFSM(b, 1<<20)
	var data []byte
	b.Run("capture+persist", func(b *testing.B) {
		for b.Loop() {
			snap, err := src.Snapshot()
			if err != nil {
				b.Fatal(err)
			}
			var sink bufferSink
			if err := snap.Persist(&sink); err != nil {
				b.Fatal(err)
			}
			snap.Release()
			data = sink.Bytes()
		}
		b.ReportMetric(float64(len(data)), "bytes")
	})
	b.Run("restore", func(b *testing.B) {
		dst := newTestFSM(b, nil)
		for b.Loop() {
			if err := dst.Restore(io.NopCloser(bytes.NewReader(data))); err != nil {
				b.Fatal(err)
			}
		}
	})
}

var _ raft.SnapshotSink = (*bufferSink)(nil)
