package radix

import (
	"bufio"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math"
	"slices"
)

// Snapshot format, version 1. Integers are unsigned varints unless marked u64
// (8 bytes little-endian); positions number nodes in the order written, 0 being the
// super-root.
//
//	magic "kvixradx", version
//	workers: count, then per worker (ascending WorkerKey): name length, name, dp rank
//	nodes: count, then per node (depth-first pre-order, siblings by ascending key):
//	       distance back to the parent (own position - parent position, >= 1), key u64
//	       (nodes under the super-root are namespace roots, keyed by namespace id)
//	per worker, in the order above:
//	       blocks: count, then (ascending hash): hash u64, node position, tier mask byte
//	       detached: count, then (ascending hash): hash u64, parent hash u64, key u64, tier mask byte
//	CRC-32C (Castagnoli) of everything before it, 4 bytes little-endian
//
// Residencies are not written: they are the OR of each worker's block entries.
const (
	snapshotMagic   = "kvixradx"
	snapshotVersion = 1
	maxNameLen      = 1024
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// WriteTo writes a snapshot of the index (see ReadFrom): Snapshot().WriteTo(w).
// Writers wait only while the copy is taken; Match calls do not wait at all.
func (ix *Index) WriteTo(w io.Writer) (int64, error) {
	return ix.Snapshot().WriteTo(w)
}

// Snapshot is a consistent copy of an Index's content, taken by Index.Snapshot,
// that writes the snapshot the index would have written at that moment. Writing
// 1M nodes takes about a third of a second, sorting and encoding; a Snapshot
// holds the index's read lock only to copy the node arena's chunks and the
// workers' hash tables' shards (milliseconds), and writes from the copy with
// no lock. It costs about the memory of the node arena and the workers' tables
// until it is dropped. Its methods only read it: they may run concurrently.
type Snapshot struct {
	workers []snapshotWorker // by WorkerKey
	nodes   nodeArena        // only parent and key are read
}

type snapshotWorker struct {
	key      WorkerKey
	blocks   []blockSlot // the table's slots, empty ones included (copySlots)
	detached []detachedEntry
}

type detachedEntry struct {
	hash uint64
	detachedBlock
}

// Snapshot copies the index's content for writing it without blocking writers
// (see Snapshot). In a replicated state machine, take it on the apply goroutine,
// where it is consistent with the log position, and write it on another.
func (ix *Index) Snapshot() *Snapshot {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	st := &ix.st
	s := &Snapshot{nodes: st.nodes.clone(), workers: make([]snapshotWorker, len(st.order))}
	for i, wid := range st.order {
		ws := st.workers[wid]
		sw := &s.workers[i]
		sw.key = ws.key
		sw.blocks = ws.blocks.copySlots()
		if len(ws.detached) > 0 {
			sw.detached = make([]detachedEntry, 0, len(ws.detached))
			for h, d := range ws.detached {
				sw.detached = append(sw.detached, detachedEntry{hash: h, detachedBlock: d})
			}
		}
	}
	return s
}

// WriteTo writes the snapshot in the format ReadFrom reads.
func (s *Snapshot) WriteTo(w io.Writer) (int64, error) {
	e := encoder{w: bufio.NewWriterSize(w, 1<<16)}
	e.write([]byte(snapshotMagic))
	e.uvarint(snapshotVersion)
	e.uvarint(uint64(len(s.workers)))
	for _, sw := range s.workers {
		e.uvarint(uint64(len(sw.key.Worker)))
		e.write([]byte(sw.key.Worker))
		e.uvarint(uint64(sw.key.DPRank))
	}
	order, position := canonicalOrder(&s.nodes)
	e.uvarint(uint64(len(order) - 1))
	for i, n := range order[1:] {
		e.uvarint(uint64(i + 1 - int(position[s.nodes.at(n).parent])))
		e.u64(s.nodes.at(n).key)
	}
	var entries []blockSlot
	for _, sw := range s.workers {
		entries = entries[:0]
		for _, b := range sw.blocks {
			if b.node != 0 {
				entries = append(entries, b)
			}
		}
		slices.SortFunc(entries, func(a, b blockSlot) int { return cmp.Compare(a.hash, b.hash) })
		e.uvarint(uint64(len(entries)))
		for _, b := range entries {
			e.u64(b.hash)
			e.uvarint(uint64(position[b.node]))
			e.write([]byte{b.tiers})
		}
		detached := slices.SortedFunc(slices.Values(sw.detached), func(a, b detachedEntry) int { return cmp.Compare(a.hash, b.hash) })
		e.uvarint(uint64(len(detached)))
		for _, d := range detached {
			e.u64(d.hash)
			e.u64(d.parent)
			e.u64(d.key)
			e.write([]byte{d.tiers})
		}
	}
	crc := binary.LittleEndian.AppendUint32(nil, e.crc)
	e.write(crc)
	if e.err == nil {
		e.err = e.w.Flush()
	}
	return e.n, e.err
}

type encoder struct {
	w   *bufio.Writer
	crc uint32
	n   int64
	err error
	buf [binary.MaxVarintLen64]byte
}

func (e *encoder) write(b []byte) {
	if e.err != nil {
		return
	}
	e.crc = crc32.Update(e.crc, castagnoli, b)
	k, err := e.w.Write(b)
	e.n += int64(k)
	e.err = err
}

func (e *encoder) uvarint(v uint64) { e.write(binary.AppendUvarint(e.buf[:0], v)) }
func (e *encoder) u64(v uint64)     { e.write(binary.LittleEndian.AppendUint64(e.buf[:0], v)) }

// ReadFrom replaces the index content with a snapshot written by WriteTo. On any
// error (ErrCorruptSnapshot for bad or truncated input) the index is unchanged.
// When r is an io.ByteReader (e.g. *bufio.Reader) exactly the snapshot's bytes are
// consumed, so a snapshot can be embedded in a larger stream; otherwise r may be
// read past its end. Counters are kept: they describe this process, not the content.
func (ix *Index) ReadFrom(r io.Reader) (int64, error) {
	d := decoder{r: asByteReader(r)}
	st, err := d.readState(newState(ix.cfg))
	if err != nil {
		return d.n, err
	}
	ix.mu.Lock()
	defer ix.mu.Unlock()
	st.counters = ix.st.counters
	ix.st = st
	return d.n, nil
}

type byteReader interface {
	io.Reader
	io.ByteReader
}

func asByteReader(r io.Reader) byteReader {
	if br, ok := r.(byteReader); ok {
		return br
	}
	return bufio.NewReaderSize(r, 1<<16)
}

type decoder struct {
	r   byteReader
	n   int64
	crc uint32
	raw []byte // read but not yet in crc
	err error
	buf [8]byte
}

func (d *decoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: %s", ErrCorruptSnapshot, fmt.Sprintf(format, args...))
	}
}

