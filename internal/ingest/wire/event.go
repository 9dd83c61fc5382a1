package wire

import "github.com/kvindex/kvindex/internal/radix"

// EventBatch is one decoded engine message: what vLLM and SGLang call an EventBatch.
type EventBatch struct {
	// TS is the engine's wall-clock time (seconds since the epoch) when it built the batch.
	TS     float64
	Events []Event
	// DPRank is the data-parallel rank the engine stamped on the batch
	// (vLLM data_parallel_rank, SGLang attn_dp_rank); meaningful only when HasDPRank.
	DPRank    uint32
	HasDPRank bool
}

// EventKind says which of the three engine events an Event is.
type EventKind uint8

const (
	// BlockStored: full blocks became resident; they extend the chain ending at Parent.
	BlockStored EventKind = iota + 1
	// BlockRemoved: the blocks with these engine hashes were evicted from Medium.
	BlockRemoved
	// AllBlocksCleared: the engine dropped its whole cache (every tier).
	AllBlocksCleared
)

// String returns the wire tag of the kind ("BlockStored", ...).
func (k EventKind) String() string {
	switch k {
	case BlockStored:
		return tagBlockStored
	case BlockRemoved:
		return tagBlockRemoved
	case AllBlocksCleared:
		return tagAllBlocksCleared
	}
	return "EventKind(?)"
}

const (
	tagBlockStored      = "BlockStored"
	tagBlockRemoved     = "BlockRemoved"
	tagAllBlocksCleared = "AllBlocksCleared"
)

// Event is one decoded engine event. Fields that a kind does not carry stay zero.
//
// Engine block hashes are normalised to uint64 (see package doc): they are opaque
// per-worker identifiers, used only to resolve Parent and BlockRemoved.
type Event struct {
	Kind        EventKind
	BlockHashes []uint64

	// Parent is the engine hash of the block preceding BlockHashes[0]; HasParent is
	// false for a chain that starts at the root (parent_block_hash nil or absent).
	Parent    uint64
	HasParent bool

	// TokenIDs are the tokens of the stored blocks, BlockSize per block
	// (BlockStored only; the decoder does not check len(TokenIDs) == len(BlockHashes)*BlockSize).
	TokenIDs  []uint32
	BlockSize int

	// LoRAID is vLLM's deprecated numeric adapter id; LoRAName is what block keys mix in.
	LoRAID    int64
	HasLoRAID bool
	LoRAName  string

	// Medium is where the blocks live; nil or absent on the wire is MediumGPU.
	Medium Medium

	// CacheSalt isolates tenants' prefixes; it is part of the block namespace. SGLang
	// sends it in a metadata map or as a cache_salt key, vLLM in extra_keys of the
	// request's first block only: a vLLM BlockStored that continues a chain
	// (HasParent) carries none and belongs to its parent's namespace.
	CacheSalt string

	// GroupIdx is vLLM's KV-cache group (hybrid models); HasGroupIdx false when absent.
	GroupIdx    int64
	HasGroupIdx bool
	// KVCacheSpecKind is vLLM's kv_cache_spec_kind ("full_attention", "sliding_window", ...).
	KVCacheSpecKind string
	// SlidingWindow is vLLM's kv_cache_spec_sliding_window, in tokens.
	SlidingWindow    int64
	HasSlidingWindow bool
	// Locality is vLLM's locality string, kept verbatim.
	Locality string
}

// Medium is the storage medium an engine names in an event.
type Medium uint8

const (
	// MediumGPU is also what a nil or absent medium means.
	MediumGPU Medium = iota
	MediumCPU
	MediumCPUPinned
	MediumDisk
	MediumStorage
	MediumExternal
	// MediumUnknown is a medium string the decoder does not recognise. It is counted
	// in DecodeStats and indexed as GPU, as Dynamo does: the same unknown string in
	// BlockStored and BlockRemoved then maps to the same tier, so removal still finds
	// what was stored.
	MediumUnknown
)

// Tier maps a medium to the index's three tiers (docs/contracts.md): GPU, nil and
// unknown media → GPU; CPU, CPU_PINNED → CPU; DISK, STORAGE, EXTERNAL → Disk.
func (m Medium) Tier() radix.Tier {
	switch m {
	case MediumCPU, MediumCPUPinned:
		return radix.TierCPU
	case MediumDisk, MediumStorage, MediumExternal:
		return radix.TierDisk
	}
	return radix.TierGPU
}

// String returns the wire name of the medium ("GPU", "CPU_PINNED", ...) or "UNKNOWN".
func (m Medium) String() string {
	if int(m) < len(mediumNames) {
		return mediumNames[m]
	}
	return "UNKNOWN"
}

// mediumNames is indexed by Medium; the decoder matches them case-insensitively.
var mediumNames = [...]string{
	MediumGPU:       "GPU",
	MediumCPU:       "CPU",
	MediumCPUPinned: "CPU_PINNED",
	MediumDisk:      "DISK",
	MediumStorage:   "STORAGE",
	MediumExternal:  "EXTERNAL",
}

// Tier is the index tier of the event's medium (see Medium.Tier).
func (e *Event) Tier() radix.Tier { return e.Medium.Tier() }
