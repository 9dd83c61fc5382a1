package radix

import "math/bits"

// edgeTable maps (parent node, key) to the child node: open addressing with linear
// probing and backward-shift deletion. A slot is tag<<32 | child, where tag is the
// top 32 bits of the edge's hash; 0 is an empty slot (node 0 is never a child).
// The slot index is the top log2(len) bits of the hash, so it can be recomputed
// from the tag alone when growing or shifting. The key itself lives in the child
// node, which a lookup reads anyway: 8 bytes a slot instead of a 24-byte map entry.
type edgeTable struct {
	slots []uint64
	shift uint // 64 - log2(len(slots))
	count int  // occupied slots
	seed  uint64
}

const minEdgeSlots = 16

func newEdgeTable(seed uint64) edgeTable {
	return edgeTable{
		slots: make([]uint64, minEdgeSlots),
		shift: 64 - 4,
		seed:  seed,
	}
}

func (t *edgeTable) hash(parent uint32, key uint64) uint64 {
	hi, lo := bits.Mul64(key^t.seed, uint64(parent)<<1|1^0x9E3779B97F4A7C15)
	return hi ^ lo
}

// peek reads the edge's home slot (see state.prefetch).
func (t *edgeTable) peek(parent uint32, key uint64) uint64 {
	return t.slots[t.hash(parent, key)>>t.shift]
}

// find returns the child of parent with key, or 0.
func (t *edgeTable) find(nodes *nodeArena, parent uint32, key uint64) uint32 {
	h := t.hash(parent, key)
	tag := h >> 32
	mask := uint64(len(t.slots) - 1)
	for i := h >> t.shift; ; i = (i + 1) & mask {
		s := t.slots[i]
		if s == 0 {
			return 0
		}
		if s>>32 == tag {
			c := uint32(s)
			if n := nodes.at(c); n.key == key && n.parent == parent {
				return c
			}
		}
	}
}

// insert adds the edge; the caller knows it is absent.
func (t *edgeTable) insert(parent uint32, key uint64, child uint32) {
	if (t.count+1)*4 > len(t.slots)*3 {
		t.grow()
	}
	h := t.hash(parent, key)
	t.place(h>>32<<32 | uint64(child))
	t.count++
}

func (t *edgeTable) place(s uint64) {
	mask := uint64(len(t.slots) - 1)
	i := s >> t.shift // the tag holds the hash's top bits
	for t.slots[i] != 0 {
		i = (i + 1) & mask
	}
	t.slots[i] = s
}

func (t *edgeTable) grow() {
	old := t.slots
	t.slots = make([]uint64, 2*len(old))
	t.shift--
	for _, s := range old {
		if s != 0 {
			t.place(s)
		}
	}
}

// remove deletes the edge to child; it must be present.
func (t *edgeTable) remove(parent uint32, key uint64, child uint32) {
	mask := uint64(len(t.slots) - 1)
	i := t.hash(parent, key) >> t.shift
	for uint32(t.slots[i]) != child {
		i = (i + 1) & mask
	}
	// Backward shift: pull later entries of the probe run into the hole when their
	// home slot does not lie cyclically in (hole, j].
	for j := (i + 1) & mask; t.slots[j] != 0; j = (j + 1) & mask {
		home := t.slots[j] >> t.shift
		if (j-home)&mask >= (j-i)&mask {
			t.slots[i] = t.slots[j]
			i = j
		}
	}
	t.slots[i] = 0
	t.count--
}
