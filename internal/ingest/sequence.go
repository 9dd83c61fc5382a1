package ingest

// DefaultRestartWindow is the restart window NewTracker uses when given 0: a live
// seq that goes back to below it is taken as the engine's new stream. Engines count
// from 0 on start and publish at most a few hundred batches per second, so a fresh
// stream is far below it when we first hear from it, while a long-running stream has
// left it after a few minutes.
const DefaultRestartWindow = 1 << 16

// MaxSeqJump is the largest forward jump from the cursor that a Tracker takes
// as a gap. A seq further ahead is no engine's (at a thousand batches a second,
// 2^32 batches are seven weeks of loss that nothing noticed): it is refused
// (ActionRefuse), never a reset, because a stream that jumped there would take
// every later batch of the engine for an old one.
const MaxSeqJump = 1 << 32

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
	// apply the batch (StreamBatch.Reset): it is the first of the new stream we have.
	ActionRestart
	// ActionReset: a replay could not fill a gap. Drop every block of the worker,
	// then apply the batch (StreamBatch.Reset); the tracker continues after it.
	ActionReset
	// ActionRefuse: the seq is implausible (more than MaxSeqJump past the
	// cursor, or 2^64-1, which leaves no seq after it): drop the batch as bad
	// input. Nothing changed.
	ActionRefuse
)

// Applies reports whether the caller must apply the batch (ActionApply,
// ActionRestart, ActionReset).
func (a Action) Applies() bool { return a == ActionApply || a.Clears() }

// Clears reports whether the action drops the worker's blocks before applying the
// batch (ActionRestart, ActionReset): StreamBatch.Reset.
func (a Action) Clears() bool { return a == ActionRestart || a == ActionReset }

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
	case ActionRefuse:
		return "refuse"
	}
	return "Action(?)"
}

// Decision is a Tracker's verdict on a live batch.
type Decision struct {
	Action Action
	// From and To are the missing seqs, inclusive, for ActionGap.
	From, To uint64
	// Restart marks an ActionGap that asks for the start of a restarted
	// engine's stream, the seqs before the first live batch we have of it (lost
	// while the SUB socket reconnected). It is not a gap (TrackerStats.Gaps does
	// not count it). A new stream may start at 1, where llm-d's publishers start
	// (vLLM starts at 0): a replay may start at 1, and when the first live batch
	// is seq 1 and the engine has no seq 0, that batch starts the new stream.
	Restart bool
}

