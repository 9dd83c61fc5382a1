package radix

import (
	"iter"
	"math/bits"
)

// blockTable maps a worker's engine hashes to their entries: open addressing with
// linear probing and backward-shift deletion. Go maps leave tombstones on delete;
// under an engine's eviction churn (every hash inserted once, deleted later) they
// pile up until lookups probe long runs, which made a map lookup cost ~200 ns in
// BenchmarkApply. Without tombstones a probe run only ever holds live entries.
//
// The table is split into shards of at most maxShardSlots slots by the top bits
// of the hash's mix (shardDir): an insert rehashes at most one shard while the
// index's write lock is held, however many blocks the worker caches. Doubling
// the whole table held it ~30 ms at 512k slots on a 2-vCPU guest, a worker with
// an offload tier can cache millions, and a restarted engine's table grows
// again from empty. The price is one more load per lookup (the directory
// entry): BenchmarkApply/fleet 3-7 % slower. A slot's index in its shard is the
// mix's low bits.
type blockTable struct {
	shardDir[blockSlot]
	count int
	seed  uint64
}

// maxShardSlots is the size at which a shard splits instead of doubling: 8k
// slots are 128 KiB, split in well under a millisecond. (32k-slot shards took
// ~4 ms to split on a 2-vCPU guest; the lookup costs the same at any size.)
const maxShardSlots = 1 << 13

// blockSlot is empty when entry.node is 0 (node 0, the super-root, holds no block).
type blockSlot struct {
	hash uint64
	entry
}

func newBlockTable(seed uint64) blockTable {
	return blockTable{shardDir: newShardDir[blockSlot](8), seed: seed}
}

func (t *blockTable) mix(h uint64) uint64 {
	hi, lo := bits.Mul64(h^t.seed, 0x9E3779B97F4A7C15)
	return hi ^ lo
}

// peek reads h's home slot (see state.prefetch).
func (t *blockTable) peek(h uint64) uint64 {
	m := t.mix(h)
	slots := t.entry(m).slots
	return slots[m&uint64(len(slots)-1)].hash
}

func (t *blockTable) get(h uint64) (entry, bool) {
	m := t.mix(h)
	slots := t.entry(m).slots
	mask := uint64(len(slots) - 1)
	for i := m & mask; ; i = (i + 1) & mask {
		slot := &slots[i]
		if slot.node == 0 {
			return entry{}, false
		}
		if slot.hash == h {
			return slot.entry, true
		}
	}
}

// set inserts or replaces h's entry; e.node must not be 0.
func (t *blockTable) set(h uint64, e entry) {
	m := t.mix(h)
	s := t.entry(m).shard
	if (s.count+1)*4 > len(s.slots)*3 {
		t.grow(s, m, maxShardSlots, t.slotMix, putBlock)
		s = t.entry(m).shard
	}
	before := s.count
	putBlock(s, m, blockSlot{hash: h, entry: e})
	t.count += s.count - before
}

// slotMix is a slot's mixed hash, false for an empty slot (for shardDir.grow).
func (t *blockTable) slotMix(slot blockSlot) (uint64, bool) {
	return t.mix(slot.hash), slot.node != 0
}

// putBlock places slot, whose hash's mix is m, in s, replacing the slot of
// the same hash.
func putBlock(s *shard[blockSlot], m uint64, slot blockSlot) {
	h := slot.hash
	mask := uint64(len(s.slots) - 1)
	i := m & mask
	for s.slots[i].node != 0 && s.slots[i].hash != h {
		i = (i + 1) & mask
	}
	if s.slots[i].node == 0 {
		s.count++
	}
	s.slots[i] = slot
}

func (t *blockTable) delete(h uint64) {
	m := t.mix(h)
	s := t.entry(m).shard
	mask := uint64(len(s.slots) - 1)
	i := m & mask
	for s.slots[i].hash != h || s.slots[i].node == 0 {
		if s.slots[i].node == 0 {
			return
		}
		i = (i + 1) & mask
	}
	// Backward shift, as in edgeTable.remove.
	for j := (i + 1) & mask; s.slots[j].node != 0; j = (j + 1) & mask {
		if (j-t.mix(s.slots[j].hash))&mask >= (j-i)&mask {
			s.slots[i] = s.slots[j]
			i = j
		}
	}
	s.slots[i] = blockSlot{}
	s.count--
	t.count--
}

// all yields every entry, in no particular order; the loop must not modify t.
func (t *blockTable) all() iter.Seq2[uint64, entry] {
	return func(yield func(uint64, entry) bool) {
		for s := range t.shards() {
			for _, slot := range s.slots {
				if slot.node != 0 && !yield(slot.hash, slot.entry) {
					return
				}
			}
		}
	}
}

// copySlots copies every shard's slots, empty ones included: the table's
// content, copied as fast as memory moves.
func (t *blockTable) copySlots() []blockSlot {
	n := 0
	for s := range t.shards() {
		n += len(s.slots)
	}
	dst := make([]blockSlot, 0, n)
	for s := range t.shards() {
		dst = append(dst, s.slots...)
	}
	return dst
}
