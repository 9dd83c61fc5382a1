// Package ingest turns the KV-cache event streams of inference engines (vLLM,
// SGLang) into ordered, decoded batches for the index.
//
// One part of the package is pure and does no I/O: ZMQ frame and topic parsing
// (frame.go), msgpack decoding (decode.go, event.go), per-stream sequence tracking
// (sequence.go), events to index operations (ops.go) and applying them (apply.go).
// The other part drives it: the Manager's ZMQ and NATS subscribers (manager.go,
// stream.go, zmq.go, nats.go, replay.go), the relay (relay.go) and the single-node
// hand-off to the index (localsink.go).
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
//     other names are classified by family (a name containing CPU is CPU; DISK,
//     FS, OBJ, STORAGE are storage; REMOTE is external: vLLM's short-lived FS/OBJ,
//     LMCache's backend names); an unclassifiable string is counted and indexed as
//     GPU (see Medium).
//   - parent_block_hash nil, absent or 0 means the chain starts at the root
//     (llm-d's publishers send 0).
//   - Placeholder BlockStored events (no token_ids, block_size 0: vLLM's offloading
//     connector) are skipped and counted (kvindex_ingest_refused_events_total
//     {reason="placeholder"}), never logged.
//   - Hybrid models publish one event per KV-cache group (group_idx,
//     kv_cache_spec_kind). Only full-attention groups (full_attention,
//     mla_attention, sink_full_attention; group 0 when no kind was ever sent for
//     the group) are indexed: a prefix hit needs the KV of every prefix token, and a
//     sliding-window, chunked-local or Mamba group keeps only part of it. Their
//     events, BlockRemoved included, are skipped and counted
//     ({reason="other_group"}); see opBuilder.indexes.
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
// # Pipeline
//
// A Manager keeps a registry of workers (workerspec.Spec: --worker flags, the
// --workers-file, AddWorker from a registry, and workers discovered on their first
// event) and, while Run runs, follows every one of them:
//
//   - Connect mode: one SUB socket per (worker, dp rank) dialing the rank's PUB
//     endpoint (the spec's endpoint, port + rank).
//   - Bind mode (--zmq-bind): one SUB socket that engines connect to. The worker is
//     the registered worker whose topic is exactly the frame's topic, else the pod
//     of llm-d's "kv@<pod>@<model>" topic (vLLM --kv-events-config
//     '{"topic": "kv@$POD_NAME@$MODEL"}'); a worker seen for the first time is
//     registered as "discovered" with that model. The dp rank is the batch's
//     data_parallel_rank.
//   - NATS: one subscription to <prefix>.*.*; see nats.go for the subject and
//     header convention (Kv-Seq) that the relay (RunRelay) follows.
//
// Each socket has one goroutine that receives and decodes; each stream has one
// goroutine that runs its Tracker, fills gaps over a DEALER to the engine's replay
// socket, computes block keys (kvblock, the worker's model and block size, the
// event's LoRA and cache salt) and hands StreamBatches to the Sink in order. A
// stream with a replay endpoint also replays when it starts (from its cursor, or
// the whole buffer for a stream the index does not know) and when it has been
// idle for IdleReplayInterval: engines send no heartbeat, so a lost last batch
// would otherwise stay unseen.
//
// The hand-off (batch.go) is what Raft goes between: a Sink receives ordered
// StreamBatches (LocalSink applies them through a bounded queue; a replicated sink
// proposes them), a CursorSource says where each stream stands (an Applier), and
// an Applier applies each batch exactly once.
//
// Bad input (malformed frames and payloads, unknown topics, oversize frames) is
// counted in kvindex_ingest_decode_errors_total, logged at most once per interval
// per kind, and dropped; it never stops a socket. metrics.go lists every metric.
//
// # Concurrency
//
// A Decoder and a Tracker each belong to one goroutine (one per socket, one per
// stream); so does every ZMQ socket. The pure functions are safe to call from
// anywhere. Manager and LocalSink methods are safe for concurrent use (each
// documents its own contract). Inside a Manager the lock order is: change (the
// registry-change semaphore), then Manager.mu, then run.mu, then workerRun.mu; no
// socket or stream goroutine takes change or Manager.mu while a registry change
// waits for it to stop.
package ingest
