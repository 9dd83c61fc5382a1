package ingest

// DefaultRestartWindow is the restart window NewTracker uses when given 0: a live
// seq that goes back to below it is taken as the engine's new stream. Engines count
// from 0 on start and publish at most a few hundred batches per second, so a fresh
// stream is far below it when we first hear from it, while a long-running stream has
// left it after a few minutes.
const DefaultRestartWindow = 1 << 16

// Action is what the caller must do with a batch, as decided by a Tracker.
type Action uint8

const (
	// ActionNone: nothing to do (FinishReplay without an open replay).
	ActionNone Action = iota
	// ActionApply: apply the batch.
	ActionApply
	// ActionDuplicate: drop the batch, it was applied already.
	ActionDuplicate
	// ActionGap: batches are missing. Hold this batch, ask the engine for a replay
	// from Decision.From, pass every replayed batch to Replayed, then call
	// FinishReplay, which says what to do with the held batch.
	ActionGap
	// ActionRestart: the engine restarted. Drop every block of the worker, then
	// Observe the same batch again (the tracker now expects the new stream's seq 0).
	ActionRestart
	// ActionReset: a replay could not fill a gap. Drop every block of the worker,
	// then apply the batch; the tracker continues after it.
	ActionReset
)

// String names the action ("apply", "gap", ...).
func (a Action) String() string {
	switch a {
	case ActionNone:
		return "none"
	case ActionApply:
		return "apply"
	case ActionDuplicate:
		return "duplicate"
	case ActionGap:
		return "gap"
	case ActionRestart:
		return "restart"
	case ActionReset:
		return "reset"
	}
	return "Action(?)"
}

// Decision is a Tracker's verdict on a live batch.
type Decision struct {
	Action Action
	// From and To are the missing seqs, inclusive, for ActionGap.
	From, To uint64
}

// TrackerStats are a stream's cumulative counters.
type TrackerStats struct {
	// Applied counts batches the caller was told to apply (ActionApply and ActionReset),
	// replayed ones included.
	Applied uint64
	// Replayed counts the applied batches that came from a replay.
	Replayed uint64
	// Duplicates counts batches dropped because they were applied already.
	Duplicates uint64
	// Gaps counts replays asked for; Restarts engine restarts; Resets gaps that a
	// replay could not fill (each one cleared the worker).
	Gaps, Restarts, Resets uint64
}

// Tracker follows the sequence numbers of one stream (a worker and dp rank). It does
// no I/O and reads no clock: the caller feeds it seqs and acts on the answers. A
// Tracker is not safe for concurrent use; it belongs to the goroutine that applies
// the stream.
//
// Rules, for a live batch with sequence number seq (Observe):
//   - The first batch a new Tracker sees is accepted whatever its seq: the engine
//     may have been publishing long before we subscribed. (Resume instead continues
//     from a known cursor.)
//   - seq == next expected: apply.
//   - seq > next: gap; the batches from next to seq-1 must be replayed.
//   - seq < next, and the live stream went back (seq <= the highest live seq seen,
//     or, after Resume, seq below the cursor) to below the restart window: the engine
//     restarted.
//   - any other seq < next: a duplicate, e.g. a live batch that a replay already
//     brought.
//
// A replay fills a gap when it brings every seq from the gap's start on; if it skips
// some (the engine's buffer no longer has them) or ends early, the worker's blocks
// are dropped rather than kept stale (ActionReset).
type Tracker struct {
	restartWindow uint64
	started       bool
	next          uint64
	liveSeen      bool
	lastLive      uint64
	replaying     bool
	held          uint64
	stats         TrackerStats
}

// NewTracker returns a tracker for a stream it knows nothing about. restartWindow is
// the "near 0" bound of restart detection (DefaultRestartWindow when 0).
func NewTracker(restartWindow uint64) *Tracker {
	if restartWindow == 0 {
		restartWindow = DefaultRestartWindow
	}
	return &Tracker{restartWindow: restartWindow}
}

// Resume positions the tracker after a stream whose batches up to and including
// last were applied (the cursor a replicated index kept): the next live batch is
// checked against it instead of being accepted as a start. Counters are kept.
func (t *Tracker) Resume(last uint64) {
	t.started = true
	t.next = last + 1
	t.liveSeen = false
	t.replaying = false
}

// Observe decides what to do with a live batch; see Tracker for the rules. While a
// replay is open (after ActionGap, before FinishReplay) the caller should hold live
// batches back; one observed anyway beyond the cursor gets ActionGap again and does
// not open another replay.
func (t *Tracker) Observe(seq uint64) Decision {
	if !t.started {
		t.started = true
		t.next = seq
	}
	wentBack := seq < t.next
	if t.liveSeen {
		wentBack = seq <= t.lastLive
	}
	if !t.liveSeen || seq > t.lastLive {
		t.liveSeen, t.lastLive = true, seq
	}
	switch {
	case seq < t.next && wentBack && seq < t.restartWindow:
		t.stats.Restarts++
		t.next = 0
		t.liveSeen = false
		t.replaying = false
		return Decision{Action: ActionRestart}
	case seq < t.next:
		t.stats.Duplicates++
		return Decision{Action: ActionDuplicate}
	case seq == t.next:
		t.next++
		t.stats.Applied++
		return Decision{Action: ActionApply}
	}
	gap := Decision{Action: ActionGap, From: t.next, To: seq - 1}
	if !t.replaying {
		t.replaying = true
		t.held = seq
		t.stats.Gaps++
	}
	return gap
}

// Replayed decides what to do with a batch that a replay brought: ActionApply,
// ActionDuplicate, or ActionReset when the replay skipped seqs we need (drop the
// worker's blocks, then apply this batch).
func (t *Tracker) Replayed(seq uint64) Action {
	if !t.started {
		t.started = true
		t.next = seq
	}
	switch {
	case seq < t.next:
		t.stats.Duplicates++
		return ActionDuplicate
	case seq == t.next:
		t.next++
		t.stats.Applied++
		t.stats.Replayed++
		return ActionApply
	}
	t.next = seq + 1
	t.stats.Resets++
	t.stats.Applied++
	t.stats.Replayed++
	return ActionReset
}

// FinishReplay closes the replay opened by ActionGap (it ended, failed or timed out,
// or there is no replay endpoint) and decides about the held batch: ActionApply when
// the replay filled the gap up to it, ActionDuplicate when the replay brought it too,
// ActionReset when the gap is still open (drop the worker's blocks, then apply it).
// Without an open replay it returns ActionNone.
func (t *Tracker) FinishReplay() Action {
	if !t.replaying {
		return ActionNone
	}
	t.replaying = false
	switch {
	case t.held < t.next:
		t.stats.Duplicates++
		return ActionDuplicate
	case t.held == t.next:
		t.next++
		t.stats.Applied++
		return ActionApply
	}
	t.next = t.held + 1
	t.stats.Resets++
	t.stats.Applied++
	return ActionReset
}

// Last returns the seq of the last batch applied; ok is false before the first one
// (and right after a restart).
func (t *Tracker) Last() (seq uint64, ok bool) {
	if !t.started || t.next == 0 {
		return 0, false
	}
	return t.next - 1, true
}

// Replaying reports whether a replay is open (between ActionGap and FinishReplay).
func (t *Tracker) Replaying() bool { return t.replaying }

// Stats returns the stream's counters.
func (t *Tracker) Stats() TrackerStats { return t.stats }
