package radix

import "math/bits"

// edgeTable maps (parent node, key) to the child node: open addressing with linear
// probing and backward-shift deletion. A slot is tag<<32 | child, where tag is the
// top 32 bits of the edge's hash; 0 is an empty slot (node 0 is never a child).
// The key itself lives in the child node, which a lookup reads anyway: 8 bytes a
// slot instead of a 24-byte map entry.
//
// Like blockTable, the table is split into shards by the hash's top bits
// (shardDir), so that growing rehashes one shard of at most maxEdgeShardSlots,
// never the whole table, under the index's write lock. A shard's slot index is
// the tag's low bits, so the directory (the top bits) and the slot are both
// recomputed from the tag alone when growing, splitting or shifting; they
// overlap only past 2^19 shards, billions of edges, where the shards would fill
// unevenly but stay correct.
type edgeTable struct {
	shardDir[uint64]
	count int // occupied slots
	seed  uint64
}

const (
	minEdgeSlots      = 16
	maxEdgeShardSlots = 1 << 13 // 64 KiB: split in well under a millisecond
)

func newEdgeTable(seed uint64) edgeTable {
	return edgeTable{shardDir: newShardDir[uint64](minEdgeSlots), seed: seed}
}

func (t *edgeTable) hash(parent uint32, key uint64) uint64 {
	// An odd multiplier per parent: 2·parent (even) XOR an odd constant.
	hi, lo := bits.Mul64(key^t.seed, uint64(parent)<<1^0x9E3779B97F4A7C15)
	return hi ^ lo
}

// edgeHome is slot s's (or hash h's: the tag is its top bits) home in slots.
func edgeHome(s uint64, slots []uint64) uint64 { return s >> 32 & uint64(len(slots)-1) }

// peek reads the edge's home slot (see state.prefetch).
func (t *edgeTable) peek(parent uint32, key uint64) uint64 {
	h := t.hash(parent, key)
	slots := t.entry(h).slots
	return slots[edgeHome(h, slots)]
}

// find returns the child of parent with key, or 0.
func (t *edgeTable) find(nodes *nodeArena, parent uint32, key uint64) uint32 {
	h := t.hash(parent, key)
	tag := h >> 32
	slots := t.entry(h).slots
	mask := uint64(len(slots) - 1)
	for i := edgeHome(h, slots); ; i = (i + 1) & mask {
		s := slots[i]
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
	h := t.hash(parent, key)
	s := t.entry(h).shard
	if (s.count+1)*4 > len(s.slots)*3 {
		t.grow(s, h, maxEdgeShardSlots, edgeSlotMix, placeEdge)
		s = t.entry(h).shard
	}
	placeEdge(s, h, h>>32<<32|uint64(child))
	t.count++
}

// edgeSlotMix is a slot's hash as far as the directory needs it (its top bits
// are the tag's), false for an empty slot (for shardDir.grow).
func edgeSlotMix(slot uint64) (uint64, bool) { return slot, slot != 0 }

// placeEdge puts slot in s (h, its hash, is unused: the tag holds what the
// home needs).
func placeEdge(s *shard[uint64], _ uint64, slot uint64) {
	mask := uint64(len(s.slots) - 1)
	i := edgeHome(slot, s.slots)
	for s.slots[i] != 0 {
		i = (i + 1) & mask
	}
	s.slots[i] = slot
	s.count++
}

// remove deletes the edge to child; it must be present.
func (t *edgeTable) remove(parent uint32, key uint64, child uint32) {
	h := t.hash(parent, key)
	s := t.entry(h).shard
	mask := uint64(len(s.slots) - 1)
	i := edgeHome(h, s.slots)
	for uint32(s.slots[i]) != child {
		i = (i + 1) & mask
	}
	// Backward shift: pull later entries of the probe run into the hole when their
	// home slot does not lie cyclically in (hole, j].
	for j := (i + 1) & mask; s.slots[j] != 0; j = (j + 1) & mask {
		if (j-edgeHome(s.slots[j], s.slots))&mask >= (j-i)&mask {
			s.slots[i] = s.slots[j]
			i = j
		}
	}
	s.slots[i] = 0
	s.count--
	t.count--
}
