package raftstore

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/hashicorp/raft"

	"github.com/kvindex/kvindex/internal/ingest"
	"github.com/kvindex/kvindex/internal/radix"
	"github.com/kvindex/kvindex/internal/workerspec"
)

func newTestFSM(t testing.TB, onWorkers func([]workerspec.Spec)) *fsm {
	t.Helper()
	return newFSM(ingest.NewApplier(radix.New(radix.Config{})), slog.New(slog.DiscardHandler), newMetrics(), onWorkers, nil)
}

// applyEntry applies e at index and returns the FSM's result.
func applyEntry(t testing.TB, f *fsm, index uint64, e Entry) ApplyResult {
	t.Helper()
	data, err := EncodeEntry(nil, &e)
	if err != nil {
		t.Fatal(err)
	}
	return applyData(f, index, data)
}

func applyData(f *fsm, index uint64, data []byte) ApplyResult {
	r, _ := f.Apply(&raft.Log{Index: index, Type: raft.LogCommand, Data: data}).(ApplyResult)
	return r
}

func batchesEntry(b ...ingest.StreamBatch) Entry { return Entry{Type: EntryStreamBatches, Batches: b} }

// genBatches returns n batches round-robin over streams, each of about blocks events.
func genBatches(streams []*synthStream, n, blocks int) []ingest.StreamBatch {
	out := make([]ingest.StreamBatch, 0, n)
	for i := range n {
		out = append(out, streams[i%len(streams)].batch(blocks))
	}
	return out
}

func testStreams(n int) []*synthStream {
	var out []*synthStream
	for i := range n {
		out = append(out, newSynthStream(ws([]string{"alpha", "beta", "gamma"}[i%3], uint32(i/3)), uint64(i+1), 4000))
	}
	return out
}

func TestFSMAppliesEachBatchOnce(t *testing.T) {
	f := newTestFSM(t, nil)
	ref := ingest.NewApplier(radix.New(radix.Config{}))
	batches := genBatches(testStreams(5), 400, 8)
	index := uint64(0)
	for i := 0; i < len(batches); i += 10 {
		index++
		r := applyEntry(t, f, index, batchesEntry(batches[i:i+10]...))
		if r.Applied != 10 || r.Duplicates != 0 || r.Err != nil {
			t.Fatalf("entry %d: %+v, want 10 applied", index, r)
		}
		for _, b := range batches[i : i+10] {
			ref.Apply(b)
		}
	}
	before := f.applier.Index().Digest()
	// The same batches again, as a new leader re-proposing them would: all dropped.
	for i := 0; i < len(batches); i += 25 {
		index++
		r := applyEntry(t, f, index, batchesEntry(batches[i:i+25]...))
		if r.Applied != 0 || r.Duplicates != 25 {
			t.Fatalf("re-proposed entry %d: %+v, want 25 duplicates", index, r)
		}
	}
	if got := f.applier.Index().Digest(); got != before {
		t.Error("re-proposed batches changed the index")
	}
	if got, want := f.applier.Index().Digest(), ref.Index().Digest(); got != want {
		t.Error("FSM index differs from an Applier fed the same batches directly")
	}
	if !reflect.DeepEqual(f.applier.Cursors(), ref.Cursors()) {
		t.Errorf("cursors %v, want %v", f.applier.Cursors(), ref.Cursors())
	}
	if f.lastIndex.Load() != index {
		t.Errorf("last applied index %d, want %d", f.lastIndex.Load(), index)
	}
}

func TestFSMSkipsUnknownIgnorableEntry(t *testing.T) {
	f := newTestFSM(t, nil)
	r := applyData(f, 1, []byte{entryVersion, ignorableFlag | 0x33, 1, 2, 3})
	if r.Err != nil {
		t.Fatalf("ignorable entry: %v", r.Err)
	}
	if f.err() != nil {
		t.Fatalf("FSM stopped on an ignorable entry: %v", f.err())
	}
	if r := applyEntry(t, f, 2, batchesEntry(ingest.StreamBatch{Stream: ws("w", 0), Seq: 1})); r.Applied != 1 {
		t.Errorf("batch after the ignorable entry: %+v, want applied", r)
	}
}

