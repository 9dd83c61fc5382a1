package fakeengine

import (
	"container/list"
	"encoding/binary"
	"slices"

	"github.com/zeebo/xxh3"
)

// blockID indexes kvCache.blocks (a physical GPU block).
type blockID int32

const noBlock blockID = -1

// blockMeta is what identifies a cached block: its engine hash, its parent's, and
// the inputs the hash was computed from.
type blockMeta struct {
	hash      uint64
	parent    uint64
	hasParent bool
	tokens    []uint32
	extra     []string // vLLM extra keys: LoRA name, cache_salt on a first block
	loraName  string
	loraID    int
}

type physBlock struct {
	ref    int32
	cached bool
	meta   blockMeta
	// prev and next link the free queue; inFree says whether the block is in it.
	prev, next blockID
	inFree     bool
}

// kvCache is one rank's KV cache: a pool of GPU blocks with vLLM's prefix caching
// (a block keeps its hash after its last user leaves and is reused on a hit until
// it is evicted) and an optional CPU tier that takes evicted GPU blocks.
//
// Eviction order is vLLM's: free blocks form a queue, a request's blocks are
// appended in reverse order when it finishes (so its tail goes first), and an
// allocation takes the head, evicting the hash it held.
//
// Every change of cached contents appends to events, in the order a consumer must
// apply them. kvCache does no locking and no I/O; its rank owns it.
type kvCache struct {
	blockSize int
	blocks    []physBlock
	freeHead  blockID
	freeTail  blockID
	numFree   int
	gpuByHash map[uint64]blockID

	cpuCap    int
	cpuByHash map[uint64]*list.Element // value: *blockMeta
	cpuLRU    *list.List               // front is least recently used

	events []Event
}

func newKVCache(numGPU, numCPU, blockSize int) *kvCache {
	c := &kvCache{
		blockSize: blockSize,
		blocks:    make([]physBlock, numGPU),
		freeHead:  noBlock,
		freeTail:  noBlock,
		gpuByHash: map[uint64]blockID{},
		cpuCap:    numCPU,
		cpuByHash: map[uint64]*list.Element{},
		cpuLRU:    list.New(),
	}
	for i := range c.blocks {
		c.blocks[i].prev, c.blocks[i].next = noBlock, noBlock
		c.pushFree(blockID(i))
	}
	return c
}

func (c *kvCache) pushFree(id blockID) {
	b := &c.blocks[id]
	b.prev, b.next, b.inFree = c.freeTail, noBlock, true
	if c.freeTail != noBlock {
		c.blocks[c.freeTail].next = id
	} else {
		c.freeHead = id
	}
	c.freeTail = id
	c.numFree++
}

func (c *kvCache) removeFree(id blockID) {
	b := &c.blocks[id]
	if b.prev != noBlock {
		c.blocks[b.prev].next = b.next
	} else {
		c.freeHead = b.next
	}
	if b.next != noBlock {
		c.blocks[b.next].prev = b.prev
	} else {
		c.freeTail = b.prev
	}
	b.prev, b.next, b.inFree = noBlock, noBlock, false
	c.numFree--
}

// acquire takes a reference to a cached GPU block found by a prefix hit.
func (c *kvCache) acquire(id blockID) {
	if c.blocks[id].inFree {
		c.removeFree(id)
	}
	c.blocks[id].ref++
}

// allocate takes the head of the free queue, evicting the hash it held. The caller
// has checked numFree (admission reserves every block a request will need).
func (c *kvCache) allocate() blockID {
	id := c.freeHead
	c.removeFree(id)
	if c.blocks[id].cached {
		c.evict(id)
	}
	c.blocks[id].ref = 1
	return id
}

// evict drops a GPU block's hash. With a CPU tier the block is offloaded first, so
// the consumer sees it stored on CPU before it leaves the GPU and never loses it.
func (c *kvCache) evict(id blockID) {
	b := &c.blocks[id]
	meta := b.meta
	delete(c.gpuByHash, meta.hash)
	b.cached, b.meta = false, blockMeta{}
	if c.cpuCap > 0 {
		c.offload(meta)
	}
	c.events = append(c.events, Event{Kind: BlockRemoved, BlockHashes: []uint64{meta.hash}, Medium: MediumGPU})
}

func (c *kvCache) offload(meta blockMeta) {
	if e, ok := c.cpuByHash[meta.hash]; ok {
		c.cpuLRU.MoveToBack(e)
		return
	}
	if c.cpuLRU.Len() >= c.cpuCap {
		oldest := c.cpuLRU.Remove(c.cpuLRU.Front()).(*blockMeta)
		delete(c.cpuByHash, oldest.hash)
		c.events = append(c.events, Event{Kind: BlockRemoved, BlockHashes: []uint64{oldest.hash}, Medium: MediumCPU})
	}
	m := meta
	c.cpuByHash[meta.hash] = c.cpuLRU.PushBack(&m)
	c.emitStored(meta, MediumCPU)
}

// cacheBlock gives a computed block its hash. A hash already cached on the GPU (a
// concurrent request computed the same block) is not cached twice: the block stays
// private, so every cached hash has exactly one GPU copy and every BlockRemoved
// really removes it.
func (c *kvCache) cacheBlock(id blockID, meta blockMeta) {
	if _, dup := c.gpuByHash[meta.hash]; dup {
		return
	}
	b := &c.blocks[id]
	b.cached, b.meta = true, meta
	c.gpuByHash[meta.hash] = id
	c.emitStored(meta, MediumGPU)
}

