package router

import (
	"time"

	"github.com/kvindex/kvindex/internal/kvblock"
)

// This file exports the pieces of a decision that the route bench's offline
// simulator (bench/routebench) drives in one process, so that it runs the
// router's own code rather than a copy: the load ledger, the store of recent
// decisions (predicted overlay and approximate index), the prompt's keys and the
// overlap rule. Each is what Router uses internally; nothing here has state of
// its own.

// NewLedger returns an empty ledger whose reservations the Sweep drops after ttl
// by now's clock (a virtual clock in the simulator). Safe for concurrent use.
func NewLedger(ttl time.Duration, now func() time.Time) *Ledger { return newLedger(ttl, now) }

// RecentDecisions is the store of recent decisions behind the predicted overlay
// (--router-predicted-ttl) and the approximate index (--approx-ttl), bounded to
// --overlay-max-blocks marks. Safe for concurrent use.
type RecentDecisions struct{ o *overlay }

// NewRecentDecisions returns an empty store with the router's horizons.
func NewRecentDecisions(predictedTTL, approxTTL time.Duration, maxMarks int) *RecentDecisions {
	return &RecentDecisions{o: newOverlay(predictedTTL, approxTTL, maxMarks)}
}

// Record notes that t was sent the prompt's chained keys now, as a decision does.
func (r *RecentDecisions) Record(keys []uint64, t Target, now time.Time) { r.o.Record(keys, t, now) }

// Match sets predicted[i] and approx[i] to how many leading keys targets[i] was
// sent within each horizon (approx may be nil).
func (r *RecentDecisions) Match(keys []uint64, targets []Target, now time.Time, predicted, approx []int) {
	r.o.Match(keys, targets, now, predicted, approx)
}

// PromptKeys returns a prompt's keys as the router computes them: the per-block
// local keys the indexer is asked with (QueryByHash, hash kind local) and the
// chained keys with the namespace mixed in that the overlay and the ledger use.
func PromptKeys(tokens []uint32, blockSize int, model, lora, salt string) (local, keys []uint64) {
	local = kvblock.AppendLocalHashes(nil, tokens, blockSize, lora)
	return local, overlayKeys(local, kvblock.Namespace{Model: model, LoRA: lora, CacheSalt: salt})
}

// ChooseOverlap is a decision's overlap rule for one target: the indexer's
// figure when it answered (indexed is the zero Overlap when it knows nothing of
// the target), else the approximate index's; raised to the predicted overlay's
// when that is at least as long (recent decisions are what the figure rests on).
func ChooseOverlap(indexed Overlap, indexOK bool, predicted, approx int) Overlap {
	o := Overlap{Source: SourceLoadOnly}
	switch {
	case indexOK:
		if indexed.Source != "" {
			o = indexed
		} else {
			o.Source = SourceIndex
		}
	case approx > 0:
		o = Overlap{GPU: approx, Source: SourceApproximate}
	}
	if predicted > 0 && predicted >= o.Blocks() {
		o = Overlap{GPU: predicted, Source: SourcePredicted}
	}
	return o
}
