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
type blockTable struct {
	slots []blockSlot // len is 0 or a power of two
	shift uint        // 64 - log2(len(slots))
	count int
	seed  uint64
}

// blockSlot is empty when entry.node is 0 (node 0, the super-root, holds no block).
type blockSlot struct {
	hash uint64
	entry
}

func newBlockTable(seed uint64) blockTable { return blockTable{seed: seed} }

func (t *blockTable) home(h uint64) uint64 {
	hi, lo := bits.Mul64(h^t.seed, 0x9E3779B97F4A7C15)
	return (hi ^ lo) >> t.shift
}

// peek reads h's home slot (see state.prefetch).
func (t *blockTable) peek(h uint64) uint64 {
	if t.count == 0 {
		return 0
	}
	return t.slots[t.home(h)].hash
}

func (t *blockTable) get(h uint64) (entry, bool) {
	if t.count == 0 {
		return entry{}, false
	}
	mask := uint64(len(t.slots) - 1)
	for i := t.home(h); ; i = (i + 1) & mask {
		s := &t.slots[i]
		if s.node == 0 {
			return entry{}, false
		}
		if s.hash == h {
			return s.entry, true
		}
	}
}

// set inserts or replaces h's entry; e.node must not be 0.
func (t *blockTable) set(h uint64, e entry) {
	if (t.count+1)*4 > len(t.slots)*3 {
		t.grow()
	}
	mask := uint64(len(t.slots) - 1)
	i := t.home(h)
	for t.slots[i].node != 0 && t.slots[i].hash != h {
		i = (i + 1) & mask
	}
	if t.slots[i].node == 0 {
		t.count++
	}
	t.slots[i] = blockSlot{hash: h, entry: e}
}

func (t *blockTable) grow() {
	old := t.slots
	n := max(8, 2*len(old))
	t.slots = make([]blockSlot, n)
	t.shift = uint(64 - bits.TrailingZeros(uint(n)))
	t.count = 0
	for _, s := range old {
		if s.node != 0 {
			t.set(s.hash, s.entry)
		}
	}
}

func (t *blockTable) delete(h uint64) {
	if t.count == 0 {
		return
	}
	mask := uint64(len(t.slots) - 1)
	i := t.home(h)
	for t.slots[i].hash != h || t.slots[i].node == 0 {
		if t.slots[i].node == 0 {
			return
		}
		i = (i + 1) & mask
	}
	// Backward shift, as in edgeTable.remove.
	for j := (i + 1) & mask; t.slots[j].node != 0; j = (j + 1) & mask {
		if (j-t.home(t.slots[j].hash))&mask >= (j-i)&mask {
			t.slots[i] = t.slots[j]
			i = j
		}
	}
	t.slots[i] = blockSlot{}
	t.count--
}

// all yields every entry, in no particular order; the loop must not modify t.
func (t *blockTable) all() iter.Seq2[uint64, entry] {
	return func(yield func(uint64, entry) bool) {
		for _, s := range t.slots {
			if s.node != 0 && !yield(s.hash, s.entry) {
				return
			}
		}
	}
}
