package raftstore

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"maps"
	"slices"

	"github.com/hashicorp/raft"

	"github.com/kvindex/kvindex/internal/ingest"
	"github.com/kvindex/kvindex/internal/radix"
	"github.com/kvindex/kvindex/internal/workerspec"
)

// Snapshot format, version 3 (integers and strings as in the log entry format):
//
//	magic "kvixraft", version
//	state length, state, CRC-32C (Castagnoli) of state, 4 bytes little-endian
//	   state = applied: log index of the last command entry applied
//	           workers: count, each as in EntryRegisterWorker, ascending id
//	           tombstones: count, (worker id, log index), ascending id
//	           members: count, (node id, gRPC address), ascending id
//	           cursors: count, (worker, dp rank, seq, epoch, fence), ascending stream
//	           dead: count, (worker id, log index), ascending id
//	the radix index snapshot (radix.Index.WriteTo; checksummed on its own)
//
// Anything after the index snapshot is not read. Version 2 is version 3 without
// cursor fences and dead workers, version 1 version 2 without applied; both are
// still read (no fence, no dead worker; applied 0, see fsm.Restore).
const (
	snapshotMagic   = "kvixraft"
	snapshotVersion = 3
	// maxSnapshotState bounds the state section a reader accepts (a registry of a
	// million workers with long endpoints stays far below it).
	maxSnapshotState = 1 << 30
)

// ErrCorruptSnapshot: a snapshot that is not valid in this format version.
var ErrCorruptSnapshot = errors.New("raftstore: corrupt snapshot")

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// fsmSnapshot is a captured state: the registry and cursors already serialised, the
// index as a radix.Snapshot (a copy of its arrays), which Persist serialises off the
// apply goroutine.
type fsmSnapshot struct {
	head  []byte // magic, version, state section
	index *radix.Snapshot
}

var _ raft.FSMSnapshot = (*fsmSnapshot)(nil)

// capture takes the state. It runs on the apply goroutine, so the index, cursors and
// registry it captures are those of one log index; copying the index's arrays costs
// tens of milliseconds per million blocks, against hundreds to serialise them, so
// Apply is held up only for the copy.
func (f *fsm) capture() (*fsmSnapshot, error) {
	ix := f.applier.Index().Snapshot()
	f.mu.RLock()
	state := encodeState(f.lastIndex.Load(), f.workers, f.tombstones, f.members, f.applier.Cursors(), f.dead)
	f.mu.RUnlock()
	head := append([]byte(snapshotMagic), snapshotVersion)
	head = binary.AppendUvarint(head, uint64(len(state)))
	head = append(head, state...)
	head = binary.LittleEndian.AppendUint32(head, crc32.Checksum(state, castagnoli))
	return &fsmSnapshot{head: head, index: ix}, nil
}

// Persist writes the snapshot to sink, concurrently with Apply.
func (s *fsmSnapshot) Persist(sink raft.SnapshotSink) error {
	_, err := sink.Write(s.head)
	if err == nil {
		_, err = s.index.WriteTo(sink)
	}
	if err != nil {
		return errors.Join(fmt.Errorf("raftstore: persisting snapshot: %w", err), sink.Cancel())
	}
	return sink.Close()
}

// Release drops the captured state.
func (s *fsmSnapshot) Release() { s.head, s.index = nil, nil }

func encodeState(applied uint64, workers map[string]workerspec.Spec, tombstones map[string]uint64, members map[string]string,
	cursors map[ingest.Stream]ingest.Cursor, dead map[string]uint64) []byte {
	b := binary.AppendUvarint(nil, applied)
	b = binary.AppendUvarint(b, uint64(len(workers)))
	for _, id := range slices.Sorted(maps.Keys(workers)) {
		w := workers[id]
		b = appendWorker(b, &w)
	}
	b = binary.AppendUvarint(b, uint64(len(tombstones)))
	for _, id := range slices.Sorted(maps.Keys(tombstones)) {
		b = binary.AppendUvarint(appendString(b, id), tombstones[id])
	}
	b = binary.AppendUvarint(b, uint64(len(members)))
	for _, id := range slices.Sorted(maps.Keys(members)) {
		b = appendString(appendString(b, id), members[id])
	}
	streams := slices.SortedFunc(maps.Keys(cursors), compareStreams)
	b = binary.AppendUvarint(b, uint64(len(streams)))
	for _, s := range streams {
		c := cursors[s]
		b = binary.AppendUvarint(appendString(b, s.Worker), uint64(s.DPRank))
		b = binary.AppendUvarint(binary.AppendUvarint(b, c.Seq), c.Epoch)
		b = binary.AppendUvarint(b, c.Fence)
	}
	b = binary.AppendUvarint(b, uint64(len(dead)))
	for _, id := range slices.Sorted(maps.Keys(dead)) {
		b = binary.AppendUvarint(appendString(b, id), dead[id])
	}
	return b
}

func compareStreams(a, b ingest.Stream) int {
	return cmp.Or(cmp.Compare(a.Worker, b.Worker), cmp.Compare(a.DPRank, b.DPRank))
}