func (d *decoder) readErr(err error) {
	if d.err != nil {
		return
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		d.err = fmt.Errorf("%w: truncated: %w", ErrCorruptSnapshot, io.ErrUnexpectedEOF)
	} else {
		d.err = fmt.Errorf("radix: reading snapshot: %w", err)
	}
}

func (d *decoder) sum(b []byte) {
	d.raw = append(d.raw, b...)
	if len(d.raw) >= 4096 {
		d.flushCRC()
	}
}

func (d *decoder) flushCRC() {
	d.crc = crc32.Update(d.crc, castagnoli, d.raw)
	d.raw = d.raw[:0]
}

// bytes reads k bytes (k <= len(d.buf) unless into is given).
func (d *decoder) bytes(into []byte) []byte {
	if d.err != nil {
		clear(into)
		return into
	}
	k, err := io.ReadFull(d.r, into)
	d.n += int64(k)
	if err != nil {
		d.readErr(err)
		clear(into)
		return into
	}
	d.sum(into)
	return into
}

func (d *decoder) u64() uint64 { return binary.LittleEndian.Uint64(d.bytes(d.buf[:8])) }
func (d *decoder) byte() byte  { return d.bytes(d.buf[:1])[0] }

func (d *decoder) uvarint() uint64 {
	var v uint64
	for shift := uint(0); shift < 64; shift += 7 {
		if d.err != nil {
			return 0
		}
		b, err := d.r.ReadByte()
		if err != nil {
			d.readErr(err)
			return 0
		}
		d.n++
		d.sum([]byte{b})
		if shift == 63 && b > 1 {
			break
		}
		v |= uint64(b&0x7f) << shift
		if b < 0x80 {
			return v
		}
	}
	d.fail("varint overflows 64 bits")
	return 0
}

// count reads a count or length and checks it against limit.
func (d *decoder) count(limit uint64, what string) int {
	v := d.uvarint()
	if v > limit {
		d.fail("%s %d exceeds %d", what, v, limit)
		return 0
	}
	return int(v)
}

