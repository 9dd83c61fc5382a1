// Package router is kvindex's KV-aware OpenAI-compatible proxy: for every
// /v1/completions or /v1/chat/completions request it computes the prompt's block keys
// exactly as the engines do, asks the indexer how much of the prefix each worker
// caches, scores that against live load, picks a worker (or a prefill/decode pair)
// and streams the engine's answer back.
//
// The pieces, one file each:
//
//   - config.go: Config, DefaultConfig, Validate and the flags (KVINDEX_ROUTER_* env).
//   - fleet.go: the worker set (static --worker, --workers-file reloaded on change,
//     or the indexer's registry), with each worker's served models and LoRA adapters;
//     discovery.go: the --kube-* flags (the watching itself is internal/kube, wired
//     in by cmd/router).
//   - prompt.go: request body -> model, token ids and block keys (internal/openai,
//     internal/tokenize, internal/kvblock), cached per prompt; a chat request with
//     media (image, audio, video, file parts), or a completion with prompt_embeds,
//     gets none and is routed by load alone: the engine's hashes of media blocks
//     include the media's hash, which the router cannot compute. keys.go: the
//     session and prefix-hash keys (explicit headers and fields, canonical context).
//   - overlap.go: per-candidate cached prefix from the indexer (QueryByHash under a
//     deadline), the predicted overlay of recent decisions, and the approximate
//     index used while the indexer is down. overlay.go is the TTL-bounded store the
//     latter two share; sessions.go remembers each session's last worker.
//   - load.go: the load ledger: per worker and dp rank in-flight requests, uncached
//     prefill tokens (dispatch -> first byte) and decode blocks (dispatch -> end),
//     held by Reservations that exactly one owner releases. ledger_client.go shares
//     it with the other routers through the indexer leader (--ledger); others.go
//     keeps their recent decisions, to count a prefix shared with their load once
//     per deciding router (Candidate.ShareRemote).
//   - breaker.go: the per-worker circuit breaker (closed, open, half-open probe);
//     a timer per open breaker announces the end of its cooldown.
//   - route.go: one decision: pools (model, LoRA, role) -> filters (breaker,
//     --max-pending, busy thresholds; every exclusion with its reason) -> overlaps
//     -> policy -> Decision with its reservations; direct mode and PD pairing.
//   - policy.go, policy_load.go, policy_ring.go: the Policy contract and the
//     policies: kv-aware (cost.go holds its formula), round-robin, random,
//     power-of-two, least-loaded, session and prefix-hash (ring.go).
//   - proxy.go, upstream.go, pd.go, admission.go: the HTTP side: admission queue,
//     dispatch with retries before the first byte, SSE relay, prefill/decode legs;
//     errors.go maps every error to its HTTP status and OpenAI error body.
//   - parity.go, scrape.go: token-parity probes against the engines' /tokenize and
//     the optional engine /metrics scrape.
//   - metrics.go: Prometheus metrics (stable names, kvindex_router_*).
//   - debug.go: POST /debug/route (the dry run) and the RouteDecision debug log.
//   - ui.go, ui_recent.go: the web console (docs/console.md).
//   - epp.go: the Gateway API endpoint-picker (Envoy ext_proc) server.
//   - export.go: what the route bench's offline simulator drives (bench/routebench).
//   - server.go: New, Run and Main, which wire the above and serve until the
//     context ends.
//
// Concurrency: a Router serves many requests at once. Fleet, Ledger, Breakers, the
// overlays and the metrics are safe for concurrent use, each behind its own mutex
// (never two of them held at once; the metric hooks some call under theirs take
// only Prometheus's leaf locks; the Fleet's and the Breakers' wake-up hooks, which
// take the admission queue's, are called outside them). The Router's pickMu makes
// the read of the router's own decisions (predicted overlay, session bindings), load snapshot,
// pick, reservation and breaker probe one step, so that concurrent siblings of
// a burst see each other; the indexer is asked before it is taken. It is only
// ever taken outside those mutexes, so the one lock order is pickMu first. Policies are called
// concurrently and keep their own small state (round-robin counter, session ring)
// behind atomics or their own mutex. Every upstream leg of a request runs under the
// request's context, so a client that hangs up cancels all of them at once.
//
// The router never imports raft, raft-boltdb or zmq (internal/deptest).
package router
