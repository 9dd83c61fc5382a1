package raftstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/kvindex/kvindex/internal/ingest"
	"github.com/kvindex/kvindex/internal/radix"
	"github.com/kvindex/kvindex/internal/workerspec"
)

// Log entry format, version 1. Integers are unsigned varints unless marked u64
// (8 bytes little-endian); a string is a varint length and its bytes.
//
//	version byte (1)
//	type byte: EntryType in bits 0-6, bit 7 = ignorable
//	payload, by type:
//	  EntryStreamBatches: worker name table (count, strings), batch count, per batch:
//	      worker name index, dp rank, seq, epoch, flags byte (bit 0 = Reset),
//	      op count, per op: kind byte, then
//	        OpStored:  tier byte, namespace u64, has-parent byte (0/1), [parent u64],
//	                   hash count, hashes u64..., key count, keys u64...
//	        OpRemoved: tier byte, hash count, hashes u64...
//	        OpCleared: nothing
//	  EntryRegisterWorker: an workerspec.Spec: id, model, block size, dp size,
//	      events endpoint, topic, replay endpoint, HTTP endpoint, role, label count,
//	      (key, value)... with keys ascending
//	  EntryUnregisterWorker, EntryMemberRemoved, EntryWorkerDead, EntryWorkerAlive,
//	  EntryUnregisterFenced: id
//	  EntryReplaceWorker: the expected spec, then the new one (as in EntryRegisterWorker)
//	  EntryMemberAddr: id, gRPC address
//
// Nothing may follow the payload. Hash and key counts are written separately so
// that any StreamBatch ingest hands over is carried as it is: a length mismatch is
// refused by the Applier, deterministically, on every replica.
//
// Limits: a worker name, worker id or node id is 1..maxNameLen bytes, every other
// string at most maxStringLen. EncodeEntry refuses an entry that breaks them and
// DecodeEntry refuses one with ErrInvalidEntry (not ErrCorruptEntry) when its
// framing is intact: versions before the encoder checked ids and addresses wrote
// such entries (an unregister of an over-long id), and the FSM applies one as a
// no-op that fails, on every replica alike, instead of stopping on it.
const (
	entryVersion  = 1
	ignorableFlag = 0x80
	// maxNameLen is the longest worker name or node id accepted: the radix
	// snapshot refuses longer worker names, so the log must never carry one.
	maxNameLen = 1024
	// maxStringLen bounds every other string (endpoints, labels, addresses).
	maxStringLen = 64 << 10
)

// EntryType says what a log entry carries.
type EntryType uint8

// Entry types. Values are part of the log format: never renumber or reuse one.
const (
	EntryStreamBatches    EntryType = 1 // ingest.StreamBatches of one or more streams
	EntryRegisterWorker   EntryType = 2 // add a worker to the registry
	EntryUnregisterWorker EntryType = 3 // remove a worker, every block it holds and its cursors (older builds; now EntryUnregisterFenced)
	EntryMemberAddr       EntryType = 4 // a cluster member's gRPC address
	EntryMemberRemoved    EntryType = 5 // forget a member's gRPC address
	EntryReplaceWorker    EntryType = 6 // compare-and-set of a registered worker's spec
	EntryWorkerDead       EntryType = 7 // a worker's health endpoint failed: drop its blocks, fence its streams
	EntryWorkerAlive      EntryType = 8 // a dead worker's health endpoint answers again
	// EntryUnregisterFenced removes a worker and every block it holds, as
	// EntryUnregisterWorker did, but fences its streams' cursors instead of
	// deleting them (fsm.unregister says why). A new type, not a new meaning
	// of EntryUnregisterWorker, so that a member of an older build stops on it
	// rather than diverge, and logs written before it replay as they applied.
	EntryUnregisterFenced EntryType = 9
)

func (t EntryType) String() string {
	switch t {
	case EntryStreamBatches:
		return "stream-batches"
	case EntryRegisterWorker:
		return "register-worker"
	case EntryUnregisterWorker:
		return "unregister-worker"
	case EntryMemberAddr:
		return "member-addr"
	case EntryMemberRemoved:
		return "member-removed"
	case EntryReplaceWorker:
		return "replace-worker"
	case EntryWorkerDead:
		return "worker-dead"
	case EntryWorkerAlive:
		return "worker-alive"
	case EntryUnregisterFenced:
		return "unregister-worker-fenced"
	}
	return fmt.Sprintf("entry-type(%d)", uint8(t))
}

