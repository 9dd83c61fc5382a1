// Package raftstore replicates the index with hashicorp/raft, so that every
// indexer of a cluster holds the same index: it owns the log entry format, the
// state machine, batching of ingest's stream batches into log entries, snapshots,
// membership and read consistency. It does not talk to engines (internal/ingest
// does) and serves no API (internal/server does).
//
// # State machine
//
// The replicated state is an ingest.Applier over a radix.Index (the index and each
// stream's cursor, with its fence), the worker registry, the workers declared dead
// (dead.go), the ids of recently unregistered workers, and the members' gRPC
// addresses. Log entries are in a compact binary format
// (entry.go) with a version byte and a type byte; a type unknown to this version is
// skipped when the entry is marked ignorable, and otherwise stops the state machine
// (ErrFSMStopped): the node shuts down loudly rather than diverge. An entry that
// is well formed but holds a value beyond the format's limits (an over-long id,
// which older versions wrote unchecked) is applied as a no-op failing with
// ErrInvalidEntry; proposals are decoded before they are proposed, so this
// version never writes one. Apply is
// deterministic, and the Applier's cursors make it idempotent per stream batch: a
// batch at or behind its stream's cursor is dropped. Unregistering a worker fences
// its cursors instead of deleting them, so that a batch submitted before and
// committed after a new registration of the worker is dropped too (fsm.unregister).
// Snapshots (snapshot.go) hold
// all of the state; restoring one gives an index with the same Digest.
//
// # Leadership, batching, no loss
//
// Only the leader proposes stream batches. Node implements ingest.Sink: Submit
// adds a batch to the log entry being filled; entries are proposed when
// MaxBatchEvents, MaxBatchBytes or MaxBatchWait is reached, with up to
// MaxInFlight proposals pending (never waiting for one before proposing the
// next). Proposals are grouped in leader sessions (proposer.go): a session
// starts after a barrier and ends at the first failed proposal or sign of lost
// leadership. RunWhileLeader runs a function (ingest's Manager.Run, with Node as
// the Sink and Applier() as the CursorSource) for each session, with a context
// that ends with it. Since what commits of a session is a prefix of what was
// submitted, and the next session's producers resume every stream from the
// replicated cursors using the engines' replay, no event is lost across a
// leader change, and none is applied twice.
//
// # Reads
//
// Reads are local: Index() on any replica, as of AppliedIndex(), which the FSM
// keeps (raft's own applied index runs ahead of Apply). WaitApplied gives
// read-your-writes on any replica; LinearizableBarrier (leader only) makes the next
// local read linearizable.
//
// # Concurrency
//
// Node's methods are safe for concurrent use. raft applies entries on one
// goroutine; Index(), Applier().Cursor, Workers and Cluster may run beside it.
// Config.OnWorkersChanged, OnBatch, BeforeBatch, OnWorkerRemoved, OnWorkerDead and AfterEntry run on the
// apply goroutine and must not call back into the Node. A RunWhileLeader function must return soon after
// its context ends: the next leader session, and Shutdown, wait for it.
//
// # Metrics
//
// Each Node has its own kvindex_raft_* metrics (Config.Registerer), among them
// gauges of its raft state (leadership, term, applied and commit index, last
// contact with the leader, members) read from raft's atomics when scraped, so a
// scrape never waits for raft's main loop. raft's and
// raft-boltdb's metrics go through go-metrics' process-wide sink:
// ExportRaftMetrics installs one feeding a Prometheus registerer.
package raftstore
