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

// DetachedBlocks returns, per worker name, how many blocks its dp ranks keep
// detached (parent unknown), for workers that keep any. It costs O(holders).
func (ix *Index) DetachedBlocks() map[string]int {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	out := map[string]int{}
	for _, wid := range ix.st.order {
		ws := ix.st.workers[wid]
		if n := len(ws.detached); n > 0 {
			out[ws.key.Worker] += n
		}
	}
	return out
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
	for st.nodes.at(n).parent != 0 {
		dst = append(dst, st.nodes.at(n).key)
		n = st.nodes.at(n).parent
	}
	slices.Reverse(dst[start:])
	return st.nodes.at(n).key, dst, true
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
// before its children and siblings by ascending key. It is Snapshot().Nodes():
// writers wait only for the copy, not for building the views.
func (ix *Index) Nodes() []NodeView { return ix.Snapshot().Nodes() }

// Nodes returns the snapshot's namespace roots and block nodes as Index.Nodes
// does. A node's holders come from the workers' block tables: a worker holds a
// node on the tiers of the engine blocks that map to it (several engine hashes
// may alias one node).
func (s *Snapshot) Nodes() []NodeView {
	order, position := canonicalOrder(&s.nodes)
	// Holders per arena node, workers in WorkerKey order (s.workers is sorted).
	byNode := make([][]Holding, s.nodes.len())
	for _, sw := range s.workers {
		for _, b := range sw.blocks {
			if b.node == 0 || b.tiers == 0 {
				continue
			}
			hs := byNode[b.node]
			if n := len(hs); n > 0 && hs[n-1].Worker == sw.key {
				hs[n-1].Tiers |= b.tiers
				continue
			}
			byNode[b.node] = append(hs, Holding{Worker: sw.key, Tiers: b.tiers})
		}
	}
	out := make([]NodeView, 0, len(order))
	for i, n := range order {
		if i == 0 { // the super-root
			continue
		}
		nd := s.nodes.at(n)
		v := NodeView{ID: len(out), Parent: int(position[nd.parent]) - 1, Key: nd.key, Holders: byNode[n]}
		if nd.parent == 0 {
			v.Parent = -1
		}
		out = append(out, v)
	}
	return out
}