var (
	// ErrCorruptEntry: a log entry that is not valid in this format version.
	ErrCorruptEntry = errors.New("raftstore: corrupt log entry")
	// ErrUnknownEntryType: a log entry of a type this version does not know. When the
	// entry is marked ignorable it is skipped; otherwise the node cannot apply the
	// log any further (it was written by a newer version).
	ErrUnknownEntryType = errors.New("raftstore: unknown log entry type")
	// ErrInvalidBatch: a StreamBatch that cannot be written to the log (an unknown
	// op kind, an empty or over-long worker name).
	ErrInvalidBatch = errors.New("raftstore: invalid stream batch")
	// ErrInvalidEntry: an entry holding a value the log format's limits forbid
	// (an empty or over-long id, an over-long address). EncodeEntry refuses to
	// write one; DecodeEntry reports one already in the log, which the FSM
	// applies as a no-op that fails with this error.
	ErrInvalidEntry = errors.New("raftstore: entry breaks the log format's limits")
)

// Entry is one decoded log entry; which fields are set depends on Type.
type Entry struct {
	Type EntryType
	// Ignorable marks an entry that an older version not knowing Type may skip.
	Ignorable bool
	Batches   []ingest.StreamBatch // EntryStreamBatches
	Worker    workerspec.Spec      // EntryRegisterWorker, EntryReplaceWorker (the new spec)
	Expected  workerspec.Spec      // EntryReplaceWorker: the spec it replaces
	ID        string               // EntryUnregisterWorker, EntryUnregisterFenced, EntryMemberAddr, EntryMemberRemoved, EntryWorkerDead, EntryWorkerAlive
	GRPCAddr  string               // EntryMemberAddr
}

// EncodeEntry appends the encoding of e to dst (with the ignorable flag when
// e.Ignorable). It checks what DecodeEntry checks: EntryStreamBatches fails with
// ErrInvalidBatch for a batch the log cannot carry, EntryRegisterWorker and
// EntryReplaceWorker with ErrInvalidWorker, the others with ErrInvalidEntry.
func EncodeEntry(dst []byte, e *Entry) ([]byte, error) {
	start := len(dst)
	switch e.Type {
	case EntryStreamBatches:
		var be batchEncoder
		for i := range e.Batches {
			if err := be.add(&e.Batches[i]); err != nil {
				return dst, err
			}
		}
		dst = be.finish(dst)
	case EntryRegisterWorker:
		if err := checkWorker(&e.Worker); err != nil {
			return dst, err
		}
		dst = appendWorker(appendHeader(dst, e.Type), &e.Worker)
	case EntryReplaceWorker:
		for _, w := range []*workerspec.Spec{&e.Expected, &e.Worker} {
			if err := checkWorker(w); err != nil {
				return dst, err
			}
		}
		if e.Expected.ID != e.Worker.ID {
			return dst, fmt.Errorf("%w: replacing worker %q with %q: the id cannot change", ErrInvalidWorker, e.Expected.ID, e.Worker.ID)
		}
		dst = appendWorker(appendWorker(appendHeader(dst, e.Type), &e.Expected), &e.Worker)
	case EntryUnregisterWorker, EntryUnregisterFenced, EntryMemberRemoved, EntryWorkerDead, EntryWorkerAlive:
		if err := checkLen(e.Type, "id", e.ID, 1, maxNameLen); err != nil {
			return dst, err
		}
		dst = appendString(appendHeader(dst, e.Type), e.ID)
	case EntryMemberAddr:
		if err := errors.Join(checkLen(e.Type, "id", e.ID, 1, maxNameLen),
			checkLen(e.Type, "gRPC address", e.GRPCAddr, 0, maxStringLen)); err != nil {
			return dst, err
		}
		dst = appendString(appendHeader(dst, e.Type), e.ID)
		dst = appendString(dst, e.GRPCAddr)
	default:
		return dst, fmt.Errorf("%w: cannot encode %v", ErrUnknownEntryType, e.Type)
	}
	if e.Ignorable {
		dst[start+1] |= ignorableFlag
	}
	return dst, nil
}

// checkLen refuses a string of a t entry outside min..max bytes (the decoder's
// limits), with ErrInvalidEntry naming the field.
func checkLen(t EntryType, what, s string, lo, hi int) error {
	if len(s) < lo || len(s) > hi {
		return fmt.Errorf("%w: %v entry: %s of %d bytes (want %d..%d)", ErrInvalidEntry, t, what, len(s), lo, hi)
	}
	return nil
}

