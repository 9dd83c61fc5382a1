// Package ingest turns the KV-cache event streams of inference engines (vLLM,
// SGLang) into ordered batches of index operations.
//
// The wire codec (frames, topics, msgpack event batches, replay framing) is
// package wire below this one. Here, one part is pure and does no I/O:
// per-stream sequence tracking (sequence.go), events to index operations
// (ops.go) and applying them (apply.go). The other part drives it: the Manager's
// ZMQ and NATS subscribers (manager.go, stream.go, zmq.go, nats.go, replay.go),
// the relay (relay.go) and the single-node hand-off to the index (localsink.go).
//
// # Events the index does not take
//
// Decoded events that cannot or must not be indexed are counted in
// kvindex_ingest_refused_events_total{reason} (ops.go):
//
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
//   - Events whose token count is not block_size per block hash, or whose block
//     size differs from the worker's (token_count, block_size), and events of a
//     worker whose model is unknown (no_model): logged at a rate limit.
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
//	case d.Action == ActionGap: // hold the batch, send wire.ReplayRequest(d.From)
//		// for each reply until the end marker or a timeout:
//		//     if a := tr.Replayed(reply.Seq); a.Applies() { submit it, Reset: a.Clears() }
//		// then: if a := tr.FinishReplay(); a.Applies() { submit the held batch, Reset: a.Clears() }
//	} // ActionDuplicate: drop it; ActionRefuse: drop it as bad input (count it)
//
// A restart is no gap: a restarted engine whose first live batch we get is seq
// n > 0 is asked for 0..n-1 (Decision.Restart). A stream runner that gets a live
// batch at or below its cursor stamped later than every batch it applied knows
// the engine restarted even when the seqs cannot tell (ObserveRestart). A seq
// more than MaxSeqJump past the cursor is refused, never a reset.
//
// A stream whose worker was declared dead (or unregistered: the fence then
// greets the next registration's stream) is fenced by the index (Cursor.Fence,
// Applier.FenceWorker): its blocks are gone and the Applier takes only a batch
// that starts a fresh stream. When a stream's runner sees a fence it has not
// acted on (before each batch and when idle), it calls Tracker.Fresh: the next
// batch, whatever its seq, clears the worker in a new epoch, as a restart, after
// a catch-up replay as for a stream the index does not know.
//
// # Pipeline
//
// A Manager keeps a registry of workers (workerspec.Spec: --worker flags, the
// --workers-file, AddWorker from a registry, and workers discovered on their first
// event) and, while Run runs, follows every one of them:
//
//   - Connect mode: one SUB socket per (worker, dp rank) dialing the rank's PUB
//     endpoint (the spec's endpoint, port + rank).
//   - Bind mode (--zmq-bind, bind.go): one SUB socket that engines connect to,
//     owned by ServeBind for as long as it runs, Run or no Run. While Run runs,
//     its frames go through a FrameInput into Run's streams; otherwise to a
//     Forwarder (a cluster follower sends them to the leader, whose FrameInput
//     takes them the same way). The worker is the registered worker whose topic
//     is exactly the frame's topic, else the pod of llm-d's "kv@<pod>@<model>"
//     topic (vLLM --kv-events-config '{"topic": "kv@$POD_NAME@$MODEL"}'); a
//     worker seen for the first time is registered as "discovered" with that
//     model and the replay endpoint of BindReplayPattern ("{pod}" replaced).
//     The dp rank is the batch's data_parallel_rank; a declared worker's ranks
//     are bounded by its dp-size, a discovered one's by MaxDiscoveredDPRanks
//     (NATS likewise). A frame may reach Run by
//     two ways; a live batch at or below the stream's cursor stamped no later
//     than the last applied one is a late copy (a duplicate), not a restart.
//   - NATS: one subscription to <prefix>.*.*; see nats.go for the subject and
//     header convention (Kv-Seq) that the relay (RunRelay) follows.
//
// Each socket (and each FrameInput's caller) has one goroutine that receives
// and decodes; each stream has one goroutine that runs its Tracker, fills gaps
// over a DEALER to the engine's replay socket, computes block keys (kvblock, the worker's model and block size, the
// event's LoRA and cache salt) and hands StreamBatches to the Sink in order. A
// stream with a replay endpoint also replays when it starts (from its cursor, or
// the whole buffer for a stream the index does not know) and when it has been
// idle for IdleReplayInterval: engines send no heartbeat, so a lost last batch
// would otherwise stay unseen. When a worker's spec changes its stream
// goroutines restart, and each new one takes over the stopped one's Tracker
// (streamRunner.inherit) rather than the index's cursor, which lags what was
// submitted (docs/design.md, Spec changes).
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
// A wire.Decoder and a Tracker each belong to one goroutine (one per socket or
// FrameInput, one per stream); so does every ZMQ socket and every FrameInput.
// A Forwarder's Forward is called on the bind socket's goroutine. The pure functions are safe to call from
// anywhere. Manager and LocalSink methods are safe for concurrent use (each
// documents its own contract). Inside a Manager the lock order is: change (the
// registry-change semaphore), then Manager.mu, then run.mu, then workerRun.mu; no
// socket or stream goroutine takes change or Manager.mu while a registry change
// waits for it to stop.
package ingest