func TestFSMStopsOnEntryItCannotApply(t *testing.T) {
	tests := []struct {
		name string
		data []byte
	}{
		{"unknown type", []byte{entryVersion, 0x33, 1, 2, 3}},
		{"newer format version", []byte{entryVersion + 1, byte(EntryStreamBatches), 0, 0}},
		{"corrupt", []byte{entryVersion, byte(EntryStreamBatches), 9}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newTestFSM(t, nil)
			applyEntry(t, f, 1, batchesEntry(ingest.StreamBatch{Stream: ws("w", 0), Seq: 1, Ops: []ingest.Op{
				{Kind: ingest.OpStored, Hashes: []uint64{1}, Keys: []uint64{1}},
			}}))
			before := f.applier.Index().Digest()
			if r := applyData(f, 2, tc.data); !errors.Is(r.Err, ErrFSMStopped) {
				t.Fatalf("result %+v, want ErrFSMStopped", r)
			}
			select {
			case <-f.stopped:
			default:
				t.Fatal("stopped channel not closed")
			}
			r := applyEntry(t, f, 3, batchesEntry(ingest.StreamBatch{Stream: ws("w", 0), Seq: 2, Ops: []ingest.Op{{Kind: ingest.OpCleared}}}))
			if !errors.Is(r.Err, ErrFSMStopped) || r.Applied != 0 {
				t.Errorf("entry after the stop: %+v, want ErrFSMStopped and nothing applied", r)
			}
			if f.applier.Index().Digest() != before || f.lastIndex.Load() != 1 {
				t.Error("a stopped FSM changed its state")
			}
			if _, err := f.Snapshot(); !errors.Is(err, ErrFSMStopped) {
				t.Errorf("Snapshot of a stopped FSM: %v, want ErrFSMStopped", err)
			}
		})
	}
}

func TestFSMRegistry(t *testing.T) {
	var seen [][]workerspec.Spec
	f := newTestFSM(t, func(w []workerspec.Spec) { seen = append(seen, w) })
	w := sampleWorker()
	other := workerspec.Spec{ID: "aaa", Model: "m", BlockSize: 16}
	wider := w
	wider.DPSize = int(w.Ranks()) + 1 // one more dp rank
	other2 := w
	other2.Model = "not-the-registered-one"
	ghost := workerspec.Spec{ID: "ghost", Model: "m"}
	steps := []struct {
		name    string
		entry   Entry
		wantErr error
		wantIDs []string
	}{
		{"register", Entry{Type: EntryRegisterWorker, Worker: w}, nil, []string{"vllm-0"}},
		{"register another", Entry{Type: EntryRegisterWorker, Worker: other}, nil, []string{"aaa", "vllm-0"}},
		{"register again, same spec", Entry{Type: EntryRegisterWorker, Worker: w}, nil, []string{"aaa", "vllm-0"}},
		{"register again, other spec", Entry{Type: EntryRegisterWorker, Worker: workerspec.Spec{ID: "vllm-0", Model: "x", BlockSize: 16}}, ErrWorkerExists, []string{"aaa", "vllm-0"}},
		{"replace, expecting another spec", Entry{Type: EntryReplaceWorker, Expected: other2, Worker: wider}, ErrWorkerChanged, []string{"aaa", "vllm-0"}},
		{"replace an unknown worker", Entry{Type: EntryReplaceWorker, Expected: ghost, Worker: ghost}, ErrUnknownWorker, []string{"aaa", "vllm-0"}},
		{"replace", Entry{Type: EntryReplaceWorker, Expected: w, Worker: wider}, nil, []string{"aaa", "vllm-0"}},
		{"replace again (a retry)", Entry{Type: EntryReplaceWorker, Expected: w, Worker: wider}, nil, []string{"aaa", "vllm-0"}},
		{"unregister unknown", Entry{Type: EntryUnregisterWorker, ID: "nope"}, ErrUnknownWorker, []string{"aaa", "vllm-0"}},
		{"unregister", Entry{Type: EntryUnregisterWorker, ID: "vllm-0"}, nil, []string{"aaa"}},
	}
	for i, st := range steps {
		r := applyEntry(t, f, uint64(i+1), st.entry)
		if !errors.Is(r.Err, st.wantErr) || (st.wantErr == nil && r.Err != nil) {
			t.Fatalf("%s: error %v, want %v", st.name, r.Err, st.wantErr)
		}
		var ids []string
		for _, w := range f.Workers() {
			ids = append(ids, w.ID)
		}
		if !reflect.DeepEqual(ids, st.wantIDs) {
			t.Fatalf("%s: registry %v, want %v", st.name, ids, st.wantIDs)
		}
	}
	if len(seen) != 4 {
		t.Errorf("OnWorkersChanged called %d times, want 4 (two registrations, one replacement, one removal)", len(seen))
	}
	if len(seen) > 2 {
		if got := seen[2]; len(got) != 2 || !sameWorker(&got[1], &wider) {
			t.Errorf("after the replacement the registry was %+v, want vllm-0 as %+v", got, wider)
		}
	}
	if got, ok := f.Worker("aaa"); !ok || !sameWorker(&got, &other) {
		t.Errorf("Worker(aaa) = %+v, %v", got, ok)
	}
}

