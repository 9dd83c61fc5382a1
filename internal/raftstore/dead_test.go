package raftstore

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"reflect"
	"slices"
	"testing"

	"github.com/kvindex/kvindex/internal/ingest"
	"github.com/kvindex/kvindex/internal/workerspec"
)

// stored is a batch of stream s at (epoch, seq) storing one root block h.
func stored(s ingest.Stream, epoch, seq uint64, reset bool, h uint64) ingest.StreamBatch {
	return ingest.StreamBatch{Stream: s, Seq: seq, Epoch: epoch, Reset: reset, Ops: []ingest.Op{
		{Kind: ingest.OpStored, Namespace: 1, Hashes: []uint64{h}, Keys: []uint64{h}},
	}}
}

// TestWorkerDeath walks a worker through its death and its two ways back, entry
// by entry: what each replica holds, which batches the fence lets through, and
// what the hooks are told.
func TestWorkerDeath(t *testing.T) {
	var notified int
	f := newTestFSM(t, func([]workerspec.Spec) { notified++ })
	var deaths []string
	f.onDead = func(index uint64, id string, ranks []uint32) {
		deaths = append(deaths, id)
		if id == "w" && !slices.Equal(ranks, []uint32{0, 1}) {
			t.Errorf("OnWorkerDead(%d, %s) with ranks %v, want [0 1] (the ranks that held a position)", index, id, ranks)
		}
	}
	w0, w1, x0 := ws("w", 0), ws("w", 1), ws("x", 0)
	held := func(s ingest.Stream) int { return f.applier.Index().HeldBlocks(s) }

	type want struct {
		err     error
		outcome string // Applied, Fenced, Duplicates of a batches entry: "a/f/d"
		dead    []string
		w0, w1  int // blocks held by w's ranks
	}
	steps := []struct {
		name  string
		entry Entry
		want  want
	}{
		{"register w", Entry{Type: EntryRegisterWorker, Worker: workerspec.Spec{ID: "w", Model: "m", DPSize: 2}}, want{}},
		{"register x", Entry{Type: EntryRegisterWorker, Worker: workerspec.Spec{ID: "x", Model: "m"}}, want{}},
		{"blocks of both", batchesEntry(stored(w0, 0, 1, false, 10), stored(w0, 0, 2, false, 11), stored(w1, 0, 1, false, 12), stored(x0, 0, 1, false, 13)),
			want{outcome: "4/0/0", w0: 2, w1: 1}},
		{"dead: blocks dropped", Entry{Type: EntryWorkerDead, ID: "w"}, want{dead: []string{"w"}}},
		{"dead again: no change", Entry{Type: EntryWorkerDead, ID: "w"}, want{dead: []string{"w"}}},
		{"dead: unknown worker", Entry{Type: EntryWorkerDead, ID: "ghost"}, want{err: ErrUnknownWorker, dead: []string{"w"}}},
		{"batches in flight are fenced", batchesEntry(stored(w0, 0, 3, false, 14), stored(w1, 0, 2, false, 15)),
			want{outcome: "0/2/0", dead: []string{"w"}}},
		{"an old epoch's reset is a duplicate", batchesEntry(stored(w0, 0, 2, true, 16)), want{outcome: "0/0/1", dead: []string{"w"}}},
		{"rank 0 starts afresh: w lives", batchesEntry(stored(w0, 1, 0, true, 17)), want{outcome: "1/0/0", w0: 1}},
		{"rank 1 is still fenced", batchesEntry(stored(w1, 0, 3, false, 18)), want{outcome: "0/1/0", w0: 1}},
		{"rank 1 starts afresh", batchesEntry(stored(w1, 1, 5, true, 19), stored(w1, 1, 6, false, 20)), want{outcome: "2/0/0", w0: 1, w1: 2}},
		{"dead once more", Entry{Type: EntryWorkerDead, ID: "w"}, want{dead: []string{"w"}}},
		{"alive: the health endpoint answers", Entry{Type: EntryWorkerAlive, ID: "w"}, want{}},
		{"alive again: no change", Entry{Type: EntryWorkerAlive, ID: "w"}, want{}},
		{"alive: unknown worker", Entry{Type: EntryWorkerAlive, ID: "ghost"}, want{err: ErrUnknownWorker}},
		{"alive, yet still fenced until a fresh stream", batchesEntry(stored(w0, 1, 1, false, 21)), want{outcome: "0/1/0"}},
		{"fresh again", batchesEntry(stored(w0, 2, 0, true, 22)), want{outcome: "1/0/0", w0: 1}},
		{"dead, then unregistered", Entry{Type: EntryWorkerDead, ID: "w"}, want{dead: []string{"w"}}},
		{"unregistering ends the death", Entry{Type: EntryUnregisterWorker, ID: "w"}, want{}},
	}
	for i, st := range steps {
		r := applyEntry(t, f, uint64(i+1), st.entry)
		if !errors.Is(r.Err, st.want.err) || (st.want.err == nil && r.Err != nil) {
			t.Fatalf("%s: error %v, want %v", st.name, r.Err, st.want.err)
		}
		if st.want.outcome != "" {
			if got := fmtOutcome(r); got != st.want.outcome {
				t.Fatalf("%s: applied/fenced/duplicate %s, want %s", st.name, got, st.want.outcome)
			}
		}
		if got := slices.Sorted(maps.Keys(f.Dead())); !slices.Equal(got, st.want.dead) {
			t.Fatalf("%s: dead %v, want %v", st.name, got, st.want.dead)
		}
		if held(w0) != st.want.w0 || held(w1) != st.want.w1 {
			t.Fatalf("%s: w holds %d and %d blocks on ranks 0 and 1, want %d and %d", st.name, held(w0), held(w1), st.want.w0, st.want.w1)
		}
		if i >= 2 && held(x0) != 1 { // from "blocks of both" on
			t.Fatalf("%s: x holds %d blocks, want 1: another worker's death must not touch it", st.name, held(x0))
		}
	}
	if want := []string{"w", "w", "w"}; !slices.Equal(deaths, want) {
		t.Errorf("OnWorkerDead told of %v, want %v", deaths, want)
	}
	// Registrations (2), deaths (3), revivals by a fresh stream (1) or the
	// health endpoint (1), the unregistration (1).
	if notified != 8 {
		t.Errorf("OnWorkersChanged called %d times, want 8", notified)
	}
}

