package wire

import (
	"bytes"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/kvindex/kvindex/internal/radix"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/decode")

// twos is the uint64 an engine's signed hash normalises to.
func twos(v int64) uint64 { return uint64(v) }

func seqBytes(n int, first byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = first + byte(i)
	}
	return b
}

type goldenCase struct {
	name  string
	about string
	build func(a *annotator)
	want  EventBatch
	stats DecodeStats
}

var goldenCases = []goldenCase{
	{
		name: "vllm_array_batch_array_events",
		about: `vLLM <= 0.23 (msgspec array_like=True, tag=True): the batch is an array
[ts, events, data_parallel_rank] and every event a tagged array [tag, fields...].
BlockStored carries its six positional fields up to medium.`,
		build: func(a *annotator) {
			a.array(3, "EventBatch [ts, events, data_parallel_rank]", func() {
				a.float(1700000000.25, "ts")
				a.array(4, "events", func() {
					a.array(7, "BlockStored, 6 fields", func() {
						a.str("BlockStored", "tag")
						a.uints([]uint64{101, 102}, "block_hashes")
						a.nil("parent_block_hash: chain starts at the root")
						a.uints([]uint64{1, 2, 3, 4, 5, 6, 7, 8}, "token_ids")
						a.uint(4, "block_size")
						a.nil("lora_id")
						a.str("GPU", "medium")
					})
					a.array(7, "BlockStored, continues the chain", func() {
						a.str("BlockStored", "tag")
						a.uints([]uint64{103}, "block_hashes")
						a.uint(102, "parent_block_hash")
						a.uints([]uint64{9, 10, 11, 12}, "token_ids")
						a.uint(4, "block_size")
						a.nil("lora_id")
						a.str("GPU", "medium")
					})
					a.array(3, "BlockRemoved", func() {
						a.str("BlockRemoved", "tag")
						a.uints([]uint64{101}, "block_hashes")
						a.str("GPU", "medium")
					})
					a.array(1, "AllBlocksCleared", func() { a.str("AllBlocksCleared", "tag") })
				})
				a.uint(0, "data_parallel_rank")
			})
		},
		want: EventBatch{TS: 1700000000.25, HasDPRank: true, Events: []Event{
			{Kind: BlockStored, BlockHashes: []uint64{101, 102}, TokenIDs: []uint32{1, 2, 3, 4, 5, 6, 7, 8}, BlockSize: 4},
			{Kind: BlockStored, BlockHashes: []uint64{103}, Parent: 102, HasParent: true, TokenIDs: []uint32{9, 10, 11, 12}, BlockSize: 4},
			{Kind: BlockRemoved, BlockHashes: []uint64{101}},
			{Kind: AllBlocksCleared},
		}},
	},
	{
		name: "parent_zero_is_root",
		about: `Publishers of the llm-d ecosystem send parent_block_hash 0, not nil, for a
chain that starts at the root (llm-d's own event pool reads 0 as none): both forms
decode with no parent.`,
		build: func(a *annotator) {
			a.array(3, "EventBatch", func() {
				a.float(1700000007, "ts")
				a.array(2, "events", func() {
					a.array(7, "BlockStored, array form", func() {
						a.str("BlockStored", "tag")
						a.uints([]uint64{201}, "block_hashes")
						a.uint(0, "parent_block_hash 0: root")
						a.uints([]uint64{1, 2}, "token_ids")
						a.uint(2, "block_size")
						a.nil("lora_id")
						a.str("GPU", "medium")
					})
					a.mapOf(5, "BlockStored, map form", func() {
						a.field("type", func() { a.str("BlockStored", "tag") })
						a.field("block_hashes", func() { a.uints([]uint64{202}, "block_hashes") })
						a.field("parent_block_hash", func() { a.uint(0, "parent 0: root") })
						a.field("token_ids", func() { a.uints([]uint64{3, 4}, "token_ids") })
						a.field("block_size", func() { a.uint(2, "block_size") })
					})
				})
				a.nil("data_parallel_rank")
			})
		},
		want: EventBatch{TS: 1700000007, Events: []Event{
			{Kind: BlockStored, BlockHashes: []uint64{201}, TokenIDs: []uint32{1, 2}, BlockSize: 2},
			{Kind: BlockStored, BlockHashes: []uint64{202}, TokenIDs: []uint32{3, 4}, BlockSize: 2},
		}},
	},
	{
		name: "vllm_map_batch_map_events",
		about: `Current vLLM (tag=True, omit_defaults=True, no array_like): the batch is a map
and every event a map whose first key is "type". lora_id, medium and lora_name have
no default, so they are always present (nil or not); later fields only when set.
Hashes above 2^63 are msgpack uint64; token 70000 needs a uint32.`,
		build: func(a *annotator) {
			a.mapOf(3, "EventBatch", func() {
				a.field("ts", func() { a.float(1700000001.5, "ts") })
				a.field("events", func() {
					a.array(3, "events", func() {
						a.mapOf(11, "BlockStored", func() {
							a.field("type", func() { a.str("BlockStored", "tag") })
							a.field("block_hashes", func() { a.uints([]uint64{0xfedcba9876543210}, "block_hashes") })
							a.field("parent_block_hash", func() { a.uint(0x0123456789abcdef, "parent") })
							a.field("token_ids", func() { a.uints([]uint64{100, 200, 300, 70000}, "token_ids") })
							a.field("block_size", func() { a.uint(4, "block_size") })
							a.field("lora_id", func() { a.uint(7, "lora_id") })
							a.field("medium", func() { a.str("GPU", "medium") })
							a.field("lora_name", func() { a.str("sql-adapter", "lora_name") })
							a.field("group_idx", func() { a.uint(0, "group_idx") })
							a.field("kv_cache_spec_kind", func() { a.str("full_attention", "kind") })
							a.field("locality", func() { a.str("LOCAL", "locality") })
						})
						a.mapOf(4, "BlockRemoved", func() {
							a.field("type", func() { a.str("BlockRemoved", "tag") })
							a.field("block_hashes", func() { a.uints([]uint64{0xfedcba9876543210}, "block_hashes") })
							a.field("medium", func() { a.str("CPU", "medium") })
							a.field("group_idx", func() { a.uint(0, "group_idx") })
						})
						a.mapOf(1, "AllBlocksCleared", func() {
							a.field("type", func() { a.str("AllBlocksCleared", "tag") })
						})
					})
				})
				a.field("data_parallel_rank", func() { a.uint(1, "dp rank") })
			})
		},
		want: EventBatch{TS: 1700000001.5, DPRank: 1, HasDPRank: true, Events: []Event{
			{Kind: BlockStored, BlockHashes: []uint64{0xfedcba9876543210}, Parent: 0x0123456789abcdef, HasParent: true,
				TokenIDs: []uint32{100, 200, 300, 70000}, BlockSize: 4, LoRAID: 7, HasLoRAID: true, LoRAName: "sql-adapter",
				HasGroupIdx: true, KVCacheSpecKind: "full_attention", Locality: "LOCAL"},
			{Kind: BlockRemoved, BlockHashes: []uint64{0xfedcba9876543210}, Medium: MediumCPU, HasGroupIdx: true},
			{Kind: AllBlocksCleared},
		}},
	},
	{
		name: "vllm_bytes_hashes",
		about: `vLLM with a sha256 prefix-caching hash sends block hashes as msgpack bin. The
index keeps the last 8 bytes, big-endian; shorter strings count as left-padded. The
batch map names the rank attn_dp_rank, as SGLang does.`,
		build: func(a *annotator) {
			a.mapOf(3, "EventBatch", func() {
				a.field("ts", func() { a.float(1700000002, "ts") })
				a.field("events", func() {
					a.array(2, "events", func() {
						a.mapOf(8, "BlockStored", func() {
							a.field("type", func() { a.str("BlockStored", "tag") })
							a.field("block_hashes", func() {
								a.array(2, "block_hashes", func() {
									a.bin(seqBytes(32, 0x00), "sha256: last 8 bytes 18..1f")
									a.bin([]byte{0xde, 0xad, 0xbe, 0xef}, "4 bytes: 0xdeadbeef")
								})
							})
							a.field("parent_block_hash", func() { a.bin(seqBytes(8, 1), "parent 0x0102030405060708") })
							a.field("token_ids", func() { a.uints([]uint64{7, 8, 9, 10}, "token_ids") })
							a.field("block_size", func() { a.uint(2, "block_size") })
							a.field("lora_id", func() { a.nil("lora_id") })
							a.field("medium", func() { a.nil("medium: nil means GPU") })
							a.field("lora_name", func() { a.nil("lora_name") })
						})
						a.mapOf(3, "BlockRemoved", func() {
							a.field("type", func() { a.str("BlockRemoved", "tag") })
							a.field("block_hashes", func() {
								a.array(1, "block_hashes", func() {
									a.bin(append([]byte{0xff}, seqBytes(8, 1)...), "9 bytes: the leading ff is dropped")
								})
							})
							a.field("medium", func() { a.nil("medium") })
						})
					})
				})
				a.field("attn_dp_rank", func() { a.uint(5, "SGLang's name for the dp rank") })
			})
		},
		want: EventBatch{TS: 1700000002, DPRank: 5, HasDPRank: true, Events: []Event{
			{Kind: BlockStored, BlockHashes: []uint64{0x18191a1b1c1d1e1f, 0xdeadbeef}, Parent: 0x0102030405060708, HasParent: true,
				TokenIDs: []uint32{7, 8, 9, 10}, BlockSize: 2},
			{Kind: BlockRemoved, BlockHashes: []uint64{0x0102030405060708}},
		}},
	},
	{
		name: "vllm_extra_keys_cache_salt",
		about: `vLLM sends a request's cache_salt only inside extra_keys, in the first block's
tuple: LoRA name, multimodal keys (tuples), salt, prompt-embedding hashes (bytes).
The decoder takes the plain string after the LoRA name as the salt.`,
		build: func(a *annotator) {
			a.array(3, "EventBatch", func() {
				a.float(1700000009, "ts")
				a.array(3, "events", func() {
					a.mapOf(9, "BlockStored, salted first blocks of a LoRA request with an image", func() {
						a.field("type", func() { a.str("BlockStored", "tag") })
						a.field("block_hashes", func() { a.uints([]uint64{51, 52}, "block_hashes") })
						a.field("parent_block_hash", func() { a.nil("first block of the request") })
						a.field("token_ids", func() { a.uints([]uint64{1, 2, 3, 4}, "token_ids") })
						a.field("block_size", func() { a.uint(2, "block_size") })
						a.field("lora_id", func() { a.uint(1, "lora_id") })
						a.field("medium", func() { a.str("GPU", "medium") })
						a.field("lora_name", func() { a.str("sql", "lora_name") })
						a.field("extra_keys", func() {
							a.array(2, "one tuple per block", func() {
								a.array(4, "block 0", func() {
									a.str("sql", "LoRA name")
									a.array(2, "multimodal key", func() {
										a.str("img-1", "identifier")
										a.uint(0, "offset")
									})
									a.str("tenant-z", "cache salt")
									a.bin(seqBytes(4, 0xa0), "prompt-embedding hash")
								})
								a.array(1, "block 1: no salt after the first block", func() { a.str("sql", "LoRA name") })
							})
						})
					})
					a.mapOf(8, "BlockStored, a LoRA request without salt", func() {
						a.field("type", func() { a.str("BlockStored", "tag") })
						a.field("block_hashes", func() { a.uints([]uint64{61}, "block_hashes") })
						a.field("parent_block_hash", func() { a.nil("") })
						a.field("token_ids", func() { a.uints([]uint64{1, 2}, "token_ids") })
						a.field("block_size", func() { a.uint(2, "block_size") })
						a.field("medium", func() { a.nil("medium") })
						a.field("lora_name", func() { a.str("sql", "lora_name") })
						a.field("extra_keys", func() {
							a.array(1, "", func() { a.array(1, "block 0", func() { a.str("sql", "LoRA name") }) })
						})
					})
					a.array(9, "BlockStored array, salt without LoRA", func() {
						a.str("BlockStored", "tag")
						a.uints([]uint64{71, 72}, "block_hashes")
						a.nil("parent_block_hash")
						a.uints([]uint64{1, 2, 3, 4}, "token_ids")
						a.uint(2, "block_size")
						a.nil("lora_id")
						a.nil("medium")
						a.nil("lora_name")
						a.array(2, "extra_keys", func() {
							a.array(1, "block 0", func() { a.str("tenant-y", "cache salt") })
							a.nil("block 1: no extra keys")
						})
					})
				})
				a.uint(0, "data_parallel_rank")
			})
		},
		want: EventBatch{TS: 1700000009, HasDPRank: true, Events: []Event{
			{Kind: BlockStored, BlockHashes: []uint64{51, 52}, TokenIDs: []uint32{1, 2, 3, 4}, BlockSize: 2,
				LoRAID: 1, HasLoRAID: true, LoRAName: "sql", CacheSalt: "tenant-z"},
			{Kind: BlockStored, BlockHashes: []uint64{61}, TokenIDs: []uint32{1, 2}, BlockSize: 2, LoRAName: "sql"},
			{Kind: BlockStored, BlockHashes: []uint64{71, 72}, TokenIDs: []uint32{1, 2, 3, 4}, BlockSize: 2, CacheSalt: "tenant-y"},
		}},
	},
	{
		name: "sglang_legacy_negative_hashes",
		about: `Old SGLang: batch [ts, events] without a rank, tagged array events, signed int64
hashes (Python hash()), negative ones in every msgpack int width. BlockRemoved has
only block_hashes.`,
		build: func(a *annotator) {
			a.array(2, "EventBatch [ts, events]", func() {
				a.float(1700000003.125, "ts")
				a.array(2, "events", func() {
					a.array(6, "BlockStored, 5 fields (no medium)", func() {
						a.str("BlockStored", "tag")
						a.array(5, "block_hashes", func() {
							a.int(-1, "negative fixint")
							a.int(-100, "int8")
							a.int(-40000, "int32")
							a.int(-3000000000, "int64")
							a.int(math.MinInt64, "int64")
						})
						a.int(-2, "parent_block_hash")
						a.uints([]uint64{1, 2, 3, 4, 5}, "token_ids")
						a.uint(1, "block_size")
						a.nil("lora_id")
					})
					a.array(2, "BlockRemoved", func() {
						a.str("BlockRemoved", "tag")
						a.array(1, "block_hashes", func() { a.int(-1, "hash") })
					})
				})
			})
		},
		want: EventBatch{TS: 1700000003.125, Events: []Event{
			{Kind: BlockStored, BlockHashes: []uint64{twos(-1), twos(-100), twos(-40000), twos(-3000000000), 1 << 63},
				Parent: twos(-2), HasParent: true, TokenIDs: []uint32{1, 2, 3, 4, 5}, BlockSize: 1},
			{Kind: BlockRemoved, BlockHashes: []uint64{twos(-1)}},
		}},
	},
	{
		name: "sglang_cache_salt",
		about: `SGLang with a cache salt. Legacy arrays (BlockStoredWithMetadata, kw_only) append
a metadata map right after medium; current map events carry cache_salt (and
session_id, ignored) as keys. The batch array's third field is attn_dp_rank.`,
		build: func(a *annotator) {
			a.array(3, "EventBatch [ts, events, attn_dp_rank]", func() {
				a.float(1700000004, "ts")
				a.array(2, "events", func() {
					a.array(8, "BlockStored, legacy array with metadata", func() {
						a.str("BlockStored", "tag")
						a.uints([]uint64{11}, "block_hashes")
						a.nil("parent_block_hash")
						a.uints([]uint64{1, 2}, "token_ids")
						a.uint(2, "block_size")
						a.nil("lora_id")
						a.str("GPU", "medium")
						a.mapOf(1, "metadata", func() {
							a.field("cache_salt", func() { a.str("tenant-a", "cache_salt") })
						})
					})
					a.mapOf(9, "BlockStored, map event", func() {
						a.field("type", func() { a.str("BlockStored", "tag") })
						a.field("block_hashes", func() { a.uints([]uint64{12}, "block_hashes") })
						a.field("parent_block_hash", func() { a.uint(11, "parent") })
						a.field("token_ids", func() { a.uints([]uint64{3, 4}, "token_ids") })
						a.field("block_size", func() { a.uint(2, "block_size") })
						a.field("lora_id", func() { a.nil("lora_id") })
						a.field("medium", func() { a.str("CPU_PINNED", "medium") })
						a.field("cache_salt", func() { a.str("tenant-b", "cache_salt") })
						a.field("session_id", func() { a.str("s-1", "session_id: known, unused") })
					})
				})
				a.uint(3, "attn_dp_rank")
			})
		},
		want: EventBatch{TS: 1700000004, DPRank: 3, HasDPRank: true, Events: []Event{
			{Kind: BlockStored, BlockHashes: []uint64{11}, TokenIDs: []uint32{1, 2}, BlockSize: 2, CacheSalt: "tenant-a"},
			{Kind: BlockStored, BlockHashes: []uint64{12}, Parent: 11, HasParent: true, TokenIDs: []uint32{3, 4}, BlockSize: 2,
				Medium: MediumCPUPinned, CacheSalt: "tenant-b"},
		}},
	},
	{
		name: "media",
		about: `Every medium: nil and absent mean GPU; names match in any case; an unknown
name is classified by family (FS and OBJ are storage, LMCache's backends by
their CPU/Disk/Remote part); only an unclassifiable one is counted and kept as
MediumUnknown (indexed as GPU).`,
		build: func(a *annotator) {
			media := []func(){
				func() { a.nil("medium nil") },
				func() { a.str("GPU", "medium") },
				func() { a.str("CPU", "medium") },
				func() { a.str("CPU_PINNED", "medium") },
				func() { a.str("DISK", "medium") },
				func() { a.str("STORAGE", "medium") },
				func() { a.str("EXTERNAL", "medium") },
				func() { a.str("cpu_pinned", "medium, lower case") },
				func() { a.str("FS", "medium, vLLM's short-lived file-system storage") },
				func() { a.str("LocalDiskBackend", "medium, an LMCache backend") },
				func() { a.str("LocalCPUBackend", "medium, an LMCache backend") },
				func() { a.str("RemoteBackend", "medium, an LMCache backend") },
				func() { a.str("HBM3", "medium, unknown") },
			}
			a.array(3, "EventBatch", func() {
				a.float(1700000005, "ts")
				a.array(len(media)+1, "events", func() {
					for i, m := range media {
						a.array(3, "BlockRemoved", func() {
							a.str("BlockRemoved", "tag")
							a.uints([]uint64{uint64(i)}, "block_hashes")
							m()
						})
					}
					a.array(2, "BlockRemoved without medium", func() {
						a.str("BlockRemoved", "tag")
						a.uints([]uint64{99}, "block_hashes")
					})
				})
				a.nil("data_parallel_rank")
			})
		},
		want: EventBatch{TS: 1700000005, Events: []Event{
			{Kind: BlockRemoved, BlockHashes: []uint64{0}, Medium: MediumGPU},
			{Kind: BlockRemoved, BlockHashes: []uint64{1}, Medium: MediumGPU},
			{Kind: BlockRemoved, BlockHashes: []uint64{2}, Medium: MediumCPU},
			{Kind: BlockRemoved, BlockHashes: []uint64{3}, Medium: MediumCPUPinned},
			{Kind: BlockRemoved, BlockHashes: []uint64{4}, Medium: MediumDisk},
			{Kind: BlockRemoved, BlockHashes: []uint64{5}, Medium: MediumStorage},
			{Kind: BlockRemoved, BlockHashes: []uint64{6}, Medium: MediumExternal},
			{Kind: BlockRemoved, BlockHashes: []uint64{7}, Medium: MediumCPUPinned},
			{Kind: BlockRemoved, BlockHashes: []uint64{8}, Medium: MediumStorage},
			{Kind: BlockRemoved, BlockHashes: []uint64{9}, Medium: MediumDisk},
			{Kind: BlockRemoved, BlockHashes: []uint64{10}, Medium: MediumCPU},
			{Kind: BlockRemoved, BlockHashes: []uint64{11}, Medium: MediumExternal},
			{Kind: BlockRemoved, BlockHashes: []uint64{12}, Medium: MediumUnknown},
			{Kind: BlockRemoved, BlockHashes: []uint64{99}, Medium: MediumGPU},
		}},
		stats: DecodeStats{UnknownMedia: 1, FirstUnknownMedium: "HBM3"},
	},
	{
		name: "trailing_fields",
		about: `Fields from engine versions newer than ours: a batch array with two extra
fields, a BlockStored array with all 14 known fields and two more (17 elements: an
array16 header), a map event with an unknown key, a BlockRemoved map with a field
only BlockStored has, an AllBlocksCleared with a field. All are skipped and counted
(7); the known ones are read.`,
		build: func(a *annotator) {
			a.array(5, "EventBatch with 2 trailing fields", func() {
				a.float(1700000006, "ts")
				a.array(4, "events", func() {
					a.array(17, "BlockStored, 14 known fields + 2 unknown", func() {
						a.str("BlockStored", "tag")
						a.uints([]uint64{21}, "block_hashes")
						a.uint(20, "parent_block_hash")
						a.uints([]uint64{1, 2, 3, 4}, "token_ids")
						a.uint(4, "block_size")
						a.uint(3, "lora_id")
						a.str("DISK", "medium")
						a.str("lora-x", "lora_name")
						a.array(1, "extra_keys", func() {
							a.array(2, "keys of block 0: LoRA name, one image; no salt", func() {
								a.str("lora-x", "LoRA name")
								a.array(2, "multimodal key", func() {
									a.str("img-1", "identifier")
									a.uint(0, "offset in the block")
								})
							})
						})
						a.uint(1, "group_idx")
						a.str("sliding_window", "kv_cache_spec_kind")
						a.uint(128, "kv_cache_spec_sliding_window")
						a.str("LOCAL", "locality")
						a.str("OWNED", "ownership (skipped)")
						a.str("sess-9", "session_id (skipped)")
						a.uint(42, "unknown #1")
						a.array(2, "unknown #2", func() {
							a.uint(1, "")
							a.array(1, "", func() { a.uint(2, "") })
						})
					})
					a.mapOf(5, "BlockStored map with an unknown key", func() {
						a.field("type", func() { a.str("BlockStored", "tag") })
						a.field("block_hashes", func() { a.uints([]uint64{22}, "block_hashes") })
						a.field("token_ids", func() { a.uints([]uint64{5, 6, 7, 8}, "token_ids") })
						a.field("block_size", func() { a.uint(4, "block_size") })
						a.field("future_field", func() {
							a.mapOf(1, "unknown #3", func() {
								a.field("a", func() { a.uints([]uint64{1, 2}, "") })
							})
						})
					})
					a.mapOf(3, "BlockRemoved map with token_ids", func() {
						a.field("type", func() { a.str("BlockRemoved", "tag") })
						a.field("token_ids", func() { a.uints([]uint64{1}, "not a BlockRemoved field: unknown #4") })
						a.field("block_hashes", func() { a.uints([]uint64{21}, "block_hashes") })
					})
					a.array(2, "AllBlocksCleared with a field", func() {
						a.str("AllBlocksCleared", "tag")
						a.str("GPU", "unknown #5")
					})
				})
				a.uint(0, "data_parallel_rank")
				a.str("extra", "unknown #6")
				a.mapOf(1, "unknown #7", func() { a.field("x", func() { a.uint(1, "") }) })
			})
		},
		want: EventBatch{TS: 1700000006, HasDPRank: true, Events: []Event{
			{Kind: BlockStored, BlockHashes: []uint64{21}, Parent: 20, HasParent: true, TokenIDs: []uint32{1, 2, 3, 4}, BlockSize: 4,
				LoRAID: 3, HasLoRAID: true, Medium: MediumDisk, LoRAName: "lora-x", GroupIdx: 1, HasGroupIdx: true,
				KVCacheSpecKind: "sliding_window", SlidingWindow: 128, HasSlidingWindow: true, Locality: "LOCAL"},
			{Kind: BlockStored, BlockHashes: []uint64{22}, TokenIDs: []uint32{5, 6, 7, 8}, BlockSize: 4},
			{Kind: BlockRemoved, BlockHashes: []uint64{21}},
			{Kind: AllBlocksCleared},
		}},
		stats: DecodeStats{UnknownFields: 7, FirstUnknownField: "BlockStored[14]"},
	},
	{
		name: "unknown_tags",
		about: `Events with tags we do not know are dropped and counted, in both forms. The
unknown map event's fields have types our known fields would reject (block_hashes is
a string): they are skipped unread because the tag comes first.`,
		build: func(a *annotator) {
			a.array(3, "EventBatch", func() {
				a.float(1700000007, "ts")
				a.array(4, "events", func() {
					a.array(7, "BlockStored", func() {
						a.str("BlockStored", "tag")
						a.uints([]uint64{31}, "block_hashes")
						a.nil("parent_block_hash")
						a.uints([]uint64{5, 6}, "token_ids")
						a.uint(2, "block_size")
						a.nil("lora_id")
						a.nil("medium")
					})
					a.array(3, "unknown array event", func() {
						a.str("BlockMigrated", "tag")
						a.uints([]uint64{31}, "")
						a.str("node-b", "")
					})
					a.mapOf(3, "unknown map event", func() {
						a.field("type", func() { a.str("KVTransferred", "tag") })
						a.field("block_hashes", func() { a.str("not-a-list", "") })
						a.field("x", func() {
							a.mapOf(1, "", func() { a.field("y", func() { a.uints([]uint64{1, 2, 3}, "") }) })
						})
					})
					a.mapOf(3, "BlockRemoved", func() {
						a.field("type", func() { a.str("BlockRemoved", "tag") })
						a.field("block_hashes", func() { a.uints([]uint64{31}, "block_hashes") })
						a.field("medium", func() { a.nil("medium") })
					})
				})
				a.uint(0, "data_parallel_rank")
			})
		},
		want: EventBatch{TS: 1700000007, HasDPRank: true, Events: []Event{
			{Kind: BlockStored, BlockHashes: []uint64{31}, TokenIDs: []uint32{5, 6}, BlockSize: 2},
			{Kind: BlockRemoved, BlockHashes: []uint64{31}},
		}},
		stats: DecodeStats{UnknownEvents: 2, FirstUnknownEvent: "BlockMigrated"},
	},
	{
		name: "map_batch_array_events",
		about: `A map batch whose events are tagged arrays, with the tag written after the
fields in a map event too (msgspec writes it first, but maps are unordered), and a
batch key we do not know.`,
		build: func(a *annotator) {
			a.mapOf(4, "EventBatch", func() {
				a.field("events", func() {
					a.array(2, "events", func() {
						a.array(5, "BlockStored, 4 fields", func() {
							a.str("BlockStored", "tag")
							a.uints([]uint64{41}, "block_hashes")
							a.uint(40, "parent_block_hash")
							a.uints([]uint64{1, 2}, "token_ids")
							a.uint(2, "block_size")
						})
						a.mapOf(3, "BlockRemoved, type last", func() {
							a.field("block_hashes", func() { a.uints([]uint64{41}, "block_hashes") })
							a.field("medium", func() { a.str("EXTERNAL", "medium") })
							a.field("type", func() { a.str("BlockRemoved", "tag") })
						})
					})
				})
				a.field("ts", func() { a.int(1700000008, "ts as an integer") })
				a.field("producer", func() { a.str("relay", "unknown key") })
				a.field("data_parallel_rank", func() { a.nil("no rank") })
			})
		},
		want: EventBatch{TS: 1700000008, Events: []Event{
			{Kind: BlockStored, BlockHashes: []uint64{41}, Parent: 40, HasParent: true, TokenIDs: []uint32{1, 2}, BlockSize: 2},
			{Kind: BlockRemoved, BlockHashes: []uint64{41}, Medium: MediumExternal},
		}},
		stats: DecodeStats{UnknownFields: 1, FirstUnknownField: "producer"},
	},
}

