package tokenize

import (
	"hash/maphash"
	"math"
	"strings"
	"sync"
)

// bpe is a byte-level BPE model over raw bytes. A word starts as one symbol per byte
// and the adjacent pair with the lowest merge rank is merged until no pair has a rank
// (ties go to the leftmost pair) — Hugging Face's algorithm, which the tests check
// against its output.
type bpe struct {
	byteIDs [256]uint32
	// merges maps a pair (left<<32 | right) to rank<<32 | merged id.
	merges map[uint64]uint64
	// whole maps a word to its id when the word encodes to that single token: with
	// ignore_merges every vocabulary word, otherwise the words whose merges end in
	// themselves (found at load time). It is read-only after load.
	whole map[string]uint32
	cache *wordCache
}

// noRank marks a pair that has no merge.
const noRank = math.MaxUint32

func pairKey(left, right uint32) uint64 { return uint64(left)<<32 | uint64(right) }

// rank returns the merge rank of (left, right) and the merged id, or noRank.
func (m *bpe) rank(left, right uint32) (rank, merged uint32) {
	v, ok := m.merges[pairKey(left, right)]
	if !ok {
		return noRank, 0
	}
	return uint32(v >> 32), uint32(v)
}

// bpeScratch holds the buffers of one word's merge loop, reused across words.
type bpeScratch struct {
	ids    []uint32
	ranks  []uint32
	merged []uint32
	heap   mergeHeap
	prev   []int32
	next   []int32
}

// appendWord appends the ids of one pre-tokenized word (raw bytes, non-empty).
func (m *bpe) appendWord(dst []uint32, word string, sc *bpeScratch) []uint32 {
	if id, ok := m.whole[word]; ok {
		return append(dst, id)
	}
	if ids, ok := m.cache.get(word); ok {
		return append(dst, ids...)
	}
	var ids []uint32
	if len(word) <= linearMergeLimit {
		ids = m.mergeLinear(word, sc)
	} else {
		ids = m.mergeHeap(word, sc)
	}
	m.cache.put(word, ids)
	return append(dst, ids...)
}

// linearMergeLimit is the word length up to which a quadratic scan for the lowest rank
// beats a heap.
const linearMergeLimit = 48

// mergeLinear keeps the symbols and the rank of every adjacent pair in arrays and
// rescans for the lowest rank after each merge. The result is a fresh slice.
func (m *bpe) mergeLinear(word string, sc *bpeScratch) []uint32 {
	ids := sc.ids[:0]
	for i := 0; i < len(word); i++ {
		ids = append(ids, m.byteIDs[word[i]])
	}
	ranks, merged := sc.ranks[:0], sc.merged[:0]
	for i := 0; i+1 < len(ids); i++ {
		r, id := m.rank(ids[i], ids[i+1])
		ranks = append(ranks, r)
		merged = append(merged, id)
	}
	for len(ids) > 1 {
		best, bestRank := -1, uint32(noRank)
		for i, r := range ranks {
			if r < bestRank {
				best, bestRank = i, r
			}
		}
		if best < 0 {
			break
		}
		ids[best] = merged[best]
		ids = append(ids[:best+1], ids[best+2:]...)
		ranks = append(ranks[:best], ranks[best+1:]...)
		merged = append(merged[:best], merged[best+1:]...)
		if best > 0 {
			r, id := m.rank(ids[best-1], ids[best])
			ranks[best-1], merged[best-1] = r, id
		}
		if best < len(ids)-1 {
			r, id := m.rank(ids[best], ids[best+1])
			ranks[best], merged[best] = r, id
		}
	}
	sc.ids, sc.ranks, sc.merged = ids, ranks, merged
	return append([]uint32(nil), ids...)
}

