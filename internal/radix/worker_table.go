package radix

import (
	"fmt"
	"math/bits"
	"slices"
)

// workerState is one holder's view: which of its engine hashes sit where.
// Invariants: an engine hash is in at most one of blocks and detached; a node's
// residency mask for this worker is the OR of the tiers of its blocks entries at
// that node; waiting lists exactly the detached hashes by parent hash, and no
// parent in waiting is in blocks.
type workerState struct {
	key    WorkerKey
	blocks blockTable // engine hash -> node, for attached blocks
	// aliases counts entries per tier at nodes this worker reaches through two or
	// more engine hashes (e.g. equal tokens with different multimodal inputs), so
	// removing one hash does not drop a tier another still holds.
	aliases  map[uint32]aliasCount
	detached map[uint64]detachedBlock
	waiting  map[uint64][]uint64 // parent engine hash -> detached children
}

type entry struct {
	node  uint32
	tiers uint8
}

type aliasCount struct {
	entries uint32
	tiers   [NumTiers]uint32
}

type detachedBlock struct {
	parent, key uint64
	tiers       uint8
}

func newWorkerState(w WorkerKey, seed uint64) *workerState {
	return &workerState{key: w, blocks: newBlockTable(seed)}
}

// internWorker returns w's id, registering w when new.
func (st *state) internWorker(w WorkerKey) (uint32, error) {
	if wid, ok := st.workerIDs[w]; ok {
		return wid, nil
	}
	var wid uint32
	if k := len(st.freeIDs); k > 0 {
		wid = st.freeIDs[k-1]
		st.freeIDs = st.freeIDs[:k-1]
		st.workers[wid] = newWorkerState(w, st.seed)
	} else {
		if len(st.workers) >= maxWorkers {
			return 0, fmt.Errorf("%w: %d", ErrTooManyWorkers, len(st.workers))
		}
		wid = uint32(len(st.workers))
		st.workers = append(st.workers, newWorkerState(w, st.seed))
		st.rank = append(st.rank, 0)
	}
	st.workerIDs[w] = wid
	st.byName[w.Worker] = append(st.byName[w.Worker], wid)
	pos, _ := slices.BinarySearchFunc(st.order, w, func(id uint32, w WorkerKey) int {
		return st.workers[id].key.compare(w)
	})
	st.order = slices.Insert(st.order, pos, wid)
	st.renumber(pos)
	return wid, nil
}

func (st *state) renumber(from int) {
	for i := from; i < len(st.order); i++ {
		st.rank[st.order[i]] = uint32(i)
	}
}

// forgetWorker frees the id of a worker that holds nothing any more.
func (st *state) forgetWorker(wid uint32) {
	w := st.workers[wid].key
	delete(st.workerIDs, w)
	ids := slices.DeleteFunc(st.byName[w.Worker], func(id uint32) bool { return id == wid })
	if len(ids) == 0 {
		delete(st.byName, w.Worker)
	} else {
		st.byName[w.Worker] = ids
	}
	pos := int(st.rank[wid])
	st.order = slices.Delete(st.order, pos, pos+1)
	st.renumber(pos)
	st.workers[wid] = nil
	st.freeIDs = append(st.freeIDs, wid)
}

// clearWorker drops all blocks of a worker; the worker stays known.
func (st *state) clearWorker(wid uint32) {
	ws := st.workers[wid]
	for _, e := range ws.blocks.all() {
		st.setHolder(e.node, wid, 0) // a no-op for the second hash of an alias
	}
	st.detached -= len(ws.detached)
	ws.blocks = newBlockTable(st.seed)
	ws.aliases, ws.detached, ws.waiting = nil, nil, nil
}

// addEntryTiers makes engine hash h of worker wid hold mask at node n. h is either
// absent from blocks or already at n.
func (st *state) addEntryTiers(wid uint32, h uint64, n uint32, mask uint8) {
	ws := st.workers[wid]
	held := st.holderMask(n, wid)
	e, exists := ws.blocks.get(h)
	added := mask &^ e.tiers
	a, aliased := ws.aliases[n]
	if !exists && held != 0 {
		if !aliased {
			a = aliasCount{entries: 1}
			a.count(held, 1)
			aliased = true
		}
		a.entries++
	}
	if aliased {
		a.count(added, 1)
		if ws.aliases == nil {
			ws.aliases = map[uint32]aliasCount{}
		}
		ws.aliases[n] = a
	}
	ws.blocks.set(h, entry{node: n, tiers: e.tiers | mask})
	st.setHolder(n, wid, held|mask)
}

// dropEntryTiers removes the tiers in mask from attached entry e of hash h.
func (st *state) dropEntryTiers(wid uint32, h uint64, e entry, mask uint8) {
	ws := st.workers[wid]
	mask &= e.tiers
	e.tiers &^= mask
	if e.tiers == 0 {
		ws.blocks.delete(h)
	} else {
		ws.blocks.set(h, e)
	}
	held := e.tiers
	if a, ok := ws.aliases[e.node]; ok {
		a.count(mask, ^uint32(0)) // -1
		if e.tiers == 0 {
			a.entries--
		}
		held = a.mask()
		if a.entries == 1 {
			delete(ws.aliases, e.node)
		} else {
			ws.aliases[e.node] = a
		}
	}
	st.setHolder(e.node, wid, held)
}

