package radix

import (
	"cmp"
	"crypto/sha256"
	"slices"
)

// Digest is SHA-256 of the canonical snapshot (what WriteTo writes). The snapshot
// lists workers sorted by WorkerKey, nodes depth-first with siblings sorted by
// key, and each worker's hashes sorted, so the digest depends only on the logical
// content: two indexes fed the same events in any memory layout, or one restored
// from the other's snapshot, have equal digests.
func (ix *Index) Digest() [32]byte {
	return ix.Snapshot().Digest()
}

// Digest is SHA-256 of the snapshot (see Index.Digest).
func (s *Snapshot) Digest() [32]byte {
	h := sha256.New()
	// Writing to a hash.Hash cannot fail.
	_, _ = s.WriteTo(h)
	var d [32]byte
	h.Sum(d[:0])
	return d
}

// canonicalOrder returns the live nodes in depth-first pre-order from the
// super-root (first), siblings by ascending key, and each arena index's position
// in that order. Depth-first keeps chains together, and chains sit together in
// the arena, so the walk mostly reads memory in order.
func canonicalOrder(nodes *nodeArena) (order, position []uint32) {
	// Children of each node, grouped by parent (counting sort), then sorted by key.
	start := make([]uint32, nodes.len()+1)
	for i := 1; i < nodes.len(); i++ {
		if p := nodes.at(uint32(i)).parent; p != noNode {
			start[p+1]++
		}
	}
	for i := 1; i < len(start); i++ {
		start[i] += start[i-1]
	}
	kids := make([]uint32, start[nodes.len()])
	position = slices.Clone(start[:nodes.len()]) // fill cursors first, positions after
	for i := 1; i < nodes.len(); i++ {
		if p := nodes.at(uint32(i)).parent; p != noNode {
			kids[position[p]] = uint32(i)
			position[p]++
		}
	}
	byKeyDescending := func(a, b uint32) int { return cmp.Compare(nodes.at(b).key, nodes.at(a).key) }
	order = make([]uint32, 0, len(kids)+1)
	stack := []uint32{0}
	for len(stack) > 0 {
		n := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		position[n] = uint32(len(order))
		order = append(order, n)
		group := kids[start[n]:start[n+1]]
		slices.SortFunc(group, byKeyDescending) // pushed descending, popped ascending
		stack = append(stack, group...)
	}
	return order, position
}
