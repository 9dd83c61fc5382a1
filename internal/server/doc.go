// Package server is the indexer process: its configuration (Config, flags,
// KVINDEX_* variables, the --config YAML file), the query and admin API, and
// the wiring of a cluster member: a raftstore.Node whose replicated state is
// the index, the stream cursors and the worker registry, and an ingest.Manager
// that follows the engines while the node leads (Manager -> Node as Sink ->
// raft log -> every replica's Applier -> radix.Index). One node is a cluster
// of one. Main is what cmd/indexer runs, including the `relay` subcommand.
//
// # API
//
// API serves, over a Backend (backend.go), the gRPC services kvindex.v1
// IndexService and AdminService, llm-d's indexer.v1.IndexerService, gRPC health
// and reflection (grpc.go), and the REST endpoints (http.go, compat.go): our
// kvindex.v1 messages as JSON, hermes-router's POST /kv-cache/hit-rate, Dynamo's
// and Mooncake's /query, /query_by_hash, /register, /unregister, plus /workers,
// /dump, /cluster, /healthz, /readyz and /metrics; with --probe-addr a second,
// plain-HTTP listener serves only /healthz, /readyz and /metrics (probe.go).
// docs/api.md is the contract.
// Every API shapes one scoring core (score.go); gRPC Score and QueryByHash,
// the per-request calls of a router, take a fast path to it (scorewire.go:
// pooled requests and results, the answer written straight to the wire) that a
// test holds byte for byte to the generated-type form. Errors are wrapped sentinels
// mapped to gRPC codes and HTTP statuses by the one table in errors.go.
//
// Backend is everything the handlers need from "the node"; raftBackend
// (raft.go) implements it. Reads are served from the local replica at its
// applied index; linearizable reads need the leader. Writes (register,
// unregister, join, leave) go through the log on the leader: a follower
// forwards them to the leader's gRPC API (peers.go), and the answer comes once
// the follower has applied them too. The replicated registry is mirrored into
// every node's ingest Manager; the leader registers the workers it knows from
// its configuration or finds on the bind socket or NATS, and with
// --kube-selector the ready engine pods (kubeworkers.go: the leader reconciles
// the registry with the pod list, removing the workers of pods that went), so
// every replica scores them. The ChangeFeed (watch.go) turns applied batches
// into the Watch stream: raft's apply hooks call its Prepare and Commit around
// every batch.
//
// The leader also probes each worker's health endpoint (health.go) and declares
// a worker that stays unhealthy for --worker-dead-after dead through the log:
// every replica drops its blocks, reports it dead and leaves it out of scoring
// (registryview.go).
//
// Ingest runs on the leader only, in connect mode and in bind mode alike. In
// bind mode every member binds --zmq-bind for its whole life; a member that does
// not lead forwards the frames to the leader (forward.go: a bounded queue and
// MemberService.ForwardEvents), whose handler feeds them to its ingest like
// frames of its own socket. Loss on the way is a sequence gap the leader
// replays; see the README, *Bind mode*.
//
// It owns no index logic: ingest follows the engines, radix holds the index,
// tokenize turns text into tokens.
//
// # Concurrency
//
// A Server is built by New and run once by Run, which owns its goroutines
// (ingest and the worker health probe while leading, the bind socket and its
// forwarder, registry mirror, join or the --bootstrap-peers decision
// (bootstrap.go), HTTP, the probe listener, gRPC, health, the
// console's leadership timeline) and returns after all of them stopped. API,
// Backend implementations and ChangeFeed subscriptions are safe for concurrent
// use; ChangeFeed.Prepare/Commit/WorkerRemoved and the other apply hooks run on
// raft's apply goroutine only and never block (a watcher that falls behind is
// ended).
package server
