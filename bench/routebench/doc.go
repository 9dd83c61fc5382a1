// Package routebench answers "how much TTFT and GPU time does KV-aware routing
// save on traffic like mine?": it replays a trace (bench/traces) once per routing
// policy against a fleet of fake vLLM engines (bench/fakeengine) and reports the
// engines' own prefix hit rate, TTFT, E2E latency, throughput, goodput at an SLO,
// load imbalance and the router's decision time (report.go). cmd/routebench is
// its main.
//
// Two modes share the traces, the policies and the report:
//
//   - Offline (sim.go): a discrete-event simulation on a virtual clock. Every
//     worker is a fakeengine.SimRank — the engine's own cache and step scheduler —
//     and every decision runs the router's own code (router.NewPolicy, the load
//     Ledger, the RecentDecisions overlay, ChooseOverlap) against a radix index
//     fed the engines' KV events through ingest's OpBuilder and Applier, after an
//     optional event delay. One process, no sockets: thousands of workers.
//     --routers N simulates N routers over the one index, each with its own
//     ledger, overlay and sessions, sharing them (--ledger) through simulated
//     pushes of the indexer's load ledger.
//   - Live (live.go): the fake-engine fleet, the indexer and the router run as
//     real processes on real sockets; requests go through the router's OpenAI
//     endpoint and the engines' usage.cached_tokens and simulated timings are read
//     back from the answers.
//
// Policies (policies.go) are the router's --router-policy values, variants of
// kv-aware (no predicted overlay, no index), and baselines written from their
// published rules: SGLang's cache-aware router, llm-d's weighted scorers, and an
// oracle that reads the engines' true caches and loads at decision time.
//
// Concurrency: Run and the simulator are single-goroutine; the live mode's
// client runs one goroutine per request in flight and merges their outcomes
// under a mutex. Nothing here keeps global state.
package routebench
