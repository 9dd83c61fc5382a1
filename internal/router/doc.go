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
//     or the indexer's registry), with each worker's served models and LoRA adapters.
//   - prompt.go: request body -> model, token ids and block keys (internal/openai,
//     internal/tokenize, internal/kvblock), cached per prompt.
//   - overlap.go: per-candidate cached prefix from the indexer (QueryByHash under a
//     deadline), the predicted overlay of recent decisions, and the approximate
//     index used while the indexer is down. overlay.go is the TTL-bounded store the
//     latter two share.
//   - load.go: the load ledger: per worker and dp rank in-flight requests, uncached
//     prefill tokens (dispatch -> first byte) and decode blocks (dispatch -> end),
//     held by Reservations that exactly one owner releases.
//   - breaker.go: the per-worker circuit breaker (closed, open, half-open probe).
//   - filter.go: eligibility (model, LoRA, role, breaker, busy thresholds) with the
//     reason for every exclusion.
//   - policy.go and policy_*.go: the Policy contract and the policies: kv-aware
//     (cost.go holds its formula), round-robin, random, power-of-two, least-loaded,
//     session and prefix-hash (ring.go, keys.go).
//   - route.go: one decision: candidates -> filters -> policy -> Decision.
//   - proxy.go, upstream.go, pd.go, admission.go: the HTTP side: admission queue,
//     dispatch with retries before the first byte, SSE relay, prefill/decode legs.
//   - parity.go, scrape.go: token-parity probes against the engines' /tokenize and
//     the optional engine /metrics scrape.
//   - metrics.go: Prometheus metrics (stable names, kvindex_router_*).
//   - server.go: Run, which wires the above and serves until the context ends.
//
// Concurrency: a Router serves many requests at once. Fleet, Ledger, Breakers, the
// overlays and the metrics are safe for concurrent use, each behind its own mutex
// (never two held at once, so there is no lock order to keep). Policies are called
// concurrently and keep their own small state (round-robin counter, session ring)
// behind atomics or their own mutex. Every upstream leg of a request runs under the
// request's context, so a client that hangs up cancels all of them at once.
//
// The router never imports raft, raft-boltdb or zmq (internal/deptest).
package router