func goldenPath(name string) string { return filepath.Join("testdata", "decode", name+".hex") }

func TestDecodeGolden(t *testing.T) {
	for _, c := range goldenCases {
		t.Run(c.name, func(t *testing.T) {
			a := newAnnotator()
			c.build(a)
			if *update {
				if err := os.MkdirAll(filepath.Dir(goldenPath(c.name)), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(goldenPath(c.name), []byte(a.text(c.about)), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			text, err := os.ReadFile(goldenPath(c.name))
			if err != nil {
				t.Fatalf("%v (run go test -run TestDecodeGolden -update to create it)", err)
			}
			payload, err := parseAnnotatedHex(string(text))
			if err != nil {
				t.Fatalf("golden file: %v", err)
			}
			if !bytes.Equal(payload, a.buf.Bytes()) {
				t.Fatalf("golden file differs from its case (run with -update and review the diff)")
			}
			got, stats, err := NewDecoder(0).Decode(payload)
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if !reflect.DeepEqual(got, c.want) {
				t.Errorf("batch:\n got %+v\nwant %+v", got, c.want)
			}
			if stats != c.stats {
				t.Errorf("stats: got %+v, want %+v", stats, c.stats)
			}
		})
	}
}

// h is a hex literal with spaces allowed, for hand-written bad payloads.
func h(s string) []byte {
	b, err := hex.DecodeString(strings.ReplaceAll(s, " ", ""))
	if err != nil {
		panic(err)
	}
	return b
}

func TestDecodeRejectsMalformed(t *testing.T) {
	// A valid prefix: array(3) ts=float64 0.
	const ts = "93 cb 0000000000000000"
	cases := []struct {
		name    string
		payload []byte
		want    string // substring of the error
	}{
		{"empty", nil, "truncated"},
		{"not msgpack container", h("c3"), "want array or map"},
		{"batch array too short", h("91 cb 0000000000000000"), "want [ts, events"},
		{"ts is a string", h("92 a1 78 90"), "ts is msgpack code 0xa1"},
		{"events nil", h("92 cb 0000000000000000 c0"), "events is nil"},
		{"events not a list", h("92 cb 0000000000000000 05"), "events: msgpack code 0x05, want an array"},
		{"event is a number", h(ts + "91 07 c0"), "events[0]: event is msgpack code 0x07"},
		{"event array without tag", h(ts + "91 90 c0"), "events[0]: event array has no tag"},
		{"event tag not a string", h(ts + "91 91 01 c0"), "event tag is msgpack code 0x01"},
		{"event map without type", h(ts + "91 81 a5 6d656469756d c0 c0"), "event map has no type"},
		{"BlockStored array too short", h(ts + "91 93 ab 426c6f636b53746f726564 91 01 c0 c0"),
			"BlockStored array has 2 fields, want at least 4"},
		{"BlockStored map without token_ids", h(ts + "91 83 a4 74797065 ab 426c6f636b53746f726564 ac 626c6f636b5f686173686573 91 01 aa 626c6f636b5f73697a65 04 c0"),
			"BlockStored without token_ids"},
		{"hash is a string", h(ts + "91 92 ac 426c6f636b52656d6f766564 91 a1 78 c0"), "block_hashes: [0]: hash is msgpack code 0xa1"},
		{"hash is nil", h(ts + "91 92 ac 426c6f636b52656d6f766564 91 c0 c0"), "block_hashes: [0]: hash is msgpack code 0xc0"},
		{"hash is empty bytes", h(ts + "91 92 ac 426c6f636b52656d6f766564 91 c4 00 c0"), "empty byte-string hash"},
		{"block_hashes nil", h(ts + "91 92 ac 426c6f636b52656d6f766564 c0 c0"), "block_hashes: nil"},
		{"negative token id", h(ts + "91 95 ab 426c6f636b53746f726564 91 01 c0 91 ff 01 c0"), "token_ids: [0]: -1 out of range"},
		{"token id over uint32", h(ts + "91 95 ab 426c6f636b53746f726564 91 01 c0 91 cf 0000000100000000 01 c0"), "token_ids: [0]: 4294967296 out of range"},
		{"token id is a float", h(ts + "91 95 ab 426c6f636b53746f726564 91 01 c0 91 cb 3ff0000000000000 01 c0"), "token_ids: [0]: msgpack code 0xcb, want integer"},
		{"negative block size", h(ts + "91 95 ab 426c6f636b53746f726564 91 01 c0 91 01 ff c0"), "block_size: -1 out of range"},
		{"medium is a number", h(ts + "91 93 ac 426c6f636b52656d6f766564 91 01 07 c0"), "medium: medium is msgpack code 0x07"},
		{"lora_id is a string", h(ts + "91 96 ab 426c6f636b53746f726564 91 01 c0 91 01 01 a1 78 c0"), "lora_id: msgpack code 0xa1"},
		{"dp rank negative", h("93 cb 0000000000000000 90 ff"), "data_parallel_rank: -1 out of range"},
		{"trailing extensions are skipped", h("95 cb 0000000000000000 90 c0 d4 01 07 c7 02 01 aabb"), ""},
		{"extension cut short", h("94 cb 0000000000000000 90 c0 c7 09 01 aabb"), "9-byte extension with 2 bytes left"},
		{"dp rank at uint32 max", h("93 cb 0000000000000000 90 ce ffffffff"), ""},
		{"dp rank over uint32", h("93 cb 0000000000000000 90 cf 0000000100000000"), "data_parallel_rank: 4294967296 out of range"},
		{"batch map without ts", h("81 a6 6576656e7473 90"), "needs both ts and events"},
		{"trailing bytes", h("92 cb 0000000000000000 90 00"), "1 bytes after the batch"},
		{"truncated inside a float", h("92 cb 0000"), "truncated"},
		{"truncated token list", h(ts + "91 95 ab 426c6f636b53746f726564 91 01 c0 93 01"), "truncated"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, _, err := NewDecoder(0).Decode(c.payload)
			if c.want == "" {
				if err != nil {
					t.Fatalf("want success, got %v", err)
				}
				return
			}
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("got %v, want an ErrMalformed", err)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %q does not say %q", err, c.want)
			}
		})
	}
}

func TestDecodeRejectsOversize(t *testing.T) {
	payload := encodeBatch(EventBatch{Events: []Event{{Kind: AllBlocksCleared}}}, false, false)
	if _, _, err := NewDecoder(len(payload)).Decode(payload); err != nil {
		t.Fatalf("payload at the limit: %v", err)
	}
	_, _, err := NewDecoder(len(payload) - 1).Decode(payload)
	if !errors.Is(err, ErrOversize) {
		t.Fatalf("payload over the limit: got %v, want ErrOversize", err)
	}
}

// Length prefixes that claim more than the payload holds must fail before anything
// of that size is allocated.
func TestDecodeBogusLengthsAllocateLittle(t *testing.T) {
	stored := "ab 426c6f636b53746f726564"
	cases := map[string][]byte{
		"events array32":    h("92 cb 0000000000000000 dd ffffffff"),
		"hashes array32":    h("92 cb 0000000000000000 91 92 ac 426c6f636b52656d6f766564 dd ffffffff"),
		"tokens array32":    h("92 cb 0000000000000000 91 95 " + stored + " 91 01 c0 dd 7fffffff"),
		"bin32 hash":        h("92 cb 0000000000000000 91 92 ac 426c6f636b52656d6f766564 91 c6 ffffffff"),
		"str32 medium":      h("92 cb 0000000000000000 91 93 ac 426c6f636b52656d6f766564 91 01 db ffffffff"),
		"map32 batch":       h("df ffffffff"),
		"str32 unknown key": h("81 db 7fffffff"),
		"ext32 skipped":     h("92 cb 0000000000000000 91 92 a3 466f6f c9 7fffffff 01"),
		"str32 skipped":     h("92 cb 0000000000000000 91 92 a3 466f6f db 7fffffff"),
		// A million events claimed and a megabyte to hold them: each is an empty array.
		"events array32 with room": append(h("92 cb 0000000000000000 dd 000f4240"), bytes.Repeat([]byte{0x90}, 1_000_000)...),
		"hashes array32 with room": append(h("92 cb 0000000000000000 91 92 ac 426c6f636b52656d6f766564 dd 000f4240"),
			bytes.Repeat([]byte{0xc0}, 1_000_000)...),
		"tokens array32 with room": append(h("92 cb 0000000000000000 91 95 "+stored+" 91 01 c0 dd 000f4240"),
			bytes.Repeat([]byte{0xc0}, 1_000_000)...),
	}
	for name, payload := range cases {
		t.Run(name, func(t *testing.T) {
			dec := NewDecoder(0)
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			_, _, err := dec.Decode(payload)
			runtime.ReadMemStats(&after)
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("got %v, want ErrMalformed", err)
			}
			if grew := after.TotalAlloc - before.TotalAlloc; grew > 256<<10 {
				t.Fatalf("decoding %d bytes allocated %d bytes", len(payload), grew)
			}
		})
	}
}

