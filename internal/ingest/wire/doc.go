// Package wire decodes what inference engines send on their KV-event sockets:
// ZMQ frames and topics, msgpack event batches of every vLLM revision and of
// SGLang, and the replay framing. It does no I/O, starts no goroutine and keeps
// no state but a Decoder's buffers; package ingest drives it.
//
// # Format
//
// Checked against vLLM's vllm/distributed/kv_events.py and SGLang's
// python/sglang/srt/disaggregation/kv_events.py (both msgspec structs, tag=True,
// omit_defaults=True):
//
//   - A live message is [topic, seq uint64 big-endian, payload] (ParseFrame). The
//     topic is what the engine was configured with, possibly empty; llm-d publishes
//     "kv@<pod>@<model>" (ParseTopic). The seq 2^64-1 is the replay end marker's
//     and is refused in a live message.
//   - The payload is an EventBatch: an array [ts, events, dp_rank|nil, ...] (vLLM up
//     to 0.2x and SGLang: array_like=True; old ones send only [ts, events]; SGLang
//     calls the rank attn_dp_rank) or a map {"ts", "events", "data_parallel_rank" or
//     "attn_dp_rank"} (current vLLM, which dropped array_like). Trailing array fields
//     and unknown keys are skipped and counted.
//   - An event is a tagged array [tag, fields...] (array_like with tag=True) or a
//     tagged map {"type": tag, field: value...} (current vLLM and SGLang). Tags:
//     BlockStored, BlockRemoved, AllBlocksCleared; other tags are skipped and counted.
//   - BlockStored fields in array order: block_hashes, parent_block_hash, token_ids,
//     block_size, lora_id, medium, lora_name, extra_keys, group_idx,
//     kv_cache_spec_kind, kv_cache_spec_sliding_window, locality, ownership,
//     session_id. The first four are required; omit_defaults lets an array end after
//     any later one. SGLang's BlockStoredWithMetadata appends a map
//     {"cache_salt": ...} right after medium; in arrays any map from the lora_name
//     position on is taken as that metadata. SGLang's map events carry cache_salt as
//     a key of their own. vLLM sends the salt only inside extra_keys (the first
//     block's tuple, after the LoRA name); the decoder takes it from there.
//   - BlockRemoved: block_hashes, medium, group_idx, locality, ownership.
//     AllBlocksCleared: no fields (any it has are counted and ignored, so it always
//     clears every tier).
//   - Block hashes are ints (vLLM uint64, SGLang signed int64: reinterpreted as
//     uint64) or bytes (vLLM's sha256 hashes: the last 8 bytes, big-endian; shorter
//     strings as if left-padded with zeros; an empty one is malformed).
//   - Medium: GPU, CPU, CPU_PINNED, DISK, STORAGE, EXTERNAL (any case), nil = GPU;
//     other names are classified by family (a name containing CPU is CPU; DISK,
//     FS, OBJ, STORAGE are storage; REMOTE is external: vLLM's short-lived FS/OBJ,
//     LMCache's backend names); an unclassifiable string is counted and indexed as
//     GPU (see Medium).
//   - parent_block_hash nil, absent or 0 means the chain starts at the root
//     (llm-d's publishers send 0).
//   - Replay: a DEALER sends ["", start_seq 8B BE] to the engine's ROUTER
//     (ReplayRequest) and receives ["", topic, seq, payload] (current vLLM) or
//     ["", seq, payload] (older vLLM, SGLang), then an end marker whose seq is
//     0xffffffffffffffff (ParseReplayReply).
//
// A malformed batch (bad msgpack, a known field of the wrong type, a required field
// missing, trailing bytes) is rejected whole with an error wrapping ErrMalformed:
// applying part of a batch would leave the index different from the engine in ways
// nobody could see. The decoder never panics, and allocates in proportion to what it
// actually reads, whatever length prefixes claim.
//
// The decode tests replay msgspec-encoded goldens of every vLLM KV-event
// revision (testdata/vllm, with their provenance) beside hand-annotated ones
// (testdata/decode).
//
// # Concurrency
//
// A Decoder belongs to one goroutine at a time; the functions are safe to call
// from anywhere.
package wire