func appendHeader(dst []byte, t EntryType) []byte { return append(dst, entryVersion, byte(t)) }

func appendString(dst []byte, s string) []byte {
	return append(binary.AppendUvarint(dst, uint64(len(s))), s...)
}

// appendWorker encodes w, which checkWorker accepted.
func appendWorker(dst []byte, w *workerspec.Spec) []byte {
	dst = appendString(dst, w.ID)
	dst = appendString(dst, w.Model)
	dst = binary.AppendUvarint(dst, uint64(w.BlockSize))
	dst = binary.AppendUvarint(dst, uint64(w.DPSize))
	dst = appendString(dst, w.Endpoint)
	dst = appendString(dst, w.Topic)
	dst = appendString(dst, w.Replay)
	dst = appendString(dst, w.HTTP)
	dst = appendString(dst, w.Role)
	dst = binary.AppendUvarint(dst, uint64(len(w.Labels)))
	for _, k := range slices.Sorted(maps.Keys(w.Labels)) {
		dst = appendString(appendString(dst, k), w.Labels[k])
	}
	return dst
}

// batchEncoder builds an EntryStreamBatches entry one batch at a time: the proposer
// adds batches as Submit receives them and writes the entry when it is full or old
// enough. Worker names go to a table at the head of the entry, so a worker with
// many batches in one entry costs its name once.
type batchEncoder struct {
	names   map[string]uint64
	table   []byte // encoded names, in index order
	body    []byte // encoded batches
	batches int
	events  int // block events (see batchEvents)
}

// add encodes b; on error nothing of b is kept.
func (be *batchEncoder) add(b *ingest.StreamBatch) error {
	name := b.Stream.Worker
	if name == "" || len(name) > maxNameLen {
		return fmt.Errorf("%w: worker name of %d bytes (want 1..%d)", ErrInvalidBatch, len(name), maxNameLen)
	}
	mark := len(be.body)
	idx, known := be.names[name]
	if !known {
		idx = uint64(len(be.names))
	}
	be.body = binary.AppendUvarint(be.body, idx)
	be.body = binary.AppendUvarint(be.body, uint64(b.Stream.DPRank))
	be.body = binary.AppendUvarint(be.body, b.Seq)
	be.body = binary.AppendUvarint(be.body, b.Epoch)
	var flags byte
	if b.Reset {
		flags |= 1
	}
	be.body = append(be.body, flags)
	be.body = binary.AppendUvarint(be.body, uint64(len(b.Ops)))
	for i := range b.Ops {
		op := &b.Ops[i]
		be.body = append(be.body, byte(op.Kind))
		switch op.Kind {
		case ingest.OpStored:
			be.body = append(be.body, byte(op.Tier))
			be.body = binary.LittleEndian.AppendUint64(be.body, op.Namespace)
			if op.HasParent {
				be.body = append(be.body, 1)
				be.body = binary.LittleEndian.AppendUint64(be.body, op.Parent)
			} else {
				be.body = append(be.body, 0)
			}
			be.body = appendU64s(be.body, op.Hashes)
			be.body = appendU64s(be.body, op.Keys)
		case ingest.OpRemoved:
			be.body = append(be.body, byte(op.Tier))
			be.body = appendU64s(be.body, op.Hashes)
		case ingest.OpCleared:
		default:
			be.body = be.body[:mark]
			return fmt.Errorf("%w: stream %s/%d seq %d op %d has kind %d", ErrInvalidBatch, name, b.Stream.DPRank, b.Seq, i, op.Kind)
		}
	}
	if !known {
		if be.names == nil {
			be.names = map[string]uint64{}
		}
		be.names[name] = idx
		be.table = appendString(be.table, name)
	}
	be.batches++
	be.events += batchEvents(b)
	return nil
}

// batchEvents is the size of b in block events, the unit of MaxBatchEvents: one
// per block stored or removed, one per op that names no block.
func batchEvents(b *ingest.StreamBatch) int {
	n := 0
	for i := range b.Ops {
		n += max(len(b.Ops[i].Hashes), 1)
	}
	return max(n, 1)
}

