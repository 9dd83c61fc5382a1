package radix

// nodeArena holds the tree's nodes, addressed by uint32, in chunks of
// arenaChunk nodes. Growing allocates one chunk and moves nothing. A single
// slice grown by append copied the whole tree under the index's write lock at
// every doubling, stalling every Match for as long: 1.06 s when a tree reached
// 3M nodes on a 2-vCPU guest, where fresh memory faults page by page. The price
// is one more load per node access (the chunk pointer, which stays in cache).
// Node 0 is the super-root and is never freed.
type nodeArena struct {
	chunks []*nodeChunk
	n      uint32 // nodes in use, free ones included: the next fresh index
}

const (
	// 4k nodes, 128 KiB: the least every index and every Snapshot allocates.
	arenaChunkBits = 12
	arenaChunk     = 1 << arenaChunkBits
)

type nodeChunk [arenaChunk]node

// at returns node i, which must be below len.
func (a *nodeArena) at(i uint32) *node {
	return &a.chunks[i>>arenaChunkBits][i&(arenaChunk-1)]
}

// len is the number of node indexes in use, freed ones included.
func (a *nodeArena) len() int { return int(a.n) }

// push appends nd and returns its index.
func (a *nodeArena) push(nd node) uint32 {
	i := a.n
	if int(i>>arenaChunkBits) == len(a.chunks) {
		a.chunks = append(a.chunks, new(nodeChunk))
	}
	a.n++
	*a.at(i) = nd
	return i
}

// clone copies the arena chunk by chunk, the last one only as far as it is used.
func (a *nodeArena) clone() nodeArena {
	c := nodeArena{chunks: make([]*nodeChunk, len(a.chunks)), n: a.n}
	for k, chunk := range a.chunks {
		dup := new(nodeChunk)
		used := min(arenaChunk, int(a.n)-k*arenaChunk)
		copy(dup[:used], chunk[:used])
		c.chunks[k] = dup
	}
	return c
}