// TestFSMUnregisterDropsBlocksAndLateBatches checks that unregistering a worker
// as older builds did (EntryUnregisterWorker, replayed from their logs) removes
// its blocks and cursors, that its batches committed after the removal (in
// flight when it happened) are dropped, and that registering it again lets its
// batches in.
func TestFSMUnregisterDropsBlocksAndLateBatches(t *testing.T) {
	f := newTestFSM(t, nil)
	empty := f.applier.Index().Digest()
	stored := func(seq uint64) ingest.StreamBatch {
		return ingest.StreamBatch{Stream: ws("vllm-0", 1), Seq: seq, Ops: []ingest.Op{
			{Kind: ingest.OpStored, Hashes: []uint64{seq}, Keys: []uint64{seq}},
		}}
	}
	applyEntry(t, f, 1, Entry{Type: EntryRegisterWorker, Worker: sampleWorker()})
	applyEntry(t, f, 2, batchesEntry(stored(1), stored(2)))
	applyEntry(t, f, 3, Entry{Type: EntryUnregisterWorker, ID: "vllm-0"})
	if f.applier.Index().Digest() != empty {
		t.Error("blocks of the unregistered worker are still indexed")
	}
	if _, ok := f.applier.Cursor(ws("vllm-0", 1)); ok {
		t.Error("cursor of the unregistered worker is still there")
	}
	if r := applyEntry(t, f, 4, batchesEntry(stored(3))); r.OfRemovedWorkers != 1 || r.Applied != 0 {
		t.Errorf("late batch: %+v, want dropped as of a removed worker", r)
	}
	if f.applier.Index().Digest() != empty {
		t.Error("a late batch brought the unregistered worker's blocks back")
	}
	applyEntry(t, f, 5, Entry{Type: EntryRegisterWorker, Worker: sampleWorker()})
	if r := applyEntry(t, f, 6, batchesEntry(stored(4))); r.Applied != 1 {
		t.Errorf("batch after registering again: %+v, want applied", r)
	}
}

