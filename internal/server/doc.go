// Package server is the indexer process: its configuration (Config, flags,
// KVINDEX_* variables, the --config YAML file), the query and admin API, and
// the wiring of the single-node pipeline (ingest.Manager -> ingest.LocalSink ->
// feedApplier -> ingest.Applier -> radix.Index). Main is what cmd/indexer runs,
// including the `relay` subcommand.
//
// # API
//
// API serves, over a Backend (backend.go), the gRPC services kvindex.v1
// IndexService and AdminService, llm-d's indexer.v1.IndexerService, gRPC health
// and reflection (grpc.go), and the REST endpoints (http.go, compat.go): our
// kvindex.v1 messages as JSON, hermes-router's POST /kv-cache/hit-rate, Dynamo's
// and Mooncake's /query, /query_by_hash, /register, /unregister, plus /workers,
// /dump, /cluster, /healthz, /readyz and /metrics. docs/api.md is the contract.
// Every API shapes one scoring core (score.go). Errors are wrapped sentinels
// mapped to gRPC codes and HTTP statuses by the one table in errors.go.
//
// Backend is everything the handlers need from "the node": the single-node
// server implements it with localBackend; a replicated node implements it over
// raft. The ChangeFeed (watch.go) turns applied batches into the Watch stream;
// the node's apply path calls its Prepare and Commit around every batch.
//
// It owns no index logic: ingest follows the engines, radix holds the index,
// tokenize turns text into tokens.
//
// # Concurrency
//
// A Server is built by New and run once by Run, which owns its goroutines
// (apply loop, ingest, HTTP, gRPC, health) and returns after all of them
// stopped. API, Backend implementations and ChangeFeed subscriptions are safe
// for concurrent use; ChangeFeed.Prepare/Commit/WorkerRemoved run on the apply
// goroutine only and never block (a watcher that falls behind is ended).
package server
