package ingest

import (
	"context"

	"github.com/kvindex/kvindex/internal/radix"
)

// Stream names one ordered event stream: a worker and one of its data-parallel ranks.
// Sequence numbers, replay and cursors are per Stream; in the index it is one holder.
type Stream = radix.WorkerKey

// OpKind is what an Op does to the index.
type OpKind = radix.OpKind

// The Op kinds, as the index defines them.
const (
	OpStored  = radix.OpStored  // the stream now holds Hashes (chained under Parent) on Tier
	OpRemoved = radix.OpRemoved // the stream dropped Hashes from Tier
	OpCleared = radix.OpCleared // the stream dropped every block on every tier
)

// Op is one index mutation derived from one engine event, with block keys already
// computed (kvblock), so applying it needs no tokens, no tokenizer and no worker
// registry: a Raft follower replays Ops exactly as the leader built them. It is the
// index's own batch op (radix.Op), so a batch reaches the index without conversion.
type Op = radix.Op

// StreamBatch is the unit handed from ingest to the index: the Ops of one engine
// batch, in order, with the batch's sequence number.
//
// Reset asks the applier to clear the stream's blocks first and accept Seq as the new
// position whatever the previous one was: ingest sets it when the engine restarted
// (seq went back near 0) or when a gap could not be covered by replay. Epoch counts
// those resets per stream (ingest sets it to the stream's previous epoch + 1 on a
// reset batch) so that a re-delivered reset batch is recognised and dropped.
type StreamBatch struct {
	Stream Stream
	Seq    uint64
	Epoch  uint64
	Reset  bool
	Ops    []Op
	// TS is the engine's timestamp of the batch (seconds since the epoch, 0 when
	// unknown). It only feeds lag metrics; applying ignores it.
	TS float64
}

// Cursor is how far a stream has been applied.
type Cursor struct {
	Seq   uint64
	Epoch uint64
	// Fence, when not 0, says the stream's blocks were dropped from outside the
	// stream (its worker was declared dead, or unregistered; the value is the
	// log index of that decision): the Applier drops the stream's batches until
	// one starts a fresh stream (Reset), and ingest starts the stream afresh
	// when it sees a fence it has not acted on yet (see Applier.FenceWorker).
	Fence uint64
}

// Sink receives ordered batches from ingest. Single node: it applies them to a
// radix.Index through a bounded queue; in a cluster (internal/raftstore) it proposes
// them to the Raft log. Submit blocks while the sink is full (back-pressure) and
// returns ctx.Err() when ctx ends first.
type Sink interface {
	Submit(ctx context.Context, b StreamBatch) error
}

// CursorSource tells ingest where each stream stands in the index, so a subscriber
// started (or a node that just became Raft leader) resumes every stream from
// Seq+1 with a replay instead of re-applying or losing events.
type CursorSource interface {
	Cursor(s Stream) (Cursor, bool)
	// Fence is Cursor(s).Fence, cheap enough to ask before every batch: a
	// stream whose fence changed starts afresh.
	Fence(s Stream) uint64
}
