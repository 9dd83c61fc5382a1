package radix

import "slices"

// HolderStats is what one holder (worker, dp rank) keeps in the index.
type HolderStats struct {
	Worker WorkerKey
	// PerTier[t] counts the attached blocks held on tier t; a block held on two
	// tiers counts on both.
	PerTier [NumTiers]int
	// Detached counts blocks kept detached (parent unknown), invisible to Match.
	Detached int
}

// HolderStats returns, sorted by WorkerKey, the block counts of every known
// holder whose worker name is in filter (every holder when filter is nil). It
// visits every block of those holders: meant for status pages, not hot paths.
func (ix *Index) HolderStats(filter []string) []HolderStats {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	st := &ix.st
	var out []HolderStats
	for _, wid := range st.order {
		ws := st.workers[wid]
		if filter != nil && !slices.Contains(filter, ws.key.Worker) {
			continue
		}
		hs := HolderStats{Worker: ws.key, Detached: len(ws.detached)}
		for _, e := range ws.blocks.all() {
			if _, aliased := ws.aliases[e.node]; !aliased {
				addTiers(&hs.PerTier, e.tiers)
			}
		}
		// A node reached through several engine hashes counts once, with the
		// tiers all of them hold it on.
		for n := range ws.aliases {
			addTiers(&hs.PerTier, st.holderMask(n, wid))
		}
		out = append(out, hs)
	}
	return out
}

func addTiers(per *[NumTiers]int, mask uint8) {
	for t := range NumTiers {
		if mask&(1<<t) != 0 {
			per[t]++
		}
	}
}

// HeldBlocks returns how many engine hashes holder w has attached in the tree
// (0 for an unknown holder). It costs one map lookup.
func (ix *Index) HeldBlocks(w WorkerKey) int {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	if wid, ok := ix.st.workerIDs[w]; ok {
		return ix.st.workers[wid].blocks.count
	}
	return 0
}

// BlockPath appends to dst the local keys from the namespace root down to the
// node where holder w has engine hash h attached, first block first, and returns
// them with the namespace id. ok is false when w does not hold h attached (an
// unknown worker or hash, or a detached block). It costs O(depth).
func (ix *Index) BlockPath(w WorkerKey, h uint64, dst []uint64) (ns uint64, keys []uint64, ok bool) {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	st := &ix.st
	wid, known := st.workerIDs[w]
	if !known {
		return 0, dst, false
	}
	e, held := st.workers[wid].blocks.get(h)
	if !held {
		return 0, dst, false
	}
	start := len(dst)
	n := e.node
	for st.nodes[n].parent != 0 {
		dst = append(dst, st.nodes[n].key)
		n = st.nodes[n].parent
	}
	slices.Reverse(dst[start:])
	return st.nodes[n].key, dst, true
}

// NodeView is one node of the tree as Nodes reports it.
type NodeView struct {
	// ID is the node's position in this Nodes result; Parent is its parent's
	// position, or -1 for a namespace root.
	ID, Parent int
	// Key is the namespace id for a namespace root, else the block's local key.
	Key uint64
	// Holders are the holders of the block with their tier masks (bit t set:
	// held on tier t), sorted by WorkerKey. Empty for namespace roots and for
	// holder-less nodes kept for their children.
	Holders []Holding
}

// Holding is one holder of a block and the tiers it holds it on.
type Holding struct {
	Worker WorkerKey
	Tiers  uint8
}

// Nodes returns every namespace root and block node, depth-first with a parent
// before its children and siblings by ascending key. It copies the whole tree
// under the read lock, so it delays writers for the time of one pass over the
// tree: for dumps and debugging.
func (ix *Index) Nodes() []NodeView {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	st := &ix.st
	order, position := canonicalOrder(st.nodes)
	out := make([]NodeView, 0, len(order))
	var flat []Holding
	counts := make([]int, 0, len(order))
	for i, n := range order {
		if i == 0 { // the super-root
			continue
		}
		nd := &st.nodes[n]
		v := NodeView{ID: len(out), Parent: int(position[nd.parent]) - 1, Key: nd.key}
		if nd.parent == 0 {
			v.Parent = -1
		}
		start := len(flat)
		for j := range st.holderCount(nd) {
			r := st.holderAt(n, j)
			flat = append(flat, Holding{Worker: st.workers[r>>3].key, Tiers: uint8(r & 7)})
		}
		slices.SortFunc(flat[start:], func(a, b Holding) int { return a.Worker.compare(b.Worker) })
		counts = append(counts, len(flat)-start)
		out = append(out, v)
	}
	// Slice the views only now: flat may have moved while it grew.
	at := 0
	for i, k := range counts {
		out[i].Holders = flat[at : at+k : at+k]
		at += k
	}
	return out
}
