// Package server is the indexer process: its configuration (Config, flags,
// KVINDEX_* variables, the --config YAML file), the wiring of the single-node
// pipeline (ingest.Manager -> ingest.LocalSink -> ingest.Applier -> radix.Index)
// and the HTTP endpoints (/metrics, /healthz, /readyz, /workers). Main is what
// cmd/indexer runs, including the `relay` subcommand.
//
// It owns no index logic: ingest follows the engines, radix holds the index. The
// gRPC and query APIs and Raft replication come with their own issues.
//
// Concurrency: a Server is built by New and run once by Run, which owns its
// goroutines (apply loop, ingest, HTTP) and returns after all of them stopped;
// Handler and the accessors are safe for concurrent use.
package server
