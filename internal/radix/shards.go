package radix

import "iter"

// shardDir is the directory of an extendible hash table, shared by blockTable
// and edgeTable: the table's slots are split into shards by the top bits of
// each entry's mixed hash, so that growing rehashes one shard of at most a
// fixed size, never the whole table, while the index's write lock is held. A
// full shard below that size doubles, one at it splits in two, and only the
// directory of shards ever grows as a whole. The tables own their slot layout
// (probing, deletion, emptiness); the directory only moves shards.
type shardDir[T any] struct {
	dir   []dirEntry[T] // 1<<depth entries, indexed by the mixed hash's top depth bits
	depth uint
}

// dirEntry names a shard and repeats its slots, so that a lookup goes from the
// directory to the slots without loading the shard.
type dirEntry[T any] struct {
	slots []T
	shard *shard[T]
}

// shard holds the entries whose mixed hash starts with its depth-bit prefix;
// it fills 1<<(directory depth - its depth) consecutive directory entries.
type shard[T any] struct {
	slots []T // a power of two long
	count int
	depth uint
}

func newShardDir[T any](slots int) shardDir[T] {
	s := &shard[T]{slots: make([]T, slots)}
	return shardDir[T]{dir: []dirEntry[T]{{slots: s.slots, shard: s}}}
}

// entry returns the directory entry of mixed hash m (a shift by 64 is 0 in Go:
// depth 0 has one entry).
func (d *shardDir[T]) entry(m uint64) *dirEntry[T] { return &d.dir[m>>(64-d.depth)] }

// grow makes room in s, the shard of mixed hash m: it doubles a shard below
// maxSlots and splits one at it. mixOf returns a slot's mixed hash (false for
// an empty slot); place puts a slot into a shard (counting it there).
func (d *shardDir[T]) grow(s *shard[T], m uint64, maxSlots int, mixOf func(T) (uint64, bool), place func(*shard[T], uint64, T)) {
	var low, high *shard[T]
	if len(s.slots) < maxSlots {
		low = &shard[T]{slots: make([]T, 2*len(s.slots)), depth: s.depth}
		high = low
	} else {
		if s.depth == d.depth {
			dir := make([]dirEntry[T], 2*len(d.dir))
			for i := range dir {
				dir[i] = d.dir[i>>1]
			}
			d.dir, d.depth = dir, d.depth+1
		}
		low = &shard[T]{slots: make([]T, len(s.slots)), depth: s.depth + 1}
		high = &shard[T]{slots: make([]T, len(s.slots)), depth: s.depth + 1}
	}
	split := uint64(1) << (63 - s.depth) // the bit below s's prefix
	for _, slot := range s.slots {
		if sm, ok := mixOf(slot); ok {
			if sm&split != 0 {
				place(high, sm, slot)
			} else {
				place(low, sm, slot)
			}
		}
	}
	// Point s's directory entries at the new shards: the first half at low,
	// the second at high (all at low when doubling, when low is high).
	span := uint64(1) << (d.depth - s.depth)
	first := m >> (64 - d.depth) &^ (span - 1)
	for i := range span {
		to := high
		if i < span/2 || span == 1 {
			to = low
		}
		d.dir[first+i] = dirEntry[T]{slots: to.slots, shard: to}
	}
}

// shards yields each shard once.
func (d *shardDir[T]) shards() iter.Seq[*shard[T]] {
	return func(yield func(*shard[T]) bool) {
		for i := 0; i < len(d.dir); i += 1 << (d.depth - d.dir[i].shard.depth) {
			if !yield(d.dir[i].shard) {
				return
			}
		}
	}
}
