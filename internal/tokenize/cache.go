package tokenize

import (
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/dgraph-io/ristretto/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/zeebo/xxh3"
)

// Cache memoizes tokenization work by content, within a byte budget (ristretto:
// admission by frequency, eviction by sampled LFU):
//
//   - segment ids: an HFTokenizer given the cache (Options.Cache) stores the ids of each
//     text segment between added tokens — in a chat prompt, one message body — under
//     (model, segment). Tokenization never crosses an added token, so a prompt's ids
//     are the concatenation of its segments' ids and reusing them is exact.
//   - block keys: callers that turn whole prompts into KV block keys store those under
//     (namespace, prompt), where the namespace is theirs to compose from everything the
//     keys depend on (model, LoRA, block size, cache salt).
//
// Keys are 128-bit hashes of the content; the text itself is not kept. Values handed
// out are shared: callers must not modify them. Writes are asynchronous, so a value may
// be visible only shortly after it is set, and the admission policy may drop it.
// Safe for concurrent use.
type Cache struct {
	store  *ristretto.Cache[uint64, cacheEntry]
	hits   [cacheKinds]atomic.Uint64
	misses [cacheKinds]atomic.Uint64
}

// CacheConfig configures NewCache.
type CacheConfig struct {
	// MaxBytes is the budget for cached ids and keys; 0 means DefaultCacheBytes.
	MaxBytes int64
	// Registerer, when set, gets the cache's metrics:
	//
	//	kvindex_tokenize_cache_hits_total{kind}    lookups answered, kind = segment|block_keys
	//	kvindex_tokenize_cache_misses_total{kind}  lookups not answered
	Registerer prometheus.Registerer
}

// DefaultCacheBytes is the cache budget when none is configured.
const DefaultCacheBytes = 64 << 20

// CacheStats are the lookup counters of a Cache.
type CacheStats struct {
	SegmentHits, SegmentMisses   uint64
	BlockKeyHits, BlockKeyMisses uint64
}

type cacheKind int

const (
	kindSegment cacheKind = iota
	kindBlockKeys
	cacheKinds
)

var cacheKindNames = [cacheKinds]string{"segment", "block_keys"}

type cacheEntry struct {
	// check is the second half of the 128-bit key hash (the first is the ristretto key).
	check  uint64
	tokens []uint32
	keys   []uint64
}

// cacheEntryOverhead approximates the bytes an entry costs besides its slice data.
const cacheEntryOverhead = 64

// NewCache returns a cache; Close releases it.
func NewCache(cfg CacheConfig) (*Cache, error) {
	if cfg.MaxBytes < 0 {
		return nil, fmt.Errorf("tokenize: cache budget %d bytes is negative", cfg.MaxBytes)
	}
	if cfg.MaxBytes == 0 {
		cfg.MaxBytes = DefaultCacheBytes
	}
	// About ten counters per entry the budget holds, for entries of ~512 bytes.
	counters := max(cfg.MaxBytes/512*10, 10_000)
	store, err := ristretto.NewCache(&ristretto.Config[uint64, cacheEntry]{
		NumCounters: counters,
		MaxCost:     cfg.MaxBytes,
		BufferItems: 64,
	})
	if err != nil {
		return nil, fmt.Errorf("tokenize: cache: %w", err)
	}
	c := &Cache{store: store}
	if cfg.Registerer != nil {
		if err := c.register(cfg.Registerer); err != nil {
			store.Close()
			return nil, err
		}
	}
	return c, nil
}

func (c *Cache) register(reg prometheus.Registerer) error {
	for _, m := range []struct {
		name, help string
		counts     *[cacheKinds]atomic.Uint64
	}{
		{"kvindex_tokenize_cache_hits_total", "Tokenization cache lookups answered from the cache, by kind (segment, block_keys).", &c.hits},
		{"kvindex_tokenize_cache_misses_total", "Tokenization cache lookups not answered from the cache, by kind (segment, block_keys).", &c.misses},
	} {
		for kind := range cacheKinds {
			counts := m.counts
			f := prometheus.NewCounterFunc(prometheus.CounterOpts{
				Name:        m.name,
				Help:        m.help,
				ConstLabels: prometheus.Labels{"kind": cacheKindNames[kind]},
			}, func() float64 { return float64(counts[kind].Load()) })
			if err := reg.Register(f); err != nil {
				var are prometheus.AlreadyRegisteredError
				if errors.As(err, &are) {
					return errors.New("tokenize: cache metrics already registered on this registry (one Cache per registry)")
				}
				return err
			}
		}
	}
	return nil
}

// Close stops the cache's goroutines; lookups then miss and stores are dropped.
func (c *Cache) Close() { c.store.Close() }

// Wait blocks until the stores issued so far have been applied (for tests and
// benchmarks that need a warm cache).
func (c *Cache) Wait() { c.store.Wait() }

// Stats returns the lookup counters.
func (c *Cache) Stats() CacheStats {
	return CacheStats{
		SegmentHits: c.hits[kindSegment].Load(), SegmentMisses: c.misses[kindSegment].Load(),
		BlockKeyHits: c.hits[kindBlockKeys].Load(), BlockKeyMisses: c.misses[kindBlockKeys].Load(),
	}
}

func cacheKey(kind cacheKind, namespace, content string) (key, check uint64) {
	seed := xxh3.HashString(namespace) ^ uint64(kind+1)*0x9e3779b97f4a7c15
	h := xxh3.HashString128Seed(content, seed)
	return h.Lo, h.Hi
}

func (c *Cache) get(kind cacheKind, namespace, content string) (cacheEntry, bool) {
	key, check := cacheKey(kind, namespace, content)
	e, ok := c.store.Get(key)
	if !ok || e.check != check {
		c.misses[kind].Add(1)
		return cacheEntry{}, false
	}
	c.hits[kind].Add(1)
	return e, true
}

func (c *Cache) segment(model, seg string) ([]uint32, bool) {
	e, ok := c.get(kindSegment, model, seg)
	return e.tokens, ok
}

// setSegment stores a copy of ids.
func (c *Cache) setSegment(model, seg string, ids []uint32) {
	key, check := cacheKey(kindSegment, model, seg)
	owned := append([]uint32(nil), ids...)
	c.store.Set(key, cacheEntry{check: check, tokens: owned}, int64(4*len(owned)+cacheEntryOverhead))
}

// BlockKeys returns the block keys stored for prompt under namespace. The slice is
// shared: do not modify it.
func (c *Cache) BlockKeys(namespace, prompt string) ([]uint64, bool) {
	e, ok := c.get(kindBlockKeys, namespace, prompt)
	return e.keys, ok
}

// SetBlockKeys stores keys, which the cache then owns, for prompt under namespace.
func (c *Cache) SetBlockKeys(namespace, prompt string, keys []uint64) {
	key, check := cacheKey(kindBlockKeys, namespace, prompt)
	c.store.Set(key, cacheEntry{check: check, keys: keys}, int64(8*len(keys)+cacheEntryOverhead))
}
