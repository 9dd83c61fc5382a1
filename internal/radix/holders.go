package radix

import (
	"bytes"
	"slices"
	"unsafe"
)

// A node's holders (the workers holding its block, with their tier masks) take
// one of two forms, sorted by worker id in both.
//
// Inline, up to two: node.holders are residencies, worker id << 3 | tier mask,
// filled from the front, 0 marking a free slot. Most nodes have one holder, and
// a write touches nothing but the node.
//
// Spilled, three and more: node.more indexes a holderSet in state.sets that holds
// them all, and node.holders are 0. The worker ids sit in one array and the tier
// masks in bit planes, so that Match compares the workers of two nodes with one
// memequal over the ids and counts the fastest tiers of 64 holders with a few
// word operations (see match.go); a residency-per-holder list costs a table
// lookup per two holders, which was most of a Match over many holders.

// holderSet is the holder list of a spilled node.
type holderSet struct {
	ids []uint32 // worker ids, ascending
	// planes holds the tier masks of the holders by position, 64 positions a word
	// group: bit i of planes[NumTiers*j+t] is set when holder 64j+i holds the node
	// on tier t. Bits beyond len(ids) are 0.
	planes []uint64
}

// planeGroups is how many word groups n holders take.
func planeGroups(n int) int { return (n + 63) / 64 }

// held reports whether the node has any holder.
func (nd *node) held() bool { return nd.holders[0] != 0 || nd.more != 0 }

func residency(wid uint32, mask uint8) uint32 { return wid<<3 | uint32(mask) }

// mask returns the tier mask of holder i.
func (s *holderSet) mask(i int) uint8 {
	p, b := s.planes[NumTiers*(i/64):][:NumTiers], uint(i%64)
	return uint8(p[0]>>b&1 | p[1]>>b&1<<1 | p[2]>>b&1<<2)
}

// setMask sets the tier mask of holder i.
func (s *holderSet) setMask(i int, mask uint8) {
	p, b := s.planes[NumTiers*(i/64):][:NumTiers], uint(i%64)
	for t := range p {
		p[t] = p[t]&^(1<<b) | uint64(mask>>t&1)<<b
	}
}

// insert puts worker wid with mask at position i, moving the holders from i on
// one position up.
func (s *holderSet) insert(i int, wid uint32, mask uint8) {
	s.ids = slices.Insert(s.ids, i, wid)
	if planeGroups(len(s.ids)) > len(s.planes)/NumTiers {
		s.planes = append(s.planes, make([]uint64, NumTiers)...)
	}
	for t := range NumTiers {
		keep := uint64(1)<<(i%64) - 1 // the bits below i stay
		var carry uint64
		for k := NumTiers*(i/64) + t; k < len(s.planes); k += NumTiers {
			w := s.planes[k]
			s.planes[k] = (w&^keep)<<1 | w&keep | carry
			carry, keep = w>>63, 0
		}
	}
	s.setMask(i, mask)
}

// delete removes the holder at position i, moving the later ones down.
func (s *holderSet) delete(i int) {
	s.ids = slices.Delete(s.ids, i, i+1)
	for t := range NumTiers {
		keep := uint64(1)<<(i%64) - 1
		for k := NumTiers*(i/64) + t; k < len(s.planes); k += NumTiers {
			var next uint64
			if k+NumTiers < len(s.planes) {
				next = s.planes[k+NumTiers] & 1
			}
			w := s.planes[k]
			s.planes[k] = w&keep | w>>1&^keep | next<<63
			keep = 0
		}
	}
	s.planes = s.planes[:NumTiers*planeGroups(len(s.ids))]
}

// holderMask returns worker wid's tier mask at node n (0 = not held).
func (st *state) holderMask(n, wid uint32) uint8 {
	nd := st.nodes.at(n)
	if nd.more != 0 {
		s := &st.sets[nd.more]
		if i, found := slices.BinarySearch(s.ids, wid); found {
			return s.mask(i)
		}
		return 0
	}
	for _, r := range nd.holders {
		if r != 0 && r>>3 == wid {
			return uint8(r & 7)
		}
	}
	return 0
}

// setHolder sets worker wid's tier mask at node n; mask 0 removes the worker and
// releases n if nothing else keeps it.
func (st *state) setHolder(n, wid uint32, mask uint8) {
	nd := st.nodes.at(n)
	if nd.more != 0 {
		st.setSpilled(n, wid, mask)
		return
	}
	h := &nd.holders
	pos, found := 0, false
	for ; pos < 2 && h[pos] != 0; pos++ {
		if w := h[pos] >> 3; w >= wid {
			found = w == wid
			break
		}
	}
	switch {
	case found && mask != 0:
		h[pos] = residency(wid, mask)
	case found:
		if pos == 0 {
			h[0] = h[1]
		}
		h[1] = 0
		st.residencies--
		st.release(n)
	case mask == 0: // not a holder, and nothing to remove
	case h[1] == 0: // a free slot
		if pos == 0 {
			h[1] = h[0]
		}
		h[pos] = residency(wid, mask)
		st.residencies++
	default:
		st.spill(nd, pos, wid, mask)
		st.residencies++
	}
}

// spill moves nd's two inline holders into a holder set, with worker wid
// inserted at position pos.
func (st *state) spill(nd *node, pos int, wid uint32, mask uint8) {
	if k := len(st.freeSets); k > 0 {
		nd.more = st.freeSets[k-1]
		st.freeSets = st.freeSets[:k-1]
	} else {
		nd.more = uint32(len(st.sets))
		st.sets = append(st.sets, holderSet{})
	}
	s := &st.sets[nd.more] // a freed set keeps its slices' capacity for reuse
	s.ids = slices.Grow(s.ids[:0], 4)
	s.planes = append(s.planes[:0], make([]uint64, NumTiers)...)
	for i, r := range nd.holders {
		s.ids = append(s.ids, r>>3)
		s.setMask(i, uint8(r&7))
	}
	s.insert(pos, wid, mask)
	nd.holders = [2]uint32{}
}

// setSpilled is setHolder for a spilled node; a set left with two holders goes
// back inline.
func (st *state) setSpilled(n, wid uint32, mask uint8) {
	nd := st.nodes.at(n)
	s := &st.sets[nd.more]
	i, found := slices.BinarySearch(s.ids, wid)
	switch {
	case found && mask != 0:
		s.setMask(i, mask)
	case found:
		s.delete(i)
		st.residencies--
		if len(s.ids) == 2 {
			nd.holders = [2]uint32{residency(s.ids[0], s.mask(0)), residency(s.ids[1], s.mask(1))}
			// Freed, keeping its capacity: a node whose holders go back and
			// forth between two and three would otherwise allocate twice a trip,
			// on the apply path.
			s.ids, s.planes = s.ids[:0], s.planes[:0]
			st.freeSets = append(st.freeSets, nd.more)
			nd.more = 0
		}
	case mask != 0:
		s.insert(i, wid, mask)
		st.residencies++
	}
}

// sameIDs reports whether two holder sets have the same workers, as one
// vectorised memequal (a per-element loop would cost most of a Match).
func sameIDs(a, b []uint32) bool {
	return len(a) == len(b) && bytes.Equal(asBytes(a), asBytes(b))
}

// asBytes views worker ids as bytes.
func asBytes(s []uint32) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), 4*len(s))
}