// TestFSMBatchOfAnOldRegistrationCannotSwallowTheNewStream: a batch proposed
// before its worker was unregistered can commit after the worker is registered
// again (Submit returns before its batch is proposed; admin entries are
// proposed at once). It must neither bring the old registration's blocks back
// nor move the stream's cursor where the new registration's batches would be
// taken for duplicates: the unregistration leaves the cursor fenced, so the old
// batch is dropped and the new stream, which ingest starts afresh one epoch
// above the fenced cursor, gets in.
func TestFSMBatchOfAnOldRegistrationCannotSwallowTheNewStream(t *testing.T) {
	f := newTestFSM(t, nil)
	s := ws("w", 0)
	w := workerspec.Spec{ID: "w", Model: "m"}
	held := func() int { return f.applier.Index().HeldBlocks(s) }
	applyEntry(t, f, 1, Entry{Type: EntryRegisterWorker, Worker: w})
	if r := applyEntry(t, f, 2, batchesEntry(stored(s, 3, 10, false, 1))); r.Applied != 1 {
		t.Fatalf("first batch: %s", fmtOutcome(r))
	}
	applyEntry(t, f, 3, Entry{Type: EntryUnregisterFenced, ID: "w"})
	if c, ok := f.applier.Cursor(s); !ok || c.Fence != 3 || c.Epoch != 3 {
		t.Fatalf("cursor after the unregistration %+v, %v; want epoch 3 fenced at 3", c, ok)
	}
	if held() != 0 {
		t.Fatalf("the unregistered worker holds %d blocks", held())
	}
	if r := applyEntry(t, f, 4, batchesEntry(stored(s, 3, 11, false, 2))); r.OfRemovedWorkers != 1 {
		t.Fatalf("batch while unregistered: %+v, want dropped as of a removed worker", r)
	}
	applyEntry(t, f, 5, Entry{Type: EntryRegisterWorker, Worker: w})
	if r := applyEntry(t, f, 6, batchesEntry(stored(s, 3, 12, false, 3))); r.Fenced != 1 || held() != 0 {
		t.Fatalf("old registration's batch committed after the new registration: %s, %d blocks held; want fenced, none", fmtOutcome(r), held())
	}
	// What ingest sends for the new registration: it finds the fence and
	// starts the stream afresh (Tracker.Fresh) one epoch above the cursor.
	c, _ := f.applier.Cursor(s)
	for i, b := range []ingest.StreamBatch{stored(s, c.Epoch+1, 0, true, 100), stored(s, c.Epoch+1, 1, false, 101)} {
		if r := applyEntry(t, f, uint64(7+i), batchesEntry(b)); r.Applied != 1 {
			t.Fatalf("new registration's batch %d: %s, want applied", i, fmtOutcome(r))
		}
	}
	if held() != 2 {
		t.Errorf("the new registration holds %d blocks, want 2", held())
	}
}

// TestSnapshotKeepsTheFencesOfUnregisteredWorkers: a replica restored from a
// snapshot taken between an unregistration and the worker's new registration
// drops the late batch of the old registration as the others do.
func TestSnapshotKeepsTheFencesOfUnregisteredWorkers(t *testing.T) {
	src := newTestFSM(t, nil)
	s, w := ws("w", 0), workerspec.Spec{ID: "w", Model: "m"}
	applyEntry(t, src, 1, Entry{Type: EntryRegisterWorker, Worker: w})
	applyEntry(t, src, 2, batchesEntry(stored(s, 3, 10, false, 1)))
	applyEntry(t, src, 3, Entry{Type: EntryUnregisterFenced, ID: "w"})
	dst := newTestFSM(t, nil)
	if err := dst.Restore(io.NopCloser(bytes.NewReader(snapshotBytes(t, src)))); err != nil {
		t.Fatal(err)
	}
	for name, f := range map[string]*fsm{"original": src, "restored": dst} {
		applyEntry(t, f, 4, Entry{Type: EntryRegisterWorker, Worker: w})
		if r := applyEntry(t, f, 5, batchesEntry(stored(s, 3, 11, false, 2))); r.Fenced != 1 {
			t.Errorf("%s: late batch of the old registration: %s, want fenced", name, fmtOutcome(r))
		}
	}
}

