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
// of the hash's mix (extendible hashing): a full shard below that size doubles,
// one at it splits in two, and only the directory of shards ever grows as a
// whole. So an insert rehashes at most one shard while the index's write lock
// is held, however many blocks the worker caches; doubling the whole table held
// it ~30 ms at 512k slots on a 2-vCPU guest, a worker with an offload tier can
// cache millions, and a restarted engine's table grows again from empty. The
// price is one more load per lookup (the directory entry): BenchmarkApply/fleet
// 3-7 % slower.
type blockTable struct {
	dir   []dirEntry // 1<<depth entries, indexed by the mix's top depth bits
	depth uint
	count int
	seed  uint64
}

// dirEntry names a shard and repeats its slots, so that a lookup goes from the
// directory to the slots without loading the shard.
type dirEntry struct {
	slots []blockSlot
	shard *blockShard
}

// blockShard holds the hashes whose mix starts with its depth-bit prefix; it
// fills 1<<(table depth - its depth) consecutive directory entries.
type blockShard struct {
	slots []blockSlot // a power of two long; the slot index is the mix's low bits
	count int
	depth uint
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
	s := &blockShard{slots: make([]blockSlot, 8)}
	return blockTable{dir: []dirEntry{{slots: s.slots, shard: s}}, seed: seed}
}

func (t *blockTable) mix(h uint64) uint64 {
	hi, lo := bits.Mul64(h^t.seed, 0x9E3779B97F4A7C15)
	return hi ^ lo
}

// entry returns the directory entry of a mixed hash (a shift by 64 is 0 in
// Go: depth 0 has one entry).
func (t *blockTable) entry(m uint64) *dirEntry { return &t.dir[m>>(64-t.depth)] }

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
		t.grow(s, m)
		s = t.entry(m).shard
	}
	if s.put(m, h, e) {
		t.count++
	}
}

// put places h in s, reporting whether it is new.
func (s *blockShard) put(m, h uint64, e entry) bool {
	mask := uint64(len(s.slots) - 1)
	i := m & mask
	for s.slots[i].node != 0 && s.slots[i].hash != h {
		i = (i + 1) & mask
	}
	added := s.slots[i].node == 0
	if added {
		s.count++
	}
	s.slots[i] = blockSlot{hash: h, entry: e}
	return added
}

// grow makes room in s, the shard of mixed hash m: it doubles a shard below
// maxShardSlots and splits one at it.
func (t *blockTable) grow(s *blockShard, m uint64) {
	if len(s.slots) < maxShardSlots {
		bigger := &blockShard{slots: make([]blockSlot, 2*len(s.slots)), depth: s.depth}
		t.refill(bigger, nil, s)
		t.replace(s, m, bigger, bigger)
		return
	}
	if s.depth == t.depth {
		dir := make([]dirEntry, 2*len(t.dir))
		for i := range dir {
			dir[i] = t.dir[i>>1]
		}
		t.dir, t.depth = dir, t.depth+1
	}
	low := &blockShard{slots: make([]blockSlot, len(s.slots)), depth: s.depth + 1}
	high := &blockShard{slots: make([]blockSlot, len(s.slots)), depth: s.depth + 1}
	t.refill(low, high, s)
	t.replace(s, m, low, high)
}

// refill moves from's entries to low, or to high when high is not nil and the
// bit below from's prefix is set.
func (t *blockTable) refill(low, high, from *blockShard) {
	split := uint64(1) << (63 - from.depth)
	for _, slot := range from.slots {
		if slot.node == 0 {
			continue
		}
		m := t.mix(slot.hash)
		if high != nil && m&split != 0 {
			high.put(m, slot.hash, slot.entry)
		} else {
			low.put(m, slot.hash, slot.entry)
		}
	}
}

// replace points the directory entries of old (the shard of mixed hash m) at
// low and high: the first half of them at low, the second at high.
func (t *blockTable) replace(old *blockShard, m uint64, low, high *blockShard) {
	span := uint64(1) << (t.depth - old.depth)
	first := m >> (64 - t.depth) &^ (span - 1)
	for i := range span {
		s := high
		if i < span/2 || span == 1 {
			s = low
		}
		t.dir[first+i] = dirEntry{slots: s.slots, shard: s}
	}
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

// shards yields each shard once.
func (t *blockTable) shards() iter.Seq[*blockShard] {
	return func(yield func(*blockShard) bool) {
		for i := 0; i < len(t.dir); i += 1 << (t.depth - t.dir[i].shard.depth) {
			if !yield(t.dir[i].shard) {
				return
			}
		}
	}
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