func appendU64s(dst []byte, v []uint64) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(v)))
	for _, x := range v {
		dst = binary.LittleEndian.AppendUint64(dst, x)
	}
	return dst
}

// size is the length of the entry finish would write.
func (be *batchEncoder) size() int { return 2 + 2*binary.MaxVarintLen32 + len(be.table) + len(be.body) }

// finish appends the complete entry to dst.
func (be *batchEncoder) finish(dst []byte) []byte {
	dst = slices.Grow(dst, be.size())
	dst = appendHeader(dst, EntryStreamBatches)
	dst = binary.AppendUvarint(dst, uint64(len(be.names)))
	dst = append(dst, be.table...)
	dst = binary.AppendUvarint(dst, uint64(be.batches))
	return append(dst, be.body...)
}

func (be *batchEncoder) reset() {
	clear(be.names)
	be.table = be.table[:0]
	be.body = be.body[:0]
	be.batches, be.events = 0, 0
}

// DecodeEntry decodes one log entry. Errors wrap ErrCorruptEntry; or, for a type
// this version does not know, ErrUnknownEntryType with Type and Ignorable set in
// the returned Entry; or, for a well-formed entry holding a value beyond the
// format's limits (see EncodeEntry), ErrInvalidEntry with Type set. It never
// panics and allocates in proportion to data.
func DecodeEntry(data []byte) (Entry, error) { return decodeEntry(data, nil) }

// decodeScratch is memory that one goroutine (the FSM's apply goroutine)
// reuses to decode entry after entry: the slabs of one entry's lists, ops and
// batches are the next entry's, so a steady stream of stream-batches entries
// decodes without allocating them again (on three replicas in one process,
// re-allocating and clearing them was ~30 % of all bytes allocated and a share
// of the GC). What decodeEntry returns with a scratch is valid only until the
// next call with the same scratch.
type decodeScratch struct {
	words   []uint64
	ops     []ingest.Op
	batches []ingest.StreamBatch
}

// What a scratch keeps between entries is bounded (an entry needing more gets
// memory of its own): a u64 slab of 4 MiB, 32,768 ops and 16,384 batches
// (~3 MiB and ~1.5 MiB). A default entry (4,096 block events) needs about
// 64 KiB of words and at most 4,096 ops.
const (
	maxScratchWords   = 1 << 19
	maxScratchOps     = 1 << 15
	maxScratchBatches = 1 << 14
)

// decodeEntry is DecodeEntry, decoding a stream-batches entry into scratch's
// memory when scratch is not nil.
func decodeEntry(data []byte, scratch *decodeScratch) (Entry, error) {
	if len(data) < 2 {
		return Entry{}, fmt.Errorf("%w: %d bytes, shorter than the header", ErrCorruptEntry, len(data))
	}
	if data[0] != entryVersion {
		return Entry{}, fmt.Errorf("%w: format version %d (this node reads %d)", ErrUnknownEntryType, data[0], entryVersion)
	}
	e := Entry{Type: EntryType(data[1] &^ ignorableFlag), Ignorable: data[1]&ignorableFlag != 0}
	d := entryDecoder{data: data[2:], scratch: scratch}
	switch e.Type {
	case EntryStreamBatches:
		if scratch != nil {
			// len(d.data)/8 bounds every u64 list of the entry (see u64s).
			if words := len(d.data) / 8; cap(scratch.words) >= words {
				d.wordSlab = scratch.words[:words]
			} else if d.wordSlab = make([]uint64, words); words <= maxScratchWords {
				scratch.words = d.wordSlab
			}
			d.opSlab = scratch.ops[:cap(scratch.ops)]
		}
		e.Batches = d.batches()
		if scratch != nil && d.opsCut > cap(scratch.ops) && d.opsCut <= maxScratchOps {
			// The next entry of this size decodes its ops into one slab.
			scratch.ops = make([]ingest.Op, d.opsCut)
		}
	case EntryRegisterWorker:
		e.Worker = d.worker()
	case EntryReplaceWorker:
		e.Expected = d.worker()
		e.Worker = d.worker()
		if d.err == nil && e.Expected.ID != e.Worker.ID {
			d.refuse("replacing worker %.64q with %.64q", e.Expected.ID, e.Worker.ID)
		}
	case EntryUnregisterWorker, EntryUnregisterFenced, EntryMemberRemoved, EntryWorkerDead, EntryWorkerAlive:
		e.ID = d.name("id")
	case EntryMemberAddr:
		e.ID = d.name("id")
		e.GRPCAddr = d.str("gRPC address")
	default:
		return e, fmt.Errorf("%w: %v", ErrUnknownEntryType, e.Type)
	}
	if d.err == nil && len(d.data) > 0 {
		d.fail("%d trailing bytes", len(d.data))
	}
	if d.err == nil {
		d.err = d.refused
	}
	if d.err != nil {
		return Entry{Type: e.Type}, fmt.Errorf("%v entry: %w", e.Type, d.err)
	}
	return e, nil
}