// TestFSMReplaceKeepsBlocks: replacing a worker's spec (one more dp rank)
// leaves the blocks it holds and its cursors where they are.
func TestFSMReplaceKeepsBlocks(t *testing.T) {
	f := newTestFSM(t, nil)
	w := sampleWorker()
	applyEntry(t, f, 1, Entry{Type: EntryRegisterWorker, Worker: w})
	applyEntry(t, f, 2, batchesEntry(ingest.StreamBatch{Stream: ws("vllm-0", 0), Seq: 7, Ops: []ingest.Op{
		{Kind: ingest.OpStored, Hashes: []uint64{1}, Keys: []uint64{1}},
	}}))
	before := f.applier.Index().Digest()
	wider := w
	wider.DPSize = int(w.Ranks()) + 1
	if r := applyEntry(t, f, 3, Entry{Type: EntryReplaceWorker, Expected: w, Worker: wider}); r.Err != nil {
		t.Fatal(r.Err)
	}
	if f.applier.Index().Digest() != before {
		t.Error("replacing the spec changed the index")
	}
	if c, ok := f.applier.Cursor(ws("vllm-0", 0)); !ok || c.Seq != 7 {
		t.Errorf("cursor after the replacement = %+v, %v; want seq 7", c, ok)
	}
}

func TestFSMForgetsOldestTombstone(t *testing.T) {
	f := newTestFSM(t, nil)
	index := uint64(0)
	for i := range maxTombstones + 1 {
		w := workerspec.Spec{ID: fmt.Sprintf("w%05d", i), Model: "m", BlockSize: 1}
		index++
		applyEntry(t, f, index, Entry{Type: EntryRegisterWorker, Worker: w})
		index++
		applyEntry(t, f, index, batchesEntry(ingest.StreamBatch{Stream: ws(w.ID, 0), Seq: 1}))
		index++
		if r := applyEntry(t, f, index, Entry{Type: EntryUnregisterFenced, ID: w.ID}); r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	if len(f.tombstones) != maxTombstones {
		t.Fatalf("%d tombstones, want %d", len(f.tombstones), maxTombstones)
	}
	if _, ok := f.tombstones["w00000"]; ok {
		t.Error("the oldest tombstone was kept")
	}
	// Each unregistered worker's fenced cursor stays as long as its
	// tombstone, and no longer.
	if n := len(f.applier.Cursors()); n != maxTombstones {
		t.Errorf("%d cursors, want %d: one per remembered tombstone", n, maxTombstones)
	}
	if _, ok := f.applier.Cursor(ws("w00000", 0)); ok {
		t.Error("the forgotten worker's cursor was kept")
	}
	index++
	if r := applyEntry(t, f, index, batchesEntry(ingest.StreamBatch{Stream: ws("w00000", 0), Seq: 2})); r.Applied != 1 {
		t.Errorf("batch of the forgotten worker: %+v, want applied", r)
	}
}

// bufferSink is a raft.SnapshotSink in memory.
type bufferSink struct {
	bytes.Buffer
	cancelled, closed bool
}

func (s *bufferSink) ID() string    { return "test" }
func (s *bufferSink) Cancel() error { s.cancelled = true; return nil }
func (s *bufferSink) Close() error  { s.closed = true; return nil }

func snapshotBytes(t testing.TB, f *fsm) []byte {
	t.Helper()
	snap, err := f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	defer snap.Release()
	var sink bufferSink
	if err := snap.Persist(&sink); err != nil || !sink.closed {
		t.Fatalf("persist: %v (closed %v)", err, sink.closed)
	}
	return sink.Bytes()
}

// populatedFSM returns an FSM with blocks, cursors, workers, a tombstone and member
// addresses, and the batches that follow, to apply after a restore.
func populatedFSM(t testing.TB) (*fsm, []ingest.StreamBatch) {
	f := newTestFSM(t, nil)
	applyEntry(t, f, 1, Entry{Type: EntryRegisterWorker, Worker: sampleWorker()})
	applyEntry(t, f, 2, Entry{Type: EntryRegisterWorker, Worker: workerspec.Spec{ID: "gone", Model: "m", BlockSize: 8}})
	applyEntry(t, f, 3, Entry{Type: EntryUnregisterWorker, ID: "gone"})
	applyEntry(t, f, 4, Entry{Type: EntryMemberAddr, ID: "node-1", GRPCAddr: "10.0.0.1:7070"})
	streams := testStreams(6)
	batches := genBatches(streams, 600, 12)
	applyEntry(t, f, 5, batchesEntry(batches...))
	return f, genBatches(streams, 120, 12)
}

func TestSnapshotRestoreRoundTrip(t *testing.T) {
	src, next := populatedFSM(t)
	data := snapshotBytes(t, src)

	var notified []workerspec.Spec
	dst := newTestFSM(t, func(w []workerspec.Spec) { notified = w })
	applyEntry(t, dst, 1, batchesEntry(ingest.StreamBatch{Stream: ws("stale", 0), Seq: 5, Ops: []ingest.Op{
		{Kind: ingest.OpStored, Hashes: []uint64{1}, Keys: []uint64{1}},
	}})) // state the restore must discard
	if err := dst.Restore(io.NopCloser(bytes.NewReader(data))); err != nil {
		t.Fatal(err)
	}
	if dst.applier.Index().Digest() != src.applier.Index().Digest() {
		t.Error("restored index digest differs")
	}
	if !reflect.DeepEqual(dst.applier.Cursors(), src.applier.Cursors()) {
		t.Error("restored cursors differ")
	}
	if !reflect.DeepEqual(dst.Workers(), src.Workers()) || !reflect.DeepEqual(notified, src.Workers()) {
		t.Errorf("restored registry %v (notified %v), want %v", dst.Workers(), notified, src.Workers())
	}
	if !reflect.DeepEqual(dst.tombstones, src.tombstones) || !reflect.DeepEqual(dst.memberAddrs(), src.memberAddrs()) {
		t.Error("restored tombstones or member addresses differ")
	}
	if dst.lastIndex.Load() != 5 {
		t.Errorf("restored applied index %d, want 5 (the last entry of the snapshot's state)", dst.lastIndex.Load())
	}
	// Both go on identically.
	for _, f := range []*fsm{src, dst} {
		applyEntry(t, f, 6, batchesEntry(next...))
		applyEntry(t, f, 7, batchesEntry(ingest.StreamBatch{Stream: ws("gone", 0), Seq: 1}))
	}
	if dst.applier.Index().Digest() != src.applier.Index().Digest() {
		t.Error("digests differ after applying the same entries to the original and the restored state")
	}
	if again := snapshotBytes(t, dst); !bytes.Equal(again, snapshotBytes(t, src)) {
		t.Error("snapshots of the two states differ")
	}
}

// encodeStateV2 is the state section of a version 2 snapshot (no cursor
// fences, no dead workers), frozen here so that the reader of older snapshots
// stays tested; version 1 is the same without the applied index.
func encodeStateV2(f *fsm) []byte {
	b := binary.AppendUvarint(nil, f.lastIndex.Load())
	b = binary.AppendUvarint(b, uint64(len(f.workers)))
	for _, id := range slices.Sorted(maps.Keys(f.workers)) {
		w := f.workers[id]
		b = appendWorker(b, &w)
	}
	b = binary.AppendUvarint(b, uint64(len(f.tombstones)))
	for _, id := range slices.Sorted(maps.Keys(f.tombstones)) {
		b = binary.AppendUvarint(appendString(b, id), f.tombstones[id])
	}
	b = binary.AppendUvarint(b, uint64(len(f.members)))
	for _, id := range slices.Sorted(maps.Keys(f.members)) {
		b = appendString(appendString(b, id), f.members[id])
	}
	cursors := f.applier.Cursors()
	b = binary.AppendUvarint(b, uint64(len(cursors)))
	for _, s := range slices.SortedFunc(maps.Keys(cursors), compareStreams) {
		b = binary.AppendUvarint(appendString(b, s.Worker), uint64(s.DPRank))
		b = binary.AppendUvarint(binary.AppendUvarint(b, cursors[s].Seq), cursors[s].Epoch)
	}
	return b
}

// TestRestoreReadsOlderSnapshots restores snapshots in the formats before the
// cursor fences and dead workers (version 2) and before the applied index
// (version 1): the state is the same, with no fence and no dead worker, and
// the applied index of version 1 is unknown (0).
func TestRestoreReadsOlderSnapshots(t *testing.T) {
	src, _ := populatedFSM(t)
	current := snapshotBytes(t, src)
	state := encodeState(src.lastIndex.Load(), src.workers, src.tombstones, src.members, src.applier.Cursors(), src.dead)
	head := len(snapshotMagic) + 1 + len(binary.AppendUvarint(nil, uint64(len(state)))) + len(state) + 4
	v2 := encodeStateV2(src)
	_, appliedLen := binary.Uvarint(v2)
	for _, tc := range []struct {
		version     byte
		state       []byte
		wantApplied uint64
	}{
		{2, v2, src.lastIndex.Load()},
		{1, v2[appliedLen:], 0},
	} {
		t.Run(fmt.Sprint("version ", tc.version), func(t *testing.T) {
			old := append([]byte(snapshotMagic), tc.version)
			old = binary.AppendUvarint(old, uint64(len(tc.state)))
			old = append(old, tc.state...)
			old = binary.LittleEndian.AppendUint32(old, crc32.Checksum(tc.state, castagnoli))
			old = append(old, current[head:]...)

			// dst has applied an entry: a version 1 snapshot does not say
			// what it applied, so it cannot be told older and is restored.
			dst := newTestFSM(t, nil)
			applyEntry(t, dst, 1, batchesEntry(ingest.StreamBatch{Stream: ws("mine", 0), Seq: 1, Ops: []ingest.Op{
				{Kind: ingest.OpStored, Hashes: []uint64{1}, Keys: []uint64{1}},
			}}))
			if err := dst.Restore(io.NopCloser(bytes.NewReader(old))); err != nil {
				t.Fatal(err)
			}
			if dst.applier.Index().Digest() != src.applier.Index().Digest() || !reflect.DeepEqual(dst.Workers(), src.Workers()) ||
				!reflect.DeepEqual(dst.applier.Cursors(), src.applier.Cursors()) || len(dst.Dead()) != 0 {
				t.Errorf("the state restored from a version %d snapshot differs", tc.version)
			}
			if dst.lastIndex.Load() != tc.wantApplied {
				t.Errorf("applied index %d from a version %d snapshot, want %d", dst.lastIndex.Load(), tc.version, tc.wantApplied)
			}
		})
	}
}

// TestSnapshotStateRefusesNamesBeyondTheLimits: a snapshot whose state names a
// worker, tombstone, member, stream or dead worker with an empty or over-long
// id is corrupt (an entry with such an id is a no-op; a snapshot cannot hold one).
func TestSnapshotStateRefusesNamesBeyondTheLimits(t *testing.T) {
	long := strings.Repeat("x", maxNameLen+1)
	tests := []struct {
		name  string
		state []byte
	}{
		{"empty tombstone", encodeState(3, nil, map[string]uint64{"": 1}, nil, nil, nil)},
		{"long member id", encodeState(3, nil, nil, map[string]string{long: "a:1"}, nil, nil)},
		{"empty stream worker", encodeState(3, nil, nil, nil, map[ingest.Stream]ingest.Cursor{{Worker: ""}: {Seq: 1}}, nil)},
		{"long dead worker", encodeState(3, nil, nil, nil, nil, map[string]uint64{long: 2})},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := decodeState(tc.state, snapshotVersion); !errors.Is(err, ErrCorruptSnapshot) {
				t.Errorf("decodeState = %v, want ErrCorruptSnapshot", err)
			}
		})
	}
	if _, err := decodeState(encodeState(3, nil, map[string]uint64{"ok": 1}, nil, nil, nil), snapshotVersion); err != nil {
		t.Errorf("a valid state: %v", err)
	}
}