// TrackerStats are a stream's cumulative counters.
type TrackerStats struct {
	// Applied counts batches the caller was told to apply (ActionApply, ActionRestart
	// and ActionReset), replayed ones included.
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
//   - seq > next+MaxSeqJump, or seq 2^64-1: refused (ActionRefuse), nothing
//     changes.
//   - seq < next, and the live stream went back (seq <= the highest live seq seen,
//     or, after Resume, seq below the cursor) to below the restart window: the engine
//     restarted. Its new stream starts at 0 (vLLM) or 1 (llm-d's publishers):
//     when seq > 0, 0..seq-1 are replayed first (Decision.Restart: no gap is
//     counted), and the first batch applied clears the worker; the new stream
//     may start at 1. A caller that knows better than the seqs that the engine
//     restarted (ObserveRestart) gets the same.
//   - any other seq < next: a duplicate, e.g. a live batch that a replay already
//     brought.
//
// A replay fills a gap when it brings every seq from the gap's start on; if it skips
// some (the engine's buffer no longer has them) or ends early, the worker's blocks
// are dropped rather than kept stale (ActionReset).
//
// Every clear comes with a batch to apply (ActionRestart, ActionReset), as
// StreamBatch.Reset does; each one starts a new epoch (Cursor).
type Tracker struct {
	restartWindow uint64
	started       bool
	next          uint64
	epoch         uint64
	liveSeen      bool
	lastLive      uint64
	replaying     bool
	held          uint64
	// restarted: the engine restarted and the batch that clears the worker has not
	// been applied yet (it is being replayed).
	restarted bool
	// fromOne: after a restart, the new stream may start at 1 instead of 0
	// (until its first batch is applied).
	fromOne bool
	// discarded: a batch was lost after its seq was accepted (Discard).
	discarded bool
	stats     TrackerStats
}

// NewTracker returns a tracker for a stream it knows nothing about. restartWindow is
// the "near 0" bound of restart detection (DefaultRestartWindow when 0).
func NewTracker(restartWindow uint64) *Tracker {
	if restartWindow == 0 {
		restartWindow = DefaultRestartWindow
	}
	return &Tracker{restartWindow: restartWindow}
}

// Resume positions the tracker after the cursor of a stream that is already in the
// index (batches up to c.Seq applied, in epoch c.Epoch): the next live batch is
// checked against it instead of being accepted as a start. Counters are kept.
func (t *Tracker) Resume(c Cursor) {
	t.started = true
	t.next = c.Seq + 1
	t.epoch = c.Epoch
	t.liveSeen = false
	t.replaying = false
	t.restarted = false
	t.fromOne = false
	t.discarded = false
}

// Fresh starts the stream afresh after its blocks were dropped from outside it
// (the worker was declared dead, and the index fenced the stream at a cursor of
// epoch epoch): the next batch, live or replayed and whatever its seq, is the
// first of a new stream and clears the worker (ActionRestart) in an epoch above
// both epoch and every epoch this tracker gave out. No gap is counted: it is
// counted as a restart. Other counters are kept.
func (t *Tracker) Fresh(epoch uint64) {
	t.started = false
	t.next = 0
	t.epoch = max(t.epoch, epoch)
	t.liveSeen = false
	t.replaying = false
	t.restarted = true
	t.fromOne = false
	t.discarded = false
	t.stats.Restarts++
}

// Observe decides what to do with a live batch; see Tracker for the rules. While a
// replay is open (after ActionGap, before FinishReplay) the caller should hold live
// batches back; one observed anyway beyond the cursor gets ActionGap again and does
// not open another replay.
func (t *Tracker) Observe(seq uint64) Decision {
	return t.observe(seq, false)
}

// ObserveRestart is Observe for a live batch that the caller knows comes from
// a restarted engine although its seq does not say so, because it is stamped
// later than every batch applied yet at or below the cursor (copies of applied
// batches carry their stamp): the restart rules apply, near 0 or not. A seq
// beyond the cursor is observed as usual.
func (t *Tracker) ObserveRestart(seq uint64) Decision {
	return t.observe(seq, true)
}

func (t *Tracker) observe(seq uint64, restarted bool) Decision {
	if t.implausible(seq) {
		return Decision{Action: ActionRefuse}
	}
	if !t.started {
		t.started = true
		t.next = seq
	}
	wentBack := seq < t.next
	if t.liveSeen {
		wentBack = seq <= t.lastLive
	}
	restart := seq < t.next && (restarted || wentBack && seq < t.restartWindow)
	if restart || !t.liveSeen || seq > t.lastLive {
		t.liveSeen, t.lastLive = true, seq
	}
	switch {
	case restart:
		t.stats.Restarts++
		t.next = 0
		t.replaying = false
		t.restarted = true
		t.fromOne = true
		if seq == 0 {
			return Decision{Action: t.applied(false)}
		}
		// The new stream's first batches were lost (the SUB socket
		// reconnecting): ask for them, but it is no gap.
		t.replaying, t.held = true, seq
		return Decision{Action: ActionGap, From: 0, To: seq - 1, Restart: true}
	case seq < t.next:
		t.stats.Duplicates++
		return Decision{Action: ActionDuplicate}
	case seq == t.next:
		return Decision{Action: t.applied(false)}
	}
	if t.replaying {
		return Decision{Action: ActionGap, From: t.next, To: seq - 1}
	}
	return t.openGap(seq)
}

// implausible reports a seq no engine sends next: 2^64-1 (the replay end
// marker's; nothing could follow it) or more than MaxSeqJump past the cursor.
func (t *Tracker) implausible(seq uint64) bool {
	return seq == ^uint64(0) || t.started && seq > t.next && seq-t.next > MaxSeqJump
}

func (t *Tracker) openGap(seq uint64) Decision {
	t.replaying = true
	t.held = seq
	t.stats.Gaps++
	return Decision{Action: ActionGap, From: t.next, To: seq - 1}
}

// applied advances past the batch at next and says how to apply it.
func (t *Tracker) applied(replayed bool) Action {
	t.next++
	t.fromOne = false
	t.stats.Applied++
	if replayed {
		t.stats.Replayed++
	}
	switch {
	case t.restarted:
		t.restarted = false
		t.epoch++
		return ActionRestart
	case t.discarded:
		t.discarded = false
		t.stats.Resets++
		t.epoch++
		return ActionReset
	}
	return ActionApply
}

// reset jumps the cursor to seq, past a hole no replay can fill, and applies it.
func (t *Tracker) reset(seq uint64, replayed bool) Action {
	t.stats.Resets++
	t.next = seq
	t.restarted = false
	t.fromOne = false
	t.discarded = false
	t.applied(replayed)
	t.epoch++
	return ActionReset
}

// Replayed decides what to do with a batch that a replay brought: ActionApply,
// ActionRestart (the first batch after an engine restart), ActionDuplicate,
// ActionReset when the replay skipped seqs we need (drop the worker's blocks, then
// apply this batch), or ActionRefuse for an implausible seq (see Observe).
func (t *Tracker) Replayed(seq uint64) Action {
	if t.implausible(seq) {
		return ActionRefuse
	}
	t.startAtOne(seq)
	switch {
	case !t.started:
		t.started = true
		t.next = seq
		return t.applied(true)
	case seq < t.next:
		t.stats.Duplicates++
		return ActionDuplicate
	case seq == t.next:
		return t.applied(true)
	}
	return t.reset(seq, true)
}

// FinishReplay closes the replay opened by ActionGap (it ended, failed or timed out,
// or there is no replay endpoint) and decides about the held batch: ActionApply (or
// ActionRestart) when the replay filled the gap up to it, ActionDuplicate when the
// replay brought it too, ActionReset when the gap is still open (drop the worker's
// blocks, then apply it). Without an open replay it returns ActionNone.
func (t *Tracker) FinishReplay() Action {
	if !t.replaying {
		return ActionNone
	}
	t.replaying = false
	t.startAtOne(t.held)
	switch {
	case t.held < t.next:
		t.stats.Duplicates++
		return ActionDuplicate
	case t.held == t.next:
		return t.applied(false)
	}
	return t.reset(t.held, false)
}

// startAtOne lets a restarted engine's new stream start at seq 1 when 0 is not
// coming (see Decision.Restart).
func (t *Tracker) startAtOne(seq uint64) {
	if t.fromOne && t.next == 0 && seq == 1 {
		t.next = 1
	}
}

// Discard tells the tracker that a batch it said to apply could not be (its payload
// did not decode). Its events are lost, and a lost BlockRemoved would leave stale
// blocks, so the next batch to apply comes with a clear (ActionReset).
func (t *Tracker) Discard() { t.discarded = true }

// Cursor is the position of the stream: the seq of the last batch applied and the
// epoch (the number of clears, ActionRestart or ActionReset, since the stream's
// first batch or the Resume cursor's epoch). ok is false before the first batch is
// applied and while an engine restart waits for its first batch.
func (t *Tracker) Cursor() (c Cursor, ok bool) {
	if !t.started || t.next == 0 || t.restarted {
		return Cursor{Epoch: t.epoch}, false
	}
	return Cursor{Seq: t.next - 1, Epoch: t.epoch}, true
}

// dropHeld abandons an open replay and the batch it held: the caller lost them
// (its stream runner stopped), and the next batch shows the hole they leave.
func (t *Tracker) dropHeld() {
	t.replaying = false
}

// Replaying reports whether a replay is open (between ActionGap and FinishReplay).
func (t *Tracker) Replaying() bool { return t.replaying }

// Stats returns the stream's counters.
func (t *Tracker) Stats() TrackerStats { return t.stats }