// entryDecoder reads data from the front; after the first error every read
// returns zero values and the error is kept. A value beyond the format's limits
// is not an error of the framing: it is kept in refused and decoding goes on, so
// that such an entry is told apart from a corrupt one.
//
// The hash and key lists of a stream-batches entry are cut from one slab sized
// by the entry's remaining bytes (an upper bound: an entry of multi-block ops
// is mostly those lists, one of one-block ops about 2.3 times them), and the ops from a few slabs of
// doubling size: a handful of allocations per entry instead of up to three per
// op, on every replica's apply path (and none in the steady state when the
// caller passes a decodeScratch). The cut slices are capacity-capped, so
// appending to one cannot write into its neighbour; holding one keeps the whole
// entry's slab alive, so a consumer that keeps lists past the apply copies them
// (the change feed does).
type entryDecoder struct {
	data     []byte
	err      error       // ErrCorruptEntry
	refused  error       // ErrInvalidEntry
	wordSlab []uint64    // unused part of the u64 slab
	opSlab   []ingest.Op // unused part of the op slab
	opChunk  int         // size of the last op slab: each new one is twice as big
	opsCut   int         // ops cut from slabs so far
	scratch  *decodeScratch
}

func (d *entryDecoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: %s", ErrCorruptEntry, fmt.Sprintf(format, args...))
	}
}

func (d *entryDecoder) refuse(format string, args ...any) {
	if d.refused == nil {
		d.refused = fmt.Errorf("%w: %s", ErrInvalidEntry, fmt.Sprintf(format, args...))
	}
}

func (d *entryDecoder) uvarint(what string) uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.data)
	if n <= 0 {
		d.fail("bad or truncated varint (%s)", what)
		return 0
	}
	d.data = d.data[n:]
	return v
}

// count reads a count of items of at least minSize bytes each, bounded by
// what is left; its error names it as what and unit ("hash", "count"), two
// strings that are joined only for an error (joining them on every call
// allocated ~5 times per stream batch on the apply path).
func (d *entryDecoder) count(minSize int, what, unit string) int {
	v := d.uvarint(what)
	if d.err == nil && v > uint64(len(d.data)/minSize) {
		d.fail("%s %s %d exceeds the %d bytes left", what, unit, v, len(d.data))
		return 0
	}
	return int(v)
}

func (d *entryDecoder) uint32(what string) uint32 {
	v := d.uvarint(what)
	if v > 1<<32-1 {
		d.fail("%s %d overflows 32 bits", what, v)
		return 0
	}
	return uint32(v)
}

func (d *entryDecoder) byte(what string) byte {
	if d.err != nil {
		return 0
	}
	if len(d.data) < 1 {
		d.fail("truncated (%s)", what)
		return 0
	}
	b := d.data[0]
	d.data = d.data[1:]
	return b
}

func (d *entryDecoder) u64(what string) uint64 {
	if d.err != nil {
		return 0
	}
	if len(d.data) < 8 {
		d.fail("truncated (%s)", what)
		return 0
	}
	v := binary.LittleEndian.Uint64(d.data)
	d.data = d.data[8:]
	return v
}

func (d *entryDecoder) u64s(what string) []uint64 {
	n := d.count(8, what, "count")
	if d.err != nil || n == 0 {
		return nil
	}
	if len(d.wordSlab) < n {
		// len(d.data)/8 bounds every u64 list still to come in this entry (and
		// count checked that n is within it).
		d.wordSlab = make([]uint64, len(d.data)/8)
	}
	v := d.wordSlab[:n:n]
	d.wordSlab = d.wordSlab[n:]
	for i := range v {
		v[i] = binary.LittleEndian.Uint64(d.data[8*i:])
	}
	d.data = d.data[8*n:]
	return v
}