func TestDecodeDeepNestingIsAnError(t *testing.T) {
	// An unknown trailing batch field made of 100k nested one-element arrays.
	depth := 100_000
	payload := append(h("94 cb 0000000000000000 90 c0"), bytes.Repeat([]byte{0x91}, depth)...)
	payload = append(payload, 0x01)
	_, _, err := NewDecoder(0).Decode(payload)
	if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), "nested deeper than") {
		t.Fatalf("got %v, want a nesting error", err)
	}
}

func TestDecodeRoundTripsEveryForm(t *testing.T) {
	batch := EventBatch{TS: 1.5e9, DPRank: 7, HasDPRank: true, Events: []Event{
		{Kind: BlockStored, BlockHashes: []uint64{1, math.MaxUint64}, Parent: 1 << 63, HasParent: true,
			TokenIDs: []uint32{0, math.MaxUint32, 3, 4}, BlockSize: 2, LoRAID: -3, HasLoRAID: true, Medium: MediumStorage,
			LoRAName: "l", CacheSalt: "salt", GroupIdx: 2, HasGroupIdx: true, KVCacheSpecKind: "k",
			SlidingWindow: 4096, HasSlidingWindow: true, Locality: "REMOTE"},
		{Kind: BlockStored, BlockHashes: []uint64{9}, TokenIDs: []uint32{1, 2}, BlockSize: 2},
		{Kind: BlockRemoved, BlockHashes: []uint64{1, 9}, Medium: MediumCPU, GroupIdx: 1, HasGroupIdx: true, Locality: "x"},
		{Kind: AllBlocksCleared},
	}}
	for _, batchAsMap := range []bool{false, true} {
		for _, eventsAsMap := range []bool{false, true} {
			name := fmt.Sprintf("batchAsMap=%v/eventsAsMap=%v", batchAsMap, eventsAsMap)
			got, stats, err := NewDecoder(0).Decode(encodeBatch(batch, batchAsMap, eventsAsMap))
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if !reflect.DeepEqual(got, batch) {
				t.Errorf("%s:\n got %+v\nwant %+v", name, got, batch)
			}
			if stats != (DecodeStats{}) {
				t.Errorf("%s: stats %+v, want none", name, stats)
			}
		}
	}
}

