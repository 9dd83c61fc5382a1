package radix

import "hash/maphash"

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

	nodes    nodeArena
	freeNode uint32 // head of the free-node list, 0 = empty
	edges    edgeTable
	sets     []holderSet // holder lists of spilled nodes (see holders.go); index 0 unused
	freeSets []uint32    // unused indexes of sets

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

// node is 32 bytes. Its holders are inline or spilled, see holders.go.
type node struct {
	key      uint64
	parent   uint32
	hint     uint32 // the most recently created child, not in the edge table (0: none)
	children uint32
	holders  [2]uint32 // inline residencies, while the node has at most two holders
	more     uint32    // index into state.sets when it has more, 0 = none
}

func newState(cfg Config) state {
	maxDetached := cfg.MaxDetachedPerWorker
	if maxDetached <= 0 {
		maxDetached = DefaultMaxDetachedPerWorker
	}
	seed := maphash.Comparable(maphash.MakeSeed(), 0)
	st := state{
		maxDetached: maxDetached,
		edges:       newEdgeTable(seed),
		seed:        seed,
		sets:        []holderSet{{}},
		workerIDs:   map[WorkerKey]uint32{},
		byName:      map[string][]uint32{},
	}
	st.nodes.push(node{parent: noNode}) // the super-root
	return st
}

// child returns parent's child with key, or 0.
func (st *state) child(parent uint32, key uint64) uint32 {
	c, _ := st.childOf(parent, st.nodes.at(parent), key)
	return c
}

// childOf is child for a parent whose node p is at hand, and returns the
// child's node as well (nil when there is none): a walk down the tree reaches
// each node once, not once as a child and again as the next parent.
func (st *state) childOf(parent uint32, p *node, key uint64) (uint32, *node) {
	tabled := p.children
	if p.hint != 0 {
		if h := st.nodes.at(p.hint); h.key == key {
			return p.hint, h
		}
		tabled--
	}
	if tabled == 0 {
		return 0, nil
	}
	if c := st.edges.find(&st.nodes, parent, key); c != 0 {
		return c, st.nodes.at(c)
	}
	return 0, nil
}

// childOrCreate returns parent's child with key, creating it when missing.
func (st *state) childOrCreate(parent uint32, key uint64) uint32 {
	if c := st.child(parent, key); c != 0 {
		return c
	}
	c := st.freeNode
	if c != 0 {
		st.freeNode = st.nodes.at(c).hint
		*st.nodes.at(c) = node{key: key, parent: parent}
	} else {
		c = st.nodes.push(node{key: key, parent: parent})
	}
	p := st.nodes.at(parent)
	if p.hint != 0 { // the old hint becomes an ordinary, tabled child
		st.edges.insert(parent, st.nodes.at(p.hint).key, p.hint)
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
		nd := st.nodes.at(n)
		if nd.held() || nd.children != 0 {
			return
		}
		p := nd.parent
		pn := st.nodes.at(p)
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