// TestRestoreKeepsAStateNewerThanTheSnapshot: a follower sent a snapshot
// older than what it has applied (hashicorp/raft installs whatever a leader
// sends) keeps its state and applied index, instead of going back in time until
// raft replays the later entries; the replayed entries are skipped as applied,
// and the next new one applies.
func TestRestoreKeepsAStateNewerThanTheSnapshot(t *testing.T) {
	f, next := populatedFSM(t) // applied through 5
	old := snapshotBytes(t, f)
	entry6 := batchesEntry(next[:60]...)
	if r := applyEntry(t, f, 6, entry6); r.Applied == 0 {
		t.Fatalf("entry 6 applied nothing: %+v", r)
	}
	digest, cursors, workers := f.applier.Index().Digest(), f.applier.Cursors(), f.Workers()
	if err := f.Restore(io.NopCloser(bytes.NewReader(old))); err != nil {
		t.Fatal(err)
	}
	if f.applier.Index().Digest() != digest || !reflect.DeepEqual(f.applier.Cursors(), cursors) ||
		!reflect.DeepEqual(f.Workers(), workers) || f.lastIndex.Load() != 6 {
		t.Fatalf("restoring a snapshot of applied index 5 over a state at 6 took the state back (applied index %d)", f.lastIndex.Load())
	}
	if r := applyEntry(t, f, 6, entry6); r != (ApplyResult{}) || f.applier.Index().Digest() != digest {
		t.Errorf("entry 6 replayed after the snapshot: %+v, want it skipped as applied", r)
	}
	if r := applyEntry(t, f, 7, batchesEntry(next[60:]...)); r.Applied == 0 || f.lastIndex.Load() != 7 {
		t.Errorf("entry 7 after the replay: %+v, applied index %d", r, f.lastIndex.Load())
	}
}