func (d *decoder) readState(st state) (state, error) {
	if magic := d.bytes(make([]byte, len(snapshotMagic))); d.err == nil && string(magic) != snapshotMagic {
		d.fail("bad magic %q", magic)
	}
	if v := d.uvarint(); d.err == nil && v != snapshotVersion {
		d.fail("unsupported version %d (want %d)", v, snapshotVersion)
	}
	d.readWorkers(&st)
	d.readNodes(&st)
	for _, wid := range st.order {
		d.readEntries(&st, wid)
		if d.err != nil {
			break
		}
	}
	for i := 1; i < st.nodes.len() && d.err == nil; i++ {
		if n := st.nodes.at(uint32(i)); !n.held() && n.children == 0 {
			d.fail("node %d has neither holders nor children", i)
		}
	}
	d.flushCRC()
	want := d.crc
	if got := binary.LittleEndian.Uint32(d.bytes(d.buf[:4])); d.err == nil && got != want {
		d.fail("checksum %08x, computed %08x", got, want)
	}
	return st, d.err
}

func (d *decoder) readWorkers(st *state) {
	n := d.count(maxWorkers, "worker count")
	var prev WorkerKey
	for i := 0; i < n && d.err == nil; i++ {
		name := d.bytes(make([]byte, d.count(maxNameLen, "worker name length")))
		rank := d.uvarint()
		if rank > math.MaxUint32 {
			d.fail("dp rank %d", rank)
		}
		w := WorkerKey{Worker: string(name), DPRank: uint32(rank)}
		if i > 0 && prev.compare(w) >= 0 {
			d.fail("workers not in ascending order at %d", i)
		}
		if d.err != nil {
			return
		}
		if _, err := st.internWorker(w); err != nil {
			d.fail("%v", err)
		}
		prev = w
	}
}

func (d *decoder) readNodes(st *state) {
	n := d.count(math.MaxUint32-1, "node count")
	for i := 1; i <= n && d.err == nil; i++ {
		dist := d.uvarint()
		key := d.u64()
		if d.err == nil && (dist == 0 || dist > uint64(i)) {
			d.fail("node %d has its parent %d nodes back, not an earlier node", i, dist)
		}
		if d.err != nil {
			return
		}
		parent := uint32(uint64(i) - dist)
		if st.child(parent, key) != 0 {
			d.fail("node %d duplicates key %x under node %d", i, key, parent)
			return
		}
		st.childOrCreate(parent, key) // the arena is fresh: this is node i
	}
}

func (d *decoder) readEntries(st *state, wid uint32) {
	ws := st.workers[wid]
	var prev uint64
	n := d.count(math.MaxUint32, "block count")
	for i := 0; i < n && d.err == nil; i++ {
		h, pos, tiers := d.u64(), d.uvarint(), d.byte()
		switch {
		case d.err != nil:
		case i > 0 && h <= prev:
			d.fail("%v: block hashes not ascending at %d", ws.key, i)
		case pos == 0 || pos >= uint64(st.nodes.len()) || st.nodes.at(uint32(pos)).parent == 0:
			d.fail("%v: block %x at node %d, not a block node", ws.key, h, pos)
		case tiers == 0 || tiers >= 1<<NumTiers:
			d.fail("%v: block %x has tier mask %d", ws.key, h, tiers)
		default:
			st.addEntryTiers(wid, h, uint32(pos), tiers)
		}
		prev = h
	}
	n = d.count(math.MaxUint32, "detached count")
	for i := 0; i < n && d.err == nil; i++ {
		h, parent, key, tiers := d.u64(), d.u64(), d.u64(), d.byte()
		_, attached := ws.blocks.get(h)
		switch {
		case d.err != nil:
		case i > 0 && h <= prev:
			d.fail("%v: detached hashes not ascending at %d", ws.key, i)
		case tiers == 0 || tiers >= 1<<NumTiers:
			d.fail("%v: detached %x has tier mask %d", ws.key, h, tiers)
		case attached:
			d.fail("%v: %x both attached and detached", ws.key, h)
		default:
			st.addDetached(ws, h, parent, key, tiers)
		}
		prev = h
	}
	for p := range ws.waiting {
		if _, ok := ws.blocks.get(p); ok && d.err == nil {
			d.fail("%v: detached blocks wait for %x, which is attached", ws.key, p)
		}
	}
}