func (a *aliasCount) count(mask uint8, delta uint32) {
	for m := mask; m != 0; m &= m - 1 {
		a.tiers[bits.TrailingZeros8(m)] += delta
	}
}

func (a *aliasCount) mask() uint8 {
	var m uint8
	for t, c := range a.tiers {
		if c != 0 {
			m |= 1 << t
		}
	}
	return m
}

// addDetached keeps hash h of worker ws as detached under parent hash parent.
func (st *state) addDetached(ws *workerState, h, parent, key uint64, mask uint8) {
	if ws.detached == nil {
		ws.detached = map[uint64]detachedBlock{}
		ws.waiting = map[uint64][]uint64{}
	}
	ws.detached[h] = detachedBlock{parent: parent, key: key, tiers: mask}
	ws.waiting[parent] = append(ws.waiting[parent], h)
	st.detached++
}

// dropDetachedTiers removes the tiers in mask from detached block d of hash h.
func (st *state) dropDetachedTiers(ws *workerState, h uint64, d detachedBlock, mask uint8) {
	d.tiers &^= mask
	if d.tiers != 0 {
		ws.detached[h] = d
		return
	}
	delete(ws.detached, h)
	st.detached--
	kids := slices.DeleteFunc(ws.waiting[d.parent], func(c uint64) bool { return c == h })
	if len(kids) == 0 {
		delete(ws.waiting, d.parent)
	} else {
		ws.waiting[d.parent] = kids
	}
}

// prefetch reads, ahead of a batch, the memory its blocks will need: their table
// slots and, when removing, their nodes and those nodes' edge slots. Loads issued
// back to back overlap their cache misses, where the batch itself would wait for
// them one after the other; with the index far larger than the caches this is
// most of the cost of an event. It changes nothing.
func (st *state) prefetch(ws *workerState, hashes []uint64, removing bool) {
	var sink uint64
	for _, h := range hashes {
		sink += ws.blocks.peek(h)
	}
	if removing {
		for _, h := range hashes {
			if e, ok := ws.blocks.get(h); ok {
				n := st.nodes.at(e.node)
				sink += st.edges.peek(n.parent, n.key)
			}
		}
	}
	st.sink = sink
}

// storeAttached places hash h with key under node at for worker wid and returns its node.
func (st *state) storeAttached(wid uint32, at uint32, h, key uint64, mask uint8, res *StoreResult) uint32 {
	ws := st.workers[wid]
	target := st.childOrCreate(at, key)
	e, ok := ws.blocks.get(h)
	if ok && e.node == target {
		if e.tiers&mask == mask {
			res.Duplicate++
		} else {
			st.addEntryTiers(wid, h, target, mask)
			res.Attached++
		}
		return target
	}
	if ok || ws.detached[h].tiers != 0 {
		// Pin target while the old placement goes: dropping it could otherwise
		// release target (a fresh, holder-less node) or its ancestors.
		st.nodes.at(target).children++
		st.dropPlacement(wid, h)
		st.nodes.at(target).children--
		res.Replaced++
	}
	st.addEntryTiers(wid, h, target, mask)
	res.Attached++
	if len(ws.waiting) > 0 {
		res.Reattached += st.reattach(wid, h)
	}
	return target
}

// storeDetached keeps hash h (child of parent hash parent, unknown to the worker)
// detached, unless the worker's bound is reached.
func (st *state) storeDetached(wid uint32, parent, h, key uint64, mask uint8, res *StoreResult) {
	ws := st.workers[wid]
	if d, ok := ws.detached[h]; ok && d.parent == parent && d.key == key {
		if d.tiers&mask == mask {
			res.Duplicate++
		} else {
			d.tiers |= mask
			ws.detached[h] = d
			res.Detached++
		}
		return
	}
	if _, ok := ws.blocks.get(h); ok || ws.detached[h].tiers != 0 {
		st.dropPlacement(wid, h)
		res.Replaced++
	}
	if len(ws.detached) >= st.maxDetached {
		res.Dropped++
		return
	}
	st.addDetached(ws, h, parent, key, mask)
	res.Detached++
}

// dropPlacement forgets hash h of worker wid wherever it is, attached or detached.
func (st *state) dropPlacement(wid uint32, h uint64) {
	ws := st.workers[wid]
	if e, ok := ws.blocks.get(h); ok {
		st.dropEntryTiers(wid, h, e, e.tiers)
	} else if d, ok := ws.detached[h]; ok {
		st.dropDetachedTiers(ws, h, d, d.tiers)
	}
}

// reattach attaches, transitively, the detached blocks waiting for hash h, which
// has just been attached. It returns how many it attached.
func (st *state) reattach(wid uint32, h uint64) int {
	ws := st.workers[wid]
	n := 0
	st.stack = append(st.stack[:0], h)
	for len(st.stack) > 0 {
		p := st.stack[len(st.stack)-1]
		st.stack = st.stack[:len(st.stack)-1]
		kids, ok := ws.waiting[p]
		if !ok {
			continue
		}
		delete(ws.waiting, p)
		parent, _ := ws.blocks.get(p)
		at := parent.node
		for _, c := range kids {
			d := ws.detached[c]
			delete(ws.detached, c)
			st.detached--
			st.addEntryTiers(wid, c, st.childOrCreate(at, d.key), d.tiers)
			n++
			st.stack = append(st.stack, c)
		}
	}
	return n
}