// A Decoder reuses its scratch buffer; decoded strings must not alias it.
func TestDecodedBatchSharesNothingWithTheDecoder(t *testing.T) {
	dec := NewDecoder(0)
	first := EventBatch{Events: []Event{{Kind: BlockStored, BlockHashes: []uint64{1}, TokenIDs: []uint32{1}, BlockSize: 1,
		LoRAName: "adapter-one", CacheSalt: "salt-one", Medium: MediumDisk}}}
	got, _, err := dec.Decode(encodeBatch(first, true, true))
	if err != nil {
		t.Fatal(err)
	}
	second := first
	second.Events = []Event{{Kind: BlockStored, BlockHashes: []uint64{2}, TokenIDs: []uint32{2}, BlockSize: 1,
		LoRAName: "ADAPTER-TWO", CacheSalt: "SALT-TWO"}}
	if _, _, err := dec.Decode(encodeBatch(second, true, true)); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, first) {
		t.Fatalf("first batch changed after a second Decode:\n got %+v\nwant %+v", got, first)
	}
}

func TestDecodeMetadataKeepsCacheSaltAndCountsTheRest(t *testing.T) {
	a := newAnnotator()
	a.array(2, "EventBatch", func() {
		a.float(1, "ts")
		a.array(1, "events", func() {
			a.array(8, "BlockStored with metadata", func() {
				a.str("BlockStored", "tag")
				a.uints([]uint64{1}, "block_hashes")
				a.nil("parent")
				a.uints([]uint64{1}, "token_ids")
				a.uint(1, "block_size")
				a.nil("lora_id")
				a.nil("medium")
				a.mapOf(3, "metadata", func() {
					a.field("priority", func() { a.uint(1, "unknown") })
					a.field("cache_salt", func() { a.str("s", "") })
					a.uint(7, "non-string key")
					a.uint(8, "its value")
				})
			})
		})
	})
	got, stats, err := NewDecoder(0).Decode(a.buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Events) != 1 || got.Events[0].CacheSalt != "s" {
		t.Fatalf("events %+v, want one with cache salt \"s\"", got.Events)
	}
	want := DecodeStats{UnknownFields: 2, FirstUnknownField: "metadata.priority"}
	if stats != want {
		t.Fatalf("stats %+v, want %+v", stats, want)
	}
}

