// Package fakeengine simulates vLLM engines with prefix caching and KV events
// enabled, so that kvindex's ingest, replication, router, benchmarks and demo have
// engines to talk to without a GPU. On the wire it behaves like vLLM:
//
//   - HTTP (Engine.Handler): OpenAI /v1/completions and /v1/chat/completions with
//     SSE streaming and usage.prompt_tokens_details.cached_tokens, /tokenize,
//     /detokenize, /v1/models, /health, /metrics (vLLM metric names, one Prometheus
//     registry per engine), /reset_prefix_cache; plus /debug/kv-blocks and /admin/*.
//   - KV events (publisher.go): a ZMQ PUB socket per data-parallel rank sending
//     [topic, seq as 8 bytes big-endian from 0, msgpack EventBatch] where EventBatch
//     is [ts, events, dp_rank] and events are msgspec tagged maps or arrays
//     (EncodeBatch); a ROUTER socket answering [ "", start seq ] replay requests from
//     the last --replay-buffer-steps batches, then the end marker (seq ff x 8).
//   - Prefill/decode roles with vLLM's kv_transfer_params.
//
// Each rank has a KV cache of --num-gpu-blocks blocks (kvcache.go) with vLLM's
// prefix caching and eviction order, an optional CPU tier, and a step scheduler
// (rank.go) whose simulated durations follow Timing; --time-scale maps simulated
// to wall time. A repeated prefix is cheaper because its blocks are hits: the
// request reports cached_tokens and spends no prefill time on them.
//
// Engine block hashes are opaque: xxh3 with a per-engine seed over the parent hash,
// the tokens and the extra keys — deliberately not kvindex's block keys.
//
// SimRank (sim.go) runs one rank's cache and scheduler on a caller-driven virtual
// clock, with no goroutine or socket, for offline simulation (bench/routebench).
//
// Engine.CacheTruth (and GET /debug/kv-blocks) exposes what each rank really
// caches, with the seq of the last batch that state is consistent with, so tests can
// compare an index against it.
//
// Fault injection (Faults, POST /admin/faults, POST /admin/restart-event-stream):
// withheld batches, failed (500/429) and hanging requests, streams broken or
// stalled after N tokens, and simulated restarts.
// Fleet runs several engines in one process; Config.FleetMembers documents the
// port layout.
//
// Concurrency: Engine and Fleet methods are safe for concurrent use. Inside an
// engine each rank's step loop owns its cache and queues and holds the rank's mutex
// for a whole step; readers (CacheTruth, ResetPrefixCache, restarts) take it
// between steps, so they always see a state consistent with the events enqueued.
// A step enqueues its batch before it answers the requests that finished in it
// (vLLM publishes a step's events before it returns the step's outputs), so
// Flush after a Generate returned covers that request's blocks.
// Each ZMQ socket is used by exactly one goroutine. Lock order: rank.mu before
// rank.inboxMu; ranks in index order.
package fakeengine
