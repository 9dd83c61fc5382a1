package radix

import (
	"cmp"
	"crypto/sha256"
	"slices"
)

// Digest is SHA-256 of the canonical snapshot (what WriteTo writes). The snapshot
// lists workers sorted by WorkerKey, nodes breadth-first with siblings sorted by
// key, and each worker's hashes sorted, so the digest depends only on the logical
// content: two indexes fed the same events in any memory layout, or one restored
// from the other's snapshot, have equal digests.
func (ix *Index) Digest() [32]byte {
	h := sha256.New()
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	// Writing to a hash.Hash cannot fail.
	_, _ = ix.st.writeSnapshot(h)
	var d [32]byte
	h.Sum(d[:0])
	return d
}

// canonicalOrder returns the live nodes breadth-first from the super-root (first),
// siblings by ascending key, and each arena index's position in that order.
func (st *state) canonicalOrder() (order, position []uint32) {
	// Children of each node, grouped by parent (counting sort), then sorted by key.
	start := make([]uint32, len(st.nodes)+1)
	for i := 1; i < len(st.nodes); i++ {
		if p := st.nodes[i].parent; p != noNode {
			start[p+1]++
		}
	}
	for i := 1; i < len(start); i++ {
		start[i] += start[i-1]
	}
	kids := make([]uint32, start[len(st.nodes)])
	fill := slices.Clone(start[:len(st.nodes)])
	for i := 1; i < len(st.nodes); i++ {
		if p := st.nodes[i].parent; p != noNode {
			kids[fill[p]] = uint32(i)
			fill[p]++
		}
	}
	byKey := func(a, b uint32) int { return cmp.Compare(st.nodes[a].key, st.nodes[b].key) }
	order = make([]uint32, 1, len(kids)+1)
	for i := 0; i < len(order); i++ {
		group := kids[start[order[i]]:start[order[i]+1]]
		slices.SortFunc(group, byKey)
		order = append(order, group...)
	}
	position = fill // reuse: every slot is overwritten or unused
	for i, n := range order {
		position[n] = uint32(i)
	}
	return order, position
}