func TestNamesOfKindsAndMedia(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{BlockStored.String(), "BlockStored"}, {BlockRemoved.String(), "BlockRemoved"},
		{AllBlocksCleared.String(), "AllBlocksCleared"}, {EventKind(9).String(), "EventKind(?)"},
		{MediumCPUPinned.String(), "CPU_PINNED"}, {MediumUnknown.String(), "UNKNOWN"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
}

func TestFieldNamesResolveToTheirFields(t *testing.T) {
	for f := field(0); f < numFields; f++ {
		if got, ok := fieldByName([]byte(fieldNames[f])); !ok || got != f {
			t.Errorf("fieldByName(%q) = %d, %v; want %d", fieldNames[f], got, ok, f)
		}
	}
	if _, ok := fieldByName([]byte("type")); ok {
		t.Errorf(`"type" must not be a field: it is the tag`)
	}
}

func TestMediumTiers(t *testing.T) {
	want := map[Medium]radix.Tier{
		MediumGPU: radix.TierGPU, MediumUnknown: radix.TierGPU,
		MediumCPU: radix.TierCPU, MediumCPUPinned: radix.TierCPU,
		MediumDisk: radix.TierDisk, MediumStorage: radix.TierDisk, MediumExternal: radix.TierDisk,
	}
	for m := MediumGPU; m <= MediumUnknown; m++ {
		ev := Event{Medium: m}
		if got := ev.Tier(); got != want[m] {
			t.Errorf("%s: tier %s, want %s", m, got, want[m])
		}
	}
}

// benchBatch is a realistic decode load: 32 single-block BlockStored events of 16
// tokens and one 64-block event (a long prompt), hashes as vLLM sends them (large
// uint64).
func benchBatch() (EventBatch, int) {
	b := EventBatch{TS: 1.7e9, HasDPRank: true}
	hash := uint64(0x9e3779b97f4a7c15)
	tokens := func(n int) []uint32 {
		ts := make([]uint32, n)
		for i := range ts {
			ts[i] = uint32(1000 + i*37%150000)
		}
		return ts
	}
	blocks := 0
	for i := 0; i < 32; i++ {
		hash *= 0xbf58476d1ce4e5b9
		b.Events = append(b.Events, Event{Kind: BlockStored, BlockHashes: []uint64{hash}, Parent: hash ^ 1, HasParent: true,
			TokenIDs: tokens(16), BlockSize: 16})
		blocks++
	}
	long := Event{Kind: BlockStored, TokenIDs: tokens(64 * 16), BlockSize: 16}
	for i := 0; i < 64; i++ {
		hash *= 0xbf58476d1ce4e5b9
		long.BlockHashes = append(long.BlockHashes, hash)
	}
	b.Events = append(b.Events, long)
	return b, blocks + 64
}

// BenchmarkDecode reports block events (one per block hash) decoded per second.
func BenchmarkDecode(b *testing.B) {
	batch, blocks := benchBatch()
	for _, form := range []struct {
		name                    string
		batchAsMap, eventsAsMap bool
	}{{"array", false, false}, {"map", true, true}} {
		payload := encodeBatch(batch, form.batchAsMap, form.eventsAsMap)
		b.Run(form.name, func(b *testing.B) {
			dec := NewDecoder(0)
			b.SetBytes(int64(len(payload)))
			b.ReportAllocs()
			for b.Loop() {
				if _, _, err := dec.Decode(payload); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(blocks)*float64(b.N)/b.Elapsed().Seconds(), "blocks/s")
		})
	}
}

// annotator writes msgpack with vmihailenco's encoder (compact ints and float64, as
// msgspec writes them) and records a comment for every byte group, so golden files
// document themselves.
type annotator struct {
	buf   bytes.Buffer
	enc   *msgpack.Encoder
	lines []string
	depth int
}

func newAnnotator() *annotator {
	a := &annotator{}
	a.enc = msgpack.NewEncoder(&a.buf)
	return a
}

func (a *annotator) emit(comment string, write func(*msgpack.Encoder) error) {
	start := a.buf.Len()
	if err := write(a.enc); err != nil {
		panic(err) // writing to a bytes.Buffer cannot fail
	}
	written := a.buf.Bytes()[start:]
	a.lines = append(a.lines, fmt.Sprintf("%-40s # %s%-15s %s",
		hex.EncodeToString(written), strings.Repeat("  ", a.depth), codeName(written[0]), comment))
}

// codeName names the msgpack type of a leading byte, for golden-file comments.
func codeName(c byte) string {
	switch {
	case c <= 0x7f:
		return "pos fixint"
	case c >= 0xe0:
		return "neg fixint"
	case c >= 0x80 && c <= 0x8f:
		return "fixmap"
	case c >= 0x90 && c <= 0x9f:
		return "fixarray"
	case c >= 0xa0 && c <= 0xbf:
		return "fixstr"
	}
	names := map[byte]string{0xc0: "nil", 0xc4: "bin8", 0xc5: "bin16", 0xc6: "bin32", 0xca: "float32", 0xcb: "float64",
		0xcc: "uint8", 0xcd: "uint16", 0xce: "uint32", 0xcf: "uint64", 0xd0: "int8", 0xd1: "int16", 0xd2: "int32",
		0xd3: "int64", 0xd9: "str8", 0xda: "str16", 0xdb: "str32", 0xdc: "array16", 0xdd: "array32", 0xde: "map16", 0xdf: "map32"}
	if n, ok := names[c]; ok {
		return n
	}
	return fmt.Sprintf("code 0x%02x", c)
}

func (a *annotator) nested(body func()) {
	a.depth++
	body()
	a.depth--
}

func (a *annotator) array(n int, comment string, body func()) {
	a.emit(fmt.Sprintf("%d elements: %s", n, comment), func(e *msgpack.Encoder) error { return e.EncodeArrayLen(n) })
	a.nested(body)
}

func (a *annotator) mapOf(n int, comment string, body func()) {
	a.emit(fmt.Sprintf("%d entries: %s", n, comment), func(e *msgpack.Encoder) error { return e.EncodeMapLen(n) })
	a.nested(body)
}

// field writes a map key and then its value.
func (a *annotator) field(key string, value func()) {
	a.str(key, "key")
	a.nested(value)
}

func (a *annotator) str(s, comment string) {
	a.emit(fmt.Sprintf("%q%s", s, paren(comment)), func(e *msgpack.Encoder) error { return e.EncodeString(s) })
}

func (a *annotator) uint(v uint64, comment string) {
	a.emit(fmt.Sprintf("%d%s", v, paren(comment)), func(e *msgpack.Encoder) error { return e.EncodeUint(v) })
}

func (a *annotator) int(v int64, comment string) {
	a.emit(fmt.Sprintf("%d%s", v, paren(comment)), func(e *msgpack.Encoder) error { return e.EncodeInt(v) })
}

func (a *annotator) float(v float64, comment string) {
	a.emit(fmt.Sprintf("%v%s", v, paren(comment)), func(e *msgpack.Encoder) error { return e.EncodeFloat64(v) })
}

func (a *annotator) nil(comment string) {
	a.emit(strings.TrimSpace(paren(comment)), func(e *msgpack.Encoder) error { return e.EncodeNil() })
}

func (a *annotator) bin(b []byte, comment string) {
	a.emit(fmt.Sprintf("%d bytes%s", len(b), paren(comment)), func(e *msgpack.Encoder) error { return e.EncodeBytes(b) })
}

func paren(comment string) string {
	if comment == "" {
		return ""
	}
	return " (" + comment + ")"
}

func (a *annotator) uints(vs []uint64, comment string) {
	a.array(len(vs), comment, func() {
		for _, v := range vs {
			a.uint(v, "")
		}
	})
}

func (a *annotator) text(header string) string {
	var sb strings.Builder
	for _, l := range strings.Split(strings.TrimSpace(header), "\n") {
		sb.WriteString("# " + l + "\n")
	}
	sb.WriteString("#\n# hex bytes                              # msgpack type, indented by nesting, and meaning\n")
	for _, l := range a.lines {
		sb.WriteString(l + "\n")
	}
	return sb.String()
}

// parseAnnotatedHex reads a golden file: hex digits, with '#' starting a comment
// that runs to the end of the line.
func parseAnnotatedHex(text string) ([]byte, error) {
	var digits strings.Builder
	for _, line := range strings.Split(text, "\n") {
		line, _, _ = strings.Cut(line, "#")
		digits.WriteString(strings.Join(strings.Fields(line), ""))
	}
	return hex.DecodeString(digits.String())
}

// encodeBatch encodes b as an engine would, in one of the four batch/event forms.
// It writes every field the decoder reads, so decode(encodeBatch(b)) must equal b.
func encodeBatch(b EventBatch, batchAsMap, eventsAsMap bool) []byte {
	var buf bytes.Buffer
	e := msgpack.NewEncoder(&buf)
	must := func(err error) {
		if err != nil {
			panic(err)
		}
	}
	optUint := func(v uint64, ok bool) {
		if ok {
			must(e.EncodeUint(v))
		} else {
			must(e.EncodeNil())
		}
	}
	optInt := func(v int64, ok bool) {
		if ok {
			must(e.EncodeInt(v))
		} else {
			must(e.EncodeNil())
		}
	}
	optStr := func(s string) {
		if s != "" {
			must(e.EncodeString(s))
		} else {
			must(e.EncodeNil())
		}
	}
	values := func(ev Event) []func() {
		hashes := func() {
			must(e.EncodeArrayLen(len(ev.BlockHashes)))
			for _, h := range ev.BlockHashes {
				must(e.EncodeUint(h))
			}
		}
		medium := func() {
			if ev.Medium == MediumGPU {
				must(e.EncodeNil())
			} else {
				must(e.EncodeString(ev.Medium.String()))
			}
		}
		switch ev.Kind {
		case BlockStored:
			return []func(){
				hashes,
				func() { optUint(ev.Parent, ev.HasParent) },
				func() {
					must(e.EncodeArrayLen(len(ev.TokenIDs)))
					for _, t := range ev.TokenIDs {
						must(e.EncodeUint(uint64(t)))
					}
				},
				func() { must(e.EncodeInt(int64(ev.BlockSize))) },
				func() { optInt(ev.LoRAID, ev.HasLoRAID) },
				medium,
				func() { optStr(ev.LoRAName) },
				func() { must(e.EncodeNil()) }, // extra_keys
				func() { optInt(ev.GroupIdx, ev.HasGroupIdx) },
				func() { optStr(ev.KVCacheSpecKind) },
				func() { optInt(ev.SlidingWindow, ev.HasSlidingWindow) },
				func() { optStr(ev.Locality) },
			}
		case BlockRemoved:
			return []func(){hashes, medium,
				func() { optInt(ev.GroupIdx, ev.HasGroupIdx) },
				func() { optStr(ev.Locality) }}
		}
		return nil
	}
	encodeEvent := func(ev Event) {
		vs := values(ev)
		names := fieldOrder[ev.Kind]
		salted := ev.Kind == BlockStored && ev.CacheSalt != ""
		if eventsAsMap {
			n := 1 + len(vs)
			if salted {
				n++
			}
			must(e.EncodeMapLen(n))
			must(e.EncodeString("type"))
			must(e.EncodeString(ev.Kind.String()))
			for i, v := range vs {
				must(e.EncodeString(fieldNames[names[i]]))
				v()
			}
			if salted {
				must(e.EncodeString("cache_salt"))
				must(e.EncodeString(ev.CacheSalt))
			}
			return
		}
		n := 1 + len(vs)
		if salted {
			n++
		}
		must(e.EncodeArrayLen(n))
		must(e.EncodeString(ev.Kind.String()))
		for _, v := range vs {
			v()
		}
		if salted {
			must(e.EncodeMapLen(1))
			must(e.EncodeString("cache_salt"))
			must(e.EncodeString(ev.CacheSalt))
		}
	}
	events := func() {
		must(e.EncodeArrayLen(len(b.Events)))
		for _, ev := range b.Events {
			encodeEvent(ev)
		}
	}
	if batchAsMap {
		must(e.EncodeMapLen(3))
		must(e.EncodeString("ts"))
		must(e.EncodeFloat64(b.TS))
		must(e.EncodeString("events"))
		events()
		must(e.EncodeString("data_parallel_rank"))
		optUint(uint64(b.DPRank), b.HasDPRank)
	} else {
		must(e.EncodeArrayLen(3))
		must(e.EncodeFloat64(b.TS))
		events()
		optUint(uint64(b.DPRank), b.HasDPRank)
	}
	return buf.Bytes()
}