// loadFromCPU copies a CPU-tier block into a fresh GPU block (a CPU prefix hit).
func (c *kvCache) loadFromCPU(meta blockMeta) blockID {
	if e, ok := c.cpuByHash[meta.hash]; ok {
		c.cpuLRU.MoveToBack(e)
	}
	id := c.allocate()
	c.cacheBlock(id, meta)
	return id
}

// release drops a finished request's references, tail first, as vLLM frees them.
func (c *kvCache) release(ids []blockID) {
	for i := len(ids) - 1; i >= 0; i-- {
		id := ids[i]
		c.blocks[id].ref--
		if c.blocks[id].ref == 0 {
			c.pushFree(id)
		}
	}
}

// clear forgets every cached hash on both tiers (the caller emits AllBlocksCleared
// or, for a simulated restart, nothing). Blocks in use stay allocated.
func (c *kvCache) clear() {
	for i := range c.blocks {
		c.blocks[i].cached, c.blocks[i].meta = false, blockMeta{}
	}
	clear(c.gpuByHash)
	clear(c.cpuByHash)
	c.cpuLRU.Init()
}

// emitStored appends a BlockStored, extending the previous one when the block
// continues its chain on the same medium (vLLM announces a request's newly cached
// blocks as one event).
func (c *kvCache) emitStored(meta blockMeta, medium string) {
	if n := len(c.events); n > 0 && meta.hasParent {
		last := &c.events[n-1]
		if last.Kind == BlockStored && last.Medium == medium && last.LoRAName == meta.loraName &&
			last.BlockHashes[len(last.BlockHashes)-1] == meta.parent {
			last.BlockHashes = append(last.BlockHashes, meta.hash)
			last.TokenIDs = append(last.TokenIDs, meta.tokens...)
			last.ExtraKeys = append(last.ExtraKeys, meta.extra)
			return
		}
	}
	c.events = append(c.events, Event{
		Kind:        BlockStored,
		BlockHashes: []uint64{meta.hash},
		ParentHash:  meta.parent,
		HasParent:   meta.hasParent,
		TokenIDs:    slices.Clone(meta.tokens),
		BlockSize:   c.blockSize,
		LoRAID:      meta.loraID,
		LoRAName:    meta.loraName,
		Medium:      medium,
		ExtraKeys:   [][]string{meta.extra},
	})
}

// takeEvents returns and forgets the pending events.
func (c *kvCache) takeEvents() []Event {
	ev := c.events
	c.events = nil
	return ev
}

// usage is vLLM's kv_cache_usage_perc: the fraction of GPU blocks not free
// (cached blocks nobody uses count as free).
func (c *kvCache) usage() float64 {
	return 1 - float64(c.numFree)/float64(len(c.blocks))
}

// contents lists every cached block once with the tiers that hold it, ordered by
// hash.
func (c *kvCache) contents(rank uint32) []CachedBlock {
	byHash := map[uint64]*CachedBlock{}
	add := func(m *blockMeta, tier string) {
		if cb, ok := byHash[m.hash]; ok {
			cb.Tiers = append(cb.Tiers, tier)
			return
		}
		cb := &CachedBlock{Hash: m.hash, TokenIDs: slices.Clone(m.tokens), Tiers: []string{tier},
			DPRank: rank, LoRAName: m.loraName, ExtraKeys: slices.Clone(m.extra)}
		if m.hasParent {
			p := m.parent
			cb.ParentHash = &p
		}
		byHash[m.hash] = cb
	}
	for _, id := range c.gpuByHash {
		add(&c.blocks[id].meta, MediumGPU)
	}
	for e := c.cpuLRU.Front(); e != nil; e = e.Next() {
		add(e.Value.(*blockMeta), MediumCPU)
	}
	out := make([]CachedBlock, 0, len(byHash))
	for _, cb := range byHash {
		out = append(out, *cb)
	}
	slices.SortFunc(out, func(a, b CachedBlock) int {
		switch {
		case a.Hash < b.Hash:
			return -1
		case a.Hash > b.Hash:
			return 1
		}
		return 0
	})
	return out
}

// blockHasher computes the engine's opaque block hashes: xxh3-64 with a per-engine
// seed over (parent marker, parent hash, tokens, extra keys). The seed and the
// framing make them differ from kvindex's block keys (xxh3 seed 1337 over the tokens
// alone), so consumers cannot come to rely on the two coinciding.
type blockHasher struct {
	seed uint64
	buf  []byte
}

func (h *blockHasher) hash(parent uint64, hasParent bool, tokens []uint32, extra []string) uint64 {
	b := h.buf[:0]
	if hasParent {
		b = append(b, 1)
	} else {
		b = append(b, 0)
	}
	b = binary.LittleEndian.AppendUint64(b, parent)
	for _, t := range tokens {
		b = binary.LittleEndian.AppendUint32(b, t)
	}
	for _, s := range extra {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(s)))
		b = append(b, s...)
	}
	h.buf = b
	return xxh3.HashSeed(b, h.seed)
}