// snapshotState is the part of a snapshot beside the index.
type snapshotState struct {
	applied    uint64
	workers    map[string]workerspec.Spec
	tombstones map[string]uint64
	members    map[string]string
	cursors    map[ingest.Stream]ingest.Cursor
	dead       map[string]uint64
}

// errSnapshotBehind: the snapshot's applied index is below the one readSnapshot
// was given; its index section was not read. A version 1 snapshot, which does
// not say what it applied, is never behind: keeping the state would leave out
// whatever it holds past the state, which raft, counting it installed, does not
// replay.
var errSnapshotBehind = errors.New("raftstore: snapshot older than the state")

// readSnapshot reads a snapshot, loading its index into ix, unless its applied
// index is known and below applied (errSnapshotBehind). On an error ix is unchanged
// (radix.Index.ReadFrom is all or nothing, and it is read last).
func readSnapshot(r io.Reader, ix *radix.Index, applied uint64) (snapshotState, error) {
	br := bufio.NewReaderSize(r, 1<<16)
	var st snapshotState
	magic := make([]byte, len(snapshotMagic))
	if _, err := io.ReadFull(br, magic); err != nil {
		return st, fmt.Errorf("%w: reading magic: %w", ErrCorruptSnapshot, err)
	}
	if string(magic) != snapshotMagic {
		return st, fmt.Errorf("%w: bad magic %q", ErrCorruptSnapshot, magic)
	}
	version, err := binary.ReadUvarint(br)
	if err != nil || version < 1 || version > snapshotVersion {
		return st, fmt.Errorf("%w: version %d (err %v), this node reads 1 to %d", ErrCorruptSnapshot, version, err, snapshotVersion)
	}
	n, err := binary.ReadUvarint(br)
	if err != nil || n > maxSnapshotState {
		return st, fmt.Errorf("%w: state length %d (err %v)", ErrCorruptSnapshot, n, err)
	}
	// Grow with what actually arrives rather than trusting n up front.
	var buf bytes.Buffer
	if _, err := io.CopyN(&buf, br, int64(n)+4); err != nil {
		return st, fmt.Errorf("%w: state section: %w", ErrCorruptSnapshot, err)
	}
	state := buf.Bytes()[:n]
	if got, want := binary.LittleEndian.Uint32(buf.Bytes()[n:]), crc32.Checksum(state, castagnoli); got != want {
		return st, fmt.Errorf("%w: state checksum %08x, computed %08x", ErrCorruptSnapshot, got, want)
	}
	st, err = decodeState(state, version)
	if err != nil {
		return st, err
	}
	if version >= 2 && st.applied < applied {
		return st, errSnapshotBehind
	}
	if _, err := ix.ReadFrom(br); err != nil {
		return st, fmt.Errorf("raftstore: index snapshot: %w", err)
	}
	return st, nil
}

func decodeState(data []byte, version uint64) (snapshotState, error) {
	d := entryDecoder{data: data}
	st := snapshotState{
		workers:    map[string]workerspec.Spec{},
		tombstones: map[string]uint64{},
		members:    map[string]string{},
		cursors:    map[ingest.Stream]ingest.Cursor{},
		dead:       map[string]uint64{},
	}
	if version >= 2 {
		st.applied = d.uvarint("applied index")
	}
	for i, n := 0, d.count(11, "worker", "count"); i < n && d.err == nil; i++ {
		w := d.worker()
		if _, dup := st.workers[w.ID]; dup && d.err == nil {
			d.fail("worker %q twice", w.ID)
		}
		st.workers[w.ID] = w
	}
	for i, n := 0, d.count(2, "tombstone", "count"); i < n && d.err == nil; i++ {
		st.tombstones[d.name("tombstone id")] = d.uvarint("tombstone index")
	}
	for i, n := 0, d.count(2, "member", "count"); i < n && d.err == nil; i++ {
		st.members[d.name("member id")] = d.str("member address")
	}
	for i, n := 0, d.count(5, "cursor", "count"); i < n && d.err == nil; i++ {
		s := ingest.Stream{Worker: d.name("cursor worker"), DPRank: d.uint32("cursor dp rank")}
		c := ingest.Cursor{Seq: d.uvarint("cursor seq"), Epoch: d.uvarint("cursor epoch")}
		if version >= 3 {
			c.Fence = d.uvarint("cursor fence")
		}
		st.cursors[s] = c
	}
	if version >= 3 {
		for i, n := 0, d.count(2, "dead worker", "count"); i < n && d.err == nil; i++ {
			st.dead[d.name("dead worker id")] = d.uvarint("dead worker index")
		}
	}
	if d.err == nil && len(d.data) > 0 {
		d.fail("%d trailing bytes in the state section", len(d.data))
	}
	if d.err == nil {
		// A name beyond the limits is a no-op in a log entry (DecodeEntry), but
		// no snapshot of ours can hold one: the snapshot is corrupt.
		d.err = d.refused
	}
	if d.err != nil {
		return snapshotState{}, fmt.Errorf("%w: %w", ErrCorruptSnapshot, d.err)
	}
	return st, nil
}
