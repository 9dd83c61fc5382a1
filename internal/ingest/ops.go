package ingest

import (
	"github.com/kvindex/kvindex/internal/ingest/wire"
	"github.com/kvindex/kvindex/internal/kvblock"
)

// Reasons an event is refused (kvindex_ingest_refused_events_total).
const (
	refuseTokenCount = "token_count" // len(token_ids) != len(block_hashes) * block_size
	refuseBlockSize  = "block_size"  // block_size differs from the worker's
	refuseNoModel    = "no_model"    // the stream's model is unknown
	// refusePlaceholder: a BlockStored with no tokens and block_size 0, which vLLM's
	// offloading connector emits as a placeholder; expected, so counted but not logged.
	refusePlaceholder = "placeholder"
	// refuseOtherGroup: an event of a hybrid model's KV-cache group that is not
	// full attention (see opBuilder.indexes); expected, so counted but not logged.
	refuseOtherGroup = "other_group"
)

// opBuilder turns one stream's decoded events into index Ops: it computes block keys
// from the tokens (kvblock, with the worker's block size and the event's LoRA) and
// the namespace from (model, lora_name, cache_salt). It belongs to the stream's
// goroutine.
type opBuilder struct {
	model string
	// blockSize is what every BlockStored must carry; 0 accepts the event's own.
	blockSize int
	ns        map[nsKey]uint64
	// groupFull remembers, per KV-cache group index, whether a BlockStored said
	// the group is full attention (kv_cache_spec_kind), for the BlockRemoved
	// events, which carry the group index only.
	groupFull map[int64]bool
}

// maxKnownGroups bounds opBuilder.groupFull; models have a handful of groups.
const maxKnownGroups = 64

// fullAttentionKind reports whether a kv_cache_spec_kind keeps the KV of every
// token of the prefix, so that a prefix hit in it is a hit: full attention, MLA
// (DeepSeek) and attention with sinks. Sliding-window, chunked-local, Mamba and the
// encoder/cross-attention groups keep only part of it (or none).
func fullAttentionKind(kind string) bool {
	switch kind {
	case "full_attention", "mla_attention", "sink_full_attention":
		return true
	}
	return false
}

// indexes decides whether an event belongs to the KV-cache group the index
// follows. A hybrid model (vLLM group_idx, kv_cache_spec_kind) publishes one
// event per group; only full-attention groups are indexed, the others are
// skipped. An event with a kind says itself (and teaches the builder its group);
// one without (BlockRemoved, or revisions before kv_cache_spec_kind) follows what
// a BlockStored taught about its group, else only group 0 (or no group) is indexed.
func (b *opBuilder) indexes(ev *wire.Event) bool {
	if ev.KVCacheSpecKind != "" {
		full := fullAttentionKind(ev.KVCacheSpecKind)
		if ev.HasGroupIdx {
			if _, known := b.groupFull[ev.GroupIdx]; !known && len(b.groupFull) < maxKnownGroups {
				b.groupFull[ev.GroupIdx] = full
			}
		}
		return full
	}
	if !ev.HasGroupIdx {
		return true
	}
	if full, ok := b.groupFull[ev.GroupIdx]; ok {
		return full
	}
	return ev.GroupIdx == 0
}

type nsKey struct{ lora, salt string }

// maxCachedNamespaces bounds opBuilder.ns: salts may be per tenant or per request.
const maxCachedNamespaces = 1024

func newOpBuilder(model string, blockSize int) *opBuilder {
	return &opBuilder{model: model, blockSize: blockSize, ns: map[nsKey]uint64{}, groupFull: map[int64]bool{}}
}

func (b *opBuilder) namespace(lora, salt string) uint64 {
	k := nsKey{lora, salt}
	if id, ok := b.ns[k]; ok {
		return id
	}
	id := kvblock.Namespace{Model: b.model, LoRA: lora, CacheSalt: salt}.ID()
	if len(b.ns) >= maxCachedNamespaces {
		clear(b.ns)
	}
	b.ns[k] = id
	return id
}

// opStats counts what build did, for metrics.
type opStats struct {
	stored, removed, cleared       int
	storedBlocks, removedBlocks    int
	refusedTokens, refusedBlockLen int
	refusedNoModel                 int
	placeholders, otherGroups      int
}

// build converts events to Ops. Events that cannot be indexed are refused and
// counted, not fatal: the other events of the batch still apply. The Ops alias the
// events' hash slices, which the decoder allocated for this batch alone.
func (b *opBuilder) build(events []wire.Event) ([]Op, opStats) {
	var st opStats
	total := 0
	for i := range events {
		if events[i].Kind == wire.BlockStored {
			total += len(events[i].BlockHashes)
		}
	}
	keys := make([]uint64, 0, total) // one allocation for every key of the batch
	ops := make([]Op, 0, len(events))
	for i := range events {
		ev := &events[i]
		switch ev.Kind {
		case wire.BlockStored:
			if ev.BlockSize == 0 && len(ev.TokenIDs) == 0 {
				st.placeholders++
				continue
			}
			if !b.indexes(ev) {
				st.otherGroups++
				continue
			}
			if b.model == "" {
				st.refusedNoModel++
				continue
			}
			if b.blockSize != 0 && ev.BlockSize != b.blockSize {
				st.refusedBlockLen++
				continue
			}
			if ev.BlockSize <= 0 || len(ev.TokenIDs) != len(ev.BlockHashes)*ev.BlockSize {
				st.refusedTokens++
				continue
			}
			if len(ev.BlockHashes) == 0 {
				continue
			}
			start := len(keys)
			keys = kvblock.AppendLocalHashes(keys, ev.TokenIDs, ev.BlockSize, ev.LoRAName)
			ops = append(ops, Op{
				Kind:      OpStored,
				Namespace: b.namespace(ev.LoRAName, ev.CacheSalt),
				Parent:    ev.Parent,
				HasParent: ev.HasParent,
				Hashes:    ev.BlockHashes,
				Keys:      keys[start:len(keys):len(keys)],
				Tier:      ev.Tier(),
			})
			st.stored++
			st.storedBlocks += len(ev.BlockHashes)
		case wire.BlockRemoved:
			if len(ev.BlockHashes) == 0 {
				continue
			}
			if !b.indexes(ev) {
				st.otherGroups++
				continue
			}
			ops = append(ops, Op{Kind: OpRemoved, Hashes: ev.BlockHashes, Tier: ev.Tier()})
			st.removed++
			st.removedBlocks += len(ev.BlockHashes)
		case wire.AllBlocksCleared:
			ops = append(ops, Op{Kind: OpCleared})
			st.cleared++
		}
	}
	return ops, st
}
