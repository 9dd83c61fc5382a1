package kvindexv1

// Bounds of the shared ledger (LoadService.Report, load.proto), wire contract
// between the routers (internal/router) and the leader (internal/server): the
// leader refuses a report holding a prediction of more than
// LedgerMaxPredictionKeys keys, and it queues for each router, as each
// router's outbox holds while its stream is down, at most LedgerMaxQueued
// predictions (and as many session bindings) with LedgerMaxQueuedKeys keys in
// all (8 MiB), keeping the newest.
const (
	LedgerMaxPredictionKeys = 1 << 16
	LedgerMaxQueued         = 4096
	LedgerMaxQueuedKeys     = 1 << 20
)