func TestRestoreRejectsCorruptSnapshots(t *testing.T) {
	src, _ := populatedFSM(t)
	good := snapshotBytes(t, src)
	stateLen := len(snapshotMagic) + 1 // magic, version: the state length follows
	mutate := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), good...)) }
	tests := []struct {
		name string
		data []byte
	}{
		{"empty", nil},
		{"bad magic", mutate(func(b []byte) []byte { b[0] = 'X'; return b })},
		{"newer version", mutate(func(b []byte) []byte { b[len(snapshotMagic)] = snapshotVersion + 1; return b })},
		{"version 0", mutate(func(b []byte) []byte { b[len(snapshotMagic)] = 0; return b })},
		{"state bit flip", mutate(func(b []byte) []byte { b[stateLen+4] ^= 1; return b })},
		{"truncated state", good[:stateLen+8]},
		{"index bit flip", mutate(func(b []byte) []byte { b[len(b)-10] ^= 0x40; return b })},
		{"truncated index", good[:len(good)-3]},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dst := newTestFSM(t, nil) // behind the snapshot, which it would restore
			applyEntry(t, dst, 1, batchesEntry(ingest.StreamBatch{Stream: ws("mine", 0), Seq: 1, Ops: []ingest.Op{
				{Kind: ingest.OpStored, Hashes: []uint64{1}, Keys: []uint64{1}},
			}}))
			digest, cursors := dst.applier.Index().Digest(), dst.applier.Cursors()
			err := dst.Restore(io.NopCloser(bytes.NewReader(tc.data)))
			if !errors.Is(err, ErrCorruptSnapshot) && !errors.Is(err, radix.ErrCorruptSnapshot) {
				t.Fatalf("error %v, want a corrupt-snapshot error", err)
			}
			if dst.applier.Index().Digest() != digest || !reflect.DeepEqual(dst.applier.Cursors(), cursors) {
				t.Error("a failed restore changed the state")
			}
		})
	}
}