// mergeHeap is the same algorithm for long words (runs of spaces, long letter runs):
// symbols form a linked list and candidate merges wait in a min-heap by (rank,
// position); an entry whose pair has changed since it was pushed is skipped.
func (m *bpe) mergeHeap(word string, sc *bpeScratch) []uint32 {
	n := len(word)
	ids, prev, next := sc.ids[:0], sc.prev[:0], sc.next[:0]
	for i := 0; i < n; i++ {
		ids = append(ids, m.byteIDs[word[i]])
		prev = append(prev, int32(i-1))
		next = append(next, int32(i+1))
	}
	next[n-1] = -1
	h := sc.heap[:0]
	for i := 0; i+1 < n; i++ {
		if r, id := m.rank(ids[i], ids[i+1]); r != noRank {
			h = h.push(mergeEntry{rank: r, pos: int32(i), merged: id})
		}
	}
	alive := n
	for len(h) > 0 {
		var top mergeEntry
		top, h = h.pop()
		right := next[top.pos]
		if ids[top.pos] == deadSymbol || right < 0 {
			continue
		}
		if r, id := m.rank(ids[top.pos], ids[right]); r != top.rank || id != top.merged {
			continue
		}
		ids[top.pos] = top.merged
		ids[right] = deadSymbol
		alive--
		after := next[right]
		next[top.pos] = after
		if after >= 0 {
			prev[after] = top.pos
		}
		if before := prev[top.pos]; before >= 0 {
			if r, id := m.rank(ids[before], ids[top.pos]); r != noRank {
				h = h.push(mergeEntry{rank: r, pos: before, merged: id})
			}
		}
		if after >= 0 {
			if r, id := m.rank(ids[top.pos], ids[after]); r != noRank {
				h = h.push(mergeEntry{rank: r, pos: top.pos, merged: id})
			}
		}
	}
	out := make([]uint32, 0, alive)
	for i := int32(0); i >= 0; i = next[i] {
		out = append(out, ids[i])
	}
	sc.ids, sc.prev, sc.next, sc.heap = ids, prev, next, h
	return out
}

// deadSymbol marks a symbol merged into its left neighbour (no vocabulary is that big).
const deadSymbol = math.MaxUint32

type mergeEntry struct {
	rank   uint32
	pos    int32
	merged uint32
}

func (a mergeEntry) less(b mergeEntry) bool {
	return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos)
}

// mergeHeap is a binary min-heap of merge candidates.
type mergeHeap []mergeEntry

func (h mergeHeap) push(e mergeEntry) mergeHeap {
	h = append(h, e)
	for i := len(h) - 1; i > 0; {
		parent := (i - 1) / 2
		if !h[i].less(h[parent]) {
			break
		}
		h[i], h[parent] = h[parent], h[i]
		i = parent
	}
	return h
}

func (h mergeHeap) pop() (mergeEntry, mergeHeap) {
	top := h[0]
	last := len(h) - 1
	h[0] = h[last]
	h = h[:last]
	for i := 0; ; {
		l, r, least := 2*i+1, 2*i+2, i
		if l < len(h) && h[l].less(h[least]) {
			least = l
		}
		if r < len(h) && h[r].less(h[least]) {
			least = r
		}
		if least == i {
			break
		}
		h[i], h[least] = h[least], h[i]
		i = least
	}
	return top, h
}

// wordCache memoizes the ids of words that are not single tokens. It is sharded to
// keep lock hold times short under concurrent encoders; a shard that reaches its byte
// budget is emptied, which is cheap and keeps memory bounded (the words of real text
// recur quickly, and a long run of spaces or letters is worth keeping: merging it is
// O(n log n) with a map lookup per step).
type wordCache struct {
	seed   maphash.Seed
	shards [wordCacheShards]wordCacheShard
}

const (
	wordCacheShards = 16
	// wordCacheShardBytes bounds each shard's words and ids: 16 shards of 512 KiB.
	wordCacheShardBytes = 512 << 10
	// wordCacheMaxLen keeps huge words (a megabyte of one letter) out of the cache.
	wordCacheMaxLen = 16 << 10
	// wordCacheEntryBytes approximates a map entry's own size.
	wordCacheEntryBytes = 48
)

type wordCacheShard struct {
	mu    sync.RWMutex
	words map[string][]uint32
	bytes int
}

func newWordCache() *wordCache {
	c := &wordCache{seed: maphash.MakeSeed()}
	for i := range c.shards {
		c.shards[i].words = make(map[string][]uint32)
	}
	return c
}

func (c *wordCache) shard(word string) *wordCacheShard {
	return &c.shards[maphash.String(c.seed, word)%wordCacheShards]
}

func (c *wordCache) get(word string) ([]uint32, bool) {
	if len(word) > wordCacheMaxLen {
		return nil, false
	}
	sh := c.shard(word)
	sh.mu.RLock()
	ids, ok := sh.words[word]
	sh.mu.RUnlock()
	return ids, ok
}

// put stores ids, which the cache then owns (callers only ever append from it).
func (c *wordCache) put(word string, ids []uint32) {
	if len(word) > wordCacheMaxLen {
		return
	}
	size := len(word) + 4*len(ids) + wordCacheEntryBytes
	sh := c.shard(word)
	sh.mu.Lock()
	if sh.bytes+size > wordCacheShardBytes {
		clear(sh.words)
		sh.bytes = 0
	}
	sh.words[strings.Clone(word)] = ids
	sh.bytes += size
	sh.mu.Unlock()
}