func (d *entryDecoder) strLimit(limit int, what string) string {
	n := d.count(1, what, "length")
	if d.err != nil {
		return ""
	}
	if n > limit {
		d.refuse("%s of %d bytes exceeds %d", what, n, limit)
	}
	s := string(d.data[:n])
	d.data = d.data[n:]
	return s
}

func (d *entryDecoder) str(what string) string { return d.strLimit(maxStringLen, what) }

// name reads a worker name or node id: non-empty and at most maxNameLen bytes.
func (d *entryDecoder) name(what string) string {
	s := d.strLimit(maxNameLen, what)
	if d.err == nil && s == "" {
		d.refuse("empty %s", what)
	}
	return s
}

func (d *entryDecoder) batches() []ingest.StreamBatch {
	names := make([]string, d.count(2, "worker", "count"))
	for i := range names {
		names[i] = d.name("worker name")
	}
	n := d.count(6, "batch", "count")
	var out []ingest.StreamBatch
	if d.scratch != nil && n > 0 && cap(d.scratch.batches) >= n {
		out = d.scratch.batches[:n]
	} else {
		out = make([]ingest.StreamBatch, n)
		if d.scratch != nil && n <= maxScratchBatches {
			d.scratch.batches = out
		}
	}
	for i := range out {
		b := &out[i]
		*b = ingest.StreamBatch{} // a scratch's batch holds the last entry's
		idx := d.uvarint("worker index")
		if d.err == nil && idx >= uint64(len(names)) {
			d.fail("batch %d names worker %d of %d", i, idx, len(names))
		}
		if d.err != nil {
			return nil
		}
		b.Stream = ingest.Stream{Worker: names[idx], DPRank: d.uint32("dp rank")}
		b.Seq = d.uvarint("seq")
		b.Epoch = d.uvarint("epoch")
		switch flags := d.byte("flags"); flags {
		case 0:
		case 1:
			b.Reset = true
		default:
			d.fail("batch %d has unknown flags %#x", i, flags)
		}
		b.Ops = d.ops()
	}
	if d.err != nil {
		return nil
	}
	return out
}

func (d *entryDecoder) ops() []ingest.Op {
	n := d.count(1, "op", "count")
	if d.err != nil || n == 0 {
		return nil
	}
	if len(d.opSlab) < n {
		// Doubling chunks: at most about twice the ops the entry holds.
		d.opChunk = max(n, 2*d.opChunk, 16)
		d.opSlab = make([]ingest.Op, d.opChunk)
	}
	ops := d.opSlab[:n:n]
	d.opSlab = d.opSlab[n:]
	d.opsCut += n
	for i := range ops {
		op := &ops[i]
		*op = ingest.Op{Kind: ingest.OpKind(d.byte("op kind"))} // a scratch's op holds the last entry's
		switch op.Kind {
		case ingest.OpStored:
			op.Tier = radix.Tier(d.byte("tier"))
			op.Namespace = d.u64("namespace")
			switch hp := d.byte("has parent"); hp {
			case 0:
			case 1:
				op.HasParent = true
				op.Parent = d.u64("parent")
			default:
				d.fail("has-parent byte %d", hp)
			}
			op.Hashes = d.u64s("hash")
			op.Keys = d.u64s("key")
		case ingest.OpRemoved:
			op.Tier = radix.Tier(d.byte("tier"))
			op.Hashes = d.u64s("hash")
		case ingest.OpCleared:
		default:
			d.fail("op kind %d", op.Kind)
		}
		if d.err != nil {
			return nil
		}
	}
	return ops
}

func (d *entryDecoder) worker() workerspec.Spec {
	w := workerspec.Spec{
		ID:        d.name("worker id"),
		Model:     d.str("model"),
		BlockSize: int(d.uint32("block size")),
		DPSize:    int(d.uint32("dp size")),
		Endpoint:  d.str("events endpoint"),
		Topic:     d.str("events topic"),
		Replay:    d.str("replay endpoint"),
		HTTP:      d.str("HTTP endpoint"),
		Role:      d.str("role"),
	}
	n := d.count(2, "label", "count")
	if n > 0 {
		w.Labels = make(map[string]string, n)
	}
	prev := ""
	for i := 0; i < n && d.err == nil; i++ {
		k, v := d.str("label key"), d.str("label value")
		if d.err == nil && i > 0 && k <= prev {
			d.fail("label keys not ascending at %d", i)
		}
		w.Labels[k] = v
		prev = k
	}
	return w
}
