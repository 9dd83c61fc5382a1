package radix

import (
	"bytes"
	"hash/maphash"
	"unsafe"
)

// state is the index proper: single-threaded, guarded by Index.mu.
//
// The tree lives in an arena of nodes addressed by uint32. Node 0 is the
// super-root; its children are the namespace roots (keyed by namespace id), whose
// descendants are block nodes (keyed by local block key).
//
// Each node's hint is its most recently created child (or 0); every other child
// is found through one hash table keyed by (parent, key). Most nodes are links of
// a chain with a single child, which is the hint: walking and extending chains
// never touches the table, and the table holds only the edges of branching nodes.
type state struct {
	maxDetached int

	nodes    []node
	freeNode uint32 // head of the free-node list, 0 = empty
	edges    edgeTable
	extra    [][]uint32 // holders beyond a node's two inline ones; index 0 unused
	freeSlot []uint32   // unused indexes of extra

	workers   []*workerState // by worker id; nil when the id is free
	workerIDs map[WorkerKey]uint32
	byName    map[string][]uint32
	order     []uint32 // live worker ids sorted by WorkerKey
	rank      []uint32 // worker id -> position in order
	freeIDs   []uint32

	seed uint64 // for the hash tables: keys come from users' prompts and engines

	namespaces, blockNodes, residencies, detached int
	counters                                      Counters
	stack                                         []uint64 // reused by reattach
	sink                                          uint64   // keeps prefetch loads alive
}

// noNode marks a freed arena slot (as its parent).
const noNode = ^uint32(0)

// node is 32 bytes. A residency is a worker id shifted left by 3 with the tier
// bitmask in the low 3 bits, so it is never 0 and 0 marks an empty holder slot.
type node struct {
	key      uint64
	parent   uint32
	hint     uint32 // the most recently created child, not in the edge table (0: none)
	children uint32
	holders  [2]uint32
	more     uint32 // index into state.extra for holders beyond two, 0 = none
}

func residency(wid uint32, mask uint8) uint32 { return wid<<3 | uint32(mask) }

func newState(cfg Config) state {
	maxDetached := cfg.MaxDetachedPerWorker
	if maxDetached <= 0 {
		maxDetached = DefaultMaxDetachedPerWorker
	}
	seed := maphash.Comparable(maphash.MakeSeed(), 0)
	return state{
		maxDetached: maxDetached,
		nodes:       []node{{parent: noNode}},
		edges:       newEdgeTable(seed),
		seed:        seed,
		extra:       [][]uint32{nil},
		workerIDs:   map[WorkerKey]uint32{},
		byName:      map[string][]uint32{},
	}
}

// child returns parent's child with key, or 0.
func (st *state) child(parent uint32, key uint64) uint32 {
	p := &st.nodes[parent]
	tabled := p.children
	if p.hint != 0 {
		if st.nodes[p.hint].key == key {
			return p.hint
		}
		tabled--
	}
	if tabled == 0 {
		return 0
	}
	return st.edges.find(st.nodes, parent, key)
}

// childOrCreate returns parent's child with key, creating it when missing.
func (st *state) childOrCreate(parent uint32, key uint64) uint32 {
	if c := st.child(parent, key); c != 0 {
		return c
	}
	c := st.freeNode
	if c != 0 {
		st.freeNode = st.nodes[c].hint
		st.nodes[c] = node{key: key, parent: parent}
	} else {
		c = uint32(len(st.nodes))
		st.nodes = append(st.nodes, node{key: key, parent: parent})
	}
	p := &st.nodes[parent]
	if p.hint != 0 { // the old hint becomes an ordinary, tabled child
		st.edges.insert(parent, st.nodes[p.hint].key, p.hint)
	}
	p.hint = c
	p.children++
	if parent == 0 {
		st.namespaces++
	} else {
		st.blockNodes++
	}
	return c
}

// release frees n and then its ancestors while they have neither holders nor
// children: a holder-less node is kept exactly as long as something hangs below it.
func (st *state) release(n uint32) {
	for n != 0 {
		nd := &st.nodes[n]
		if nd.holders[0] != 0 || nd.children != 0 {
			return
		}
		p := nd.parent
		pn := &st.nodes[p]
		if pn.hint == n {
			pn.hint = 0
		} else {
			st.edges.remove(p, nd.key, n)
		}
		pn.children--
		if p == 0 {
			st.namespaces--
		} else {
			st.blockNodes--
		}
		*nd = node{parent: noNode, hint: st.freeNode}
		st.freeNode = n
		n = p
	}
}

