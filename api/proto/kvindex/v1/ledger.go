package kvindexv1

import "time"

// Bounds of the shared ledger (LoadService.Report, load.proto), wire contract
// between the routers (internal/router) and the leader (internal/server): the
// leader refuses a report holding a prediction of more than
// LedgerMaxPredictionKeys keys, and it queues for each router, as each
// router's outbox holds while its stream is down, at most LedgerMaxQueued
// predictions (and as many session bindings) with LedgerMaxQueuedKeys keys in
// all (8 MiB), keeping the newest.
//
// A queue that full is ~10 MiB on the wire, so neither side sends it in one
// message: a report or a push carries at most LedgerMaxMessageBytes of
// predictions and as much of session bindings, the oldest first, and the rest
// follow in the next ones. Loads likewise: a router's 65,536 targets with long
// names are tens of MiB, so a report or push whose loads are more than
// LedgerMaxMessageBytes goes as several messages (load.proto, more), which the
// receiver applies together.
//
// A message is then at most LedgerMinRecvBytes: the three sections and their
// framing (at most LedgerMaxQueued decisions and as many bindings, a few bytes
// each) and a router id. Both sides must receive that much: routers do, with
// gRPC's default 4 MiB, and the indexer refuses a --max-body-bytes below it.
const (
	LedgerMaxPredictionKeys = 1 << 16
	LedgerMaxQueued         = 4096
	LedgerMaxQueuedKeys     = 1 << 20
	LedgerMaxMessageBytes   = 1 << 20
	LedgerMinRecvBytes      = 3*LedgerMaxMessageBytes + 64<<10
)

// LedgerHeartbeat is the longest the leader goes without a push on a Report
// stream, changed or not, so that a router can tell a quiet fleet from a dead
// stream: a router that has had no push for a few heartbeats takes the leader
// as gone (a hung process, or a partition that drops packets and so never
// closes the connection) and stops counting its view.
const LedgerHeartbeat = time.Second