func fmtOutcome(r ApplyResult) string {
	return fmt.Sprintf("%d/%d/%d", r.Applied, r.Fenced, r.Duplicates)
}

// TestSnapshotKeepsDeadWorkers: a snapshot carries the dead workers and the
// fences, so a replica restored from it drops the same in-flight batches and
// takes the same fresh stream as the one that applied the log.
func TestSnapshotKeepsDeadWorkers(t *testing.T) {
	src := newTestFSM(t, nil)
	applyEntry(t, src, 1, Entry{Type: EntryRegisterWorker, Worker: workerspec.Spec{ID: "w", Model: "m"}})
	applyEntry(t, src, 2, batchesEntry(stored(ws("w", 0), 0, 1, false, 10)))
	applyEntry(t, src, 3, Entry{Type: EntryWorkerDead, ID: "w"})
	dst := newTestFSM(t, nil)
	if err := dst.Restore(io.NopCloser(bytes.NewReader(snapshotBytes(t, src)))); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(dst.Dead(), map[string]uint64{"w": 3}) {
		t.Errorf("restored dead workers %v, want w at 3", dst.Dead())
	}
	if c, _ := dst.applier.Cursor(ws("w", 0)); c != (ingest.Cursor{Seq: 1, Epoch: 0, Fence: 3}) {
		t.Errorf("restored cursor %+v, want seq 1 epoch 0 fenced at 3", c)
	}
	for i, b := range []ingest.StreamBatch{stored(ws("w", 0), 0, 2, false, 11), stored(ws("w", 0), 1, 0, true, 12)} {
		a, d := applyEntry(t, src, uint64(4+i), batchesEntry(b)), applyEntry(t, dst, uint64(4+i), batchesEntry(b))
		if a != d {
			t.Errorf("batch %d: the original applied %+v, the restored replica %+v", i, a, d)
		}
	}
	if len(dst.Dead()) != 0 || dst.applier.Index().Digest() != src.applier.Index().Digest() {
		t.Errorf("after the fresh stream: restored replica dead %v, digests equal %v", dst.Dead(), dst.applier.Index().Digest() == src.applier.Index().Digest())
	}
}
