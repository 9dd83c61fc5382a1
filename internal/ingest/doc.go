// Package ingest turns the KV-cache event streams of inference engines (vLLM,
// SGLang) into ordered, decoded batches for the index.
//
// This part of the package is pure and does no I/O: ZMQ frame and topic parsing
// (frame.go), msgpack decoding (decode.go, event.go) and per-stream sequence tracking
// (sequence.go). The sockets, NATS subscribers and the pipeline that drive them live
// beside it.
//
// # Wire format
//
// Checked against vLLM's vllm/distributed/kv_events.py and SGLang's
// python/sglang/srt/disaggregation/kv_events.py (both msgspec structs, tag=True,
// omit_defaults=True):
//
//   - A live message is [topic, seq uint64 big-endian, payload] (ParseFrame). The
//     topic is what the engine was configured with, possibly empty; llm-d publishes
//     "kv@<pod>@<model>" (ParseTopic).
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
//     an unknown string is counted and indexed as GPU (see Medium).
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
// # Sequence tracking
//
// One Tracker per stream (worker, dp rank) turns sequence numbers into actions; every
// clear of the worker's blocks rides on the batch applied after it, as
// StreamBatch.Reset does, and the Tracker's Cursor gives the batch's Seq and Epoch:
//
//	d := tr.Observe(frame.Seq)
//	switch {
//	case d.Action.Applies(): // decode; on error tr.Discard(), else submit with Reset: d.Action.Clears()
//	case d.Action == ActionGap: // hold the batch, send ReplayRequest(d.From)
//		// for each reply until the end marker or a timeout:
//		//     if a := tr.Replayed(reply.Seq); a.Applies() { submit it, Reset: a.Clears() }
//		// then: if a := tr.FinishReplay(); a.Applies() { submit the held batch, Reset: a.Clears() }
//	} // ActionDuplicate: drop it
//
// # Concurrency
//
// A Decoder and a Tracker each belong to one goroutine (one per socket, one per
// stream). Everything else in these files is a pure function, safe to call from
// anywhere.
package ingest