// Holders of a node form one list sorted by worker id: positions 0 and 1 inline,
// 2 and up in st.extra[node.more], filled from the front. Sorted, the lists of two
// nodes held by the same workers on the same tiers are byte-identical whatever
// order the workers stored them in, which Match exploits.

func (st *state) holderCount(nd *node) int {
	switch {
	case nd.holders[0] == 0:
		return 0
	case nd.holders[1] == 0:
		return 1
	}
	return 2 + len(st.moreHolders(nd))
}

// moreHolders returns the holders of n beyond the inline two.
func (st *state) moreHolders(n *node) []uint32 {
	if n.more == 0 {
		return nil
	}
	return st.extra[n.more]
}

func (st *state) holderAt(n uint32, i int) uint32 {
	if i < 2 {
		return st.nodes[n].holders[i]
	}
	return st.extra[st.nodes[n].more][i-2]
}

func (st *state) putHolder(n uint32, i int, r uint32) {
	if i < 2 {
		st.nodes[n].holders[i] = r
	} else {
		st.extra[st.nodes[n].more][i-2] = r
	}
}

// findHolder returns worker wid's position at node n, or the position where it
// belongs, whether it is there, and the number of holders.
func (st *state) findHolder(n, wid uint32) (pos int, found bool, count int) {
	count = st.holderCount(&st.nodes[n])
	for pos = 0; pos < count; pos++ {
		if w := st.holderAt(n, pos) >> 3; w >= wid {
			return pos, w == wid, count
		}
	}
	return count, false, count
}

// sameHolders reports whether two nodes, given with their extra holders, have
// identical holder lists.
func sameHolders(a *node, aMore []uint32, b *node, bMore []uint32) bool {
	return a.holders == b.holders && bytes.Equal(asBytes(aMore), asBytes(bMore))
}

// asWords views holders as uint64 words, two holders each; an odd last holder is
// left out.
func asWords(s []uint32) []uint64 {
	return unsafe.Slice((*uint64)(unsafe.Pointer(unsafe.SliceData(s))), len(s)/2)
}

// asBytes views holders as bytes, so comparing lists is one vectorised memequal
// (a per-element loop costs the most of a Match over many holders).
func asBytes(s []uint32) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), 4*len(s))
}

// holderMask returns worker wid's tier mask at node n (0 = not held).
func (st *state) holderMask(n, wid uint32) uint8 {
	if i, found, _ := st.findHolder(n, wid); found {
		return uint8(st.holderAt(n, i) & 7)
	}
	return 0
}

// setHolder sets worker wid's tier mask at node n; mask 0 removes the worker and
// releases n if nothing else keeps it.
func (st *state) setHolder(n, wid uint32, mask uint8) {
	i, found, count := st.findHolder(n, wid)
	switch {
	case found && mask != 0:
		st.putHolder(n, i, residency(wid, mask))
	case found:
		st.deleteHolder(n, i, count)
		st.residencies--
		st.release(n)
	case mask != 0:
		st.insertHolder(n, i, count, residency(wid, mask))
		st.residencies++
	}
}

// insertHolder puts r at position i of n's count holders, shifting the rest up.
func (st *state) insertHolder(n uint32, i, count int, r uint32) {
	if count >= 2 {
		nd := &st.nodes[n]
		if nd.more == 0 {
			if k := len(st.freeSlot); k > 0 {
				nd.more = st.freeSlot[k-1]
				st.freeSlot = st.freeSlot[:k-1]
			} else {
				nd.more = uint32(len(st.extra))
				st.extra = append(st.extra, nil)
			}
		}
		st.extra[nd.more] = append(st.extra[nd.more], 0)
	}
	for j := count; j > i; j-- {
		st.putHolder(n, j, st.holderAt(n, j-1))
	}
	st.putHolder(n, i, r)
}

// deleteHolder removes position i of n's count holders, shifting the rest down.
func (st *state) deleteHolder(n uint32, i, count int) {
	for j := i; j < count-1; j++ {
		st.putHolder(n, j, st.holderAt(n, j+1))
	}
	nd := &st.nodes[n]
	switch {
	case count <= 2:
		nd.holders[count-1] = 0
	case count > 3:
		st.extra[nd.more] = st.extra[nd.more][:count-3]
	default:
		st.extra[nd.more] = nil
		st.freeSlot = append(st.freeSlot, nd.more)
		nd.more = 0
	}
}
