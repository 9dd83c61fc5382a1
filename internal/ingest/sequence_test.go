package ingest

import (
	"fmt"
	"testing"
)

// step is one call on a Tracker and what it must answer.
type step struct {
	op       string // "observe", "observe-restart", "replayed", "finish", "resume", "discard", "fresh"
	seq      uint64
	want     Action
	from, to uint64 // for ActionGap; from is the epoch for "resume"
	restart  bool   // Decision.Restart
}

func observe(seq uint64, want Action) step { return step{op: "observe", seq: seq, want: want} }
func gap(seq, from, to uint64) step {
	return step{op: "observe", seq: seq, want: ActionGap, from: from, to: to}
}

// restartGap is a live seq > 0 of a restarted engine: ask for 0..seq-1, no gap.
func restartGap(seq uint64) step {
	return step{op: "observe", seq: seq, want: ActionGap, from: 0, to: seq - 1, restart: true}
}

// restartProbe is a live seq 1 after an engine restart: ask for 0, no gap.
func restartProbe() step { return restartGap(1) }

// observeRestart is ObserveRestart(seq) answering want (a restart gap when want is ActionGap).
func observeRestart(seq uint64, want Action) step {
	s := step{op: "observe-restart", seq: seq, want: want}
	if want == ActionGap {
		s.to, s.restart = seq-1, true
	}
	return s
}
func replayed(seq uint64, want Action) step { return step{op: "replayed", seq: seq, want: want} }
func finish(want Action) step               { return step{op: "finish", want: want} }
func resume(last, epoch uint64) step        { return step{op: "resume", seq: last, from: epoch} }
func discard() step                         { return step{op: "discard"} }
func fresh(epoch uint64) step               { return step{op: "fresh", from: epoch} }

// applyReplayed is replayed(from..to) all applied.
func applyReplayed(from, to uint64) []step {
	var s []step
	for seq := from; seq <= to; seq++ {
		s = append(s, replayed(seq, ActionApply))
	}
	return s
}

// applyRange is observe(from..to) all applied.
func applyRange(from, to uint64) []step {
	var s []step
	for seq := from; seq <= to; seq++ {
		s = append(s, observe(seq, ActionApply))
	}
	return s
}

func steps(parts ...any) []step {
	var s []step
	for _, p := range parts {
		switch p := p.(type) {
		case step:
			s = append(s, p)
		case []step:
			s = append(s, p...)
		}
	}
	return s
}

func TestTracker(t *testing.T) {
	cases := []struct {
		name      string
		window    uint64
		steps     []step
		cursor    Cursor
		hasCursor bool
		stats     TrackerStats
		replaying bool
	}{
		{
			name:   "first batch is accepted whatever its seq",
			steps:  steps(observe(500, ActionApply), observe(501, ActionApply)),
			cursor: Cursor{Seq: 501}, hasCursor: true,
			stats: TrackerStats{Applied: 2},
		},
		{
			name:   "in order from zero",
			steps:  applyRange(0, 3),
			cursor: Cursor{Seq: 3}, hasCursor: true,
			stats: TrackerStats{Applied: 4},
		},
		{
			name: "gap filled by replay, then the held batch",
			steps: steps(applyRange(0, 2), gap(5, 3, 4),
				replayed(3, ActionApply), replayed(4, ActionApply), finish(ActionApply),
				observe(6, ActionApply)),
			cursor: Cursor{Seq: 6}, hasCursor: true,
			stats: TrackerStats{Applied: 7, Replayed: 2, Gaps: 1},
		},
		{
			name: "replay went past the held batch: it and later live batches are duplicates",
			steps: steps(applyRange(0, 2), gap(5, 3, 4),
				replayed(3, ActionApply), replayed(4, ActionApply), replayed(5, ActionApply),
				replayed(6, ActionApply), replayed(7, ActionApply), replayed(8, ActionApply),
				finish(ActionDuplicate),
				observe(6, ActionDuplicate), observe(7, ActionDuplicate), observe(8, ActionDuplicate),
				observe(9, ActionApply)),
			cursor: Cursor{Seq: 9}, hasCursor: true,
			stats: TrackerStats{Applied: 10, Replayed: 6, Duplicates: 4, Gaps: 1},
		},
		{
			name: "replay that starts after the gap resets the worker at its first batch",
			steps: steps(applyRange(0, 2), gap(10, 3, 9),
				replayed(6, ActionReset), replayed(7, ActionApply), replayed(8, ActionApply), replayed(9, ActionApply),
				finish(ActionApply), observe(11, ActionApply)),
			cursor: Cursor{Seq: 11, Epoch: 1}, hasCursor: true,
			stats: TrackerStats{Applied: 9, Replayed: 4, Gaps: 1, Resets: 1},
		},
		{
			name: "replay that ends before the held batch resets the worker at it",
			steps: steps(applyRange(0, 2), gap(10, 3, 9),
				replayed(3, ActionApply), replayed(4, ActionApply), finish(ActionReset),
				observe(11, ActionApply)),
			cursor: Cursor{Seq: 11, Epoch: 1}, hasCursor: true,
			stats: TrackerStats{Applied: 7, Replayed: 2, Gaps: 1, Resets: 1},
		},
		{
			name:   "no replay possible: finish at once resets",
			steps:  steps(applyRange(0, 2), gap(10, 3, 9), finish(ActionReset), observe(11, ActionApply)),
			cursor: Cursor{Seq: 11, Epoch: 1}, hasCursor: true,
			stats: TrackerStats{Applied: 5, Gaps: 1, Resets: 1},
		},
		{
			name: "two unfillable gaps are two epochs",
			steps: steps(observe(0, ActionApply), gap(5, 1, 4), finish(ActionReset),
				gap(9, 6, 8), replayed(7, ActionReset), replayed(8, ActionApply), finish(ActionApply)),
			cursor: Cursor{Seq: 9, Epoch: 2}, hasCursor: true,
			stats: TrackerStats{Applied: 5, Replayed: 2, Gaps: 2, Resets: 2},
		},
		{
			name: "replayed duplicates before the gap are dropped",
			steps: steps(applyRange(0, 2), gap(5, 3, 4),
				replayed(1, ActionDuplicate), replayed(2, ActionDuplicate), replayed(3, ActionApply),
				replayed(4, ActionApply), finish(ActionApply)),
			cursor: Cursor{Seq: 5}, hasCursor: true,
			stats: TrackerStats{Applied: 6, Replayed: 2, Duplicates: 2, Gaps: 1},
		},
		{
			name: "a live batch during a replay does not open a second one",
			steps: steps(applyRange(0, 2), gap(5, 3, 4), gap(7, 3, 6),
				replayed(3, ActionApply), replayed(4, ActionApply), replayed(5, ActionApply),
				replayed(6, ActionApply), replayed(7, ActionApply), finish(ActionDuplicate)),
			cursor: Cursor{Seq: 7}, hasCursor: true,
			stats: TrackerStats{Applied: 8, Replayed: 5, Duplicates: 1, Gaps: 1},
		},
		{
			name:   "engine restart: seq back to 0 clears the worker and applies the batch",
			steps:  steps(applyRange(0, 5), observe(0, ActionRestart), observe(1, ActionApply)),
			cursor: Cursor{Seq: 1, Epoch: 1}, hasCursor: true,
			stats: TrackerStats{Applied: 8, Restarts: 1},
		},
		{
			name: "engine restart seen late: the new stream's start is replayed, no gap, its first batch clears",
			steps: steps(applyRange(100, 101), restartGap(2),
				replayed(0, ActionRestart), replayed(1, ActionApply), finish(ActionApply), observe(3, ActionApply)),
			cursor: Cursor{Seq: 3, Epoch: 1}, hasCursor: true,
			stats: TrackerStats{Applied: 6, Replayed: 2, Restarts: 1},
		},
		{
			name: "engine restart to seq 1 (llm-d counts from 1), no replay: a restart, not a gap",
			steps: steps(applyRange(0, 9), restartProbe(),
				finish(ActionRestart), observe(2, ActionApply)),
			cursor: Cursor{Seq: 2, Epoch: 1}, hasCursor: true,
			stats: TrackerStats{Applied: 12, Restarts: 1},
		},
		{
			name: "engine restart to seq 1, the replay brings 0: it clears, 1 follows",
			steps: steps(applyRange(0, 9), restartProbe(),
				replayed(0, ActionRestart), replayed(1, ActionApply), finish(ActionDuplicate), observe(2, ActionApply)),
			cursor: Cursor{Seq: 2, Epoch: 1}, hasCursor: true,
			stats: TrackerStats{Applied: 13, Replayed: 2, Duplicates: 1, Restarts: 1},
		},
		{
			name: "engine restart to seq 1, the replay starts at 1: the stream starts there",
			steps: steps(applyRange(0, 9), restartProbe(),
				replayed(1, ActionRestart), finish(ActionDuplicate), observe(2, ActionApply)),
			cursor: Cursor{Seq: 2, Epoch: 1}, hasCursor: true,
			stats: TrackerStats{Applied: 12, Replayed: 1, Duplicates: 1, Restarts: 1},
		},
		{
			name: "llm-d restart seen late: a replay from 1 brings the new stream's start",
			steps: steps(applyRange(1, 9), restartGap(3),
				replayed(1, ActionRestart), replayed(2, ActionApply), finish(ActionApply), observe(4, ActionApply)),
			cursor: Cursor{Seq: 4, Epoch: 1}, hasCursor: true,
			stats: TrackerStats{Applied: 13, Replayed: 2, Restarts: 1},
		},
		{
			name:   "engine restart seen late, replay impossible: one reset, no gap",
			steps:  steps(applyRange(0, 9), restartGap(3), finish(ActionReset), observe(4, ActionApply)),
			cursor: Cursor{Seq: 4, Epoch: 1}, hasCursor: true,
			stats: TrackerStats{Applied: 12, Restarts: 1, Resets: 1},
		},
		{
			name:   "engine restart right after its first batch",
			steps:  steps(observe(0, ActionApply), observe(0, ActionRestart), observe(1, ActionApply)),
			cursor: Cursor{Seq: 1, Epoch: 1}, hasCursor: true,
			stats: TrackerStats{Applied: 3, Restarts: 1},
		},
		{
			name:   "going back far from zero is a duplicate, not a restart",
			window: 1000,
			steps:  steps(applyRange(5000, 5001), observe(4000, ActionDuplicate), observe(5002, ActionApply)),
			cursor: Cursor{Seq: 5002}, hasCursor: true,
			stats: TrackerStats{Applied: 3, Duplicates: 1},
		},
		{
			name:   "restart while a replay is open abandons the replay",
			steps:  steps(applyRange(0, 2), gap(5, 3, 4), observe(0, ActionRestart), finish(ActionNone)),
			cursor: Cursor{Seq: 0, Epoch: 1}, hasCursor: true,
			stats: TrackerStats{Applied: 4, Gaps: 1, Restarts: 1},
		},
		{
			name:   "resume from a cursor continues after it, in its epoch",
			steps:  steps(resume(99, 4), observe(100, ActionApply)),
			cursor: Cursor{Seq: 100, Epoch: 4}, hasCursor: true,
			stats: TrackerStats{Applied: 1},
		},
		{
			name:   "resume from a cursor, then a gap",
			steps:  steps(resume(99, 0), gap(105, 100, 104), replayed(100, ActionApply)),
			cursor: Cursor{Seq: 100}, hasCursor: true, replaying: true,
			stats: TrackerStats{Applied: 1, Replayed: 1, Gaps: 1},
		},
		{
			name:   "resume from a cursor, then a seq near 0 is a restart awaiting its first batch",
			steps:  steps(resume(99, 2), restartGap(3)),
			cursor: Cursor{Epoch: 2}, hasCursor: false, replaying: true,
			stats: TrackerStats{Restarts: 1},
		},
		{
			name:   "resume from a cursor, then an old seq beyond the window is a duplicate",
			window: 10,
			steps:  steps(resume(99, 0), observe(50, ActionDuplicate), observe(100, ActionApply)),
			cursor: Cursor{Seq: 100}, hasCursor: true,
			stats: TrackerStats{Applied: 1, Duplicates: 1},
		},
		{
			name:   "a restart the caller recognises below the cursor, beyond the window, replays the new stream's start",
			window: 10,
			steps: steps(applyRange(100, 105), observeRestart(50, ActionGap),
				replayed(0, ActionRestart), applyReplayed(1, 49), finish(ActionApply), observe(51, ActionApply)),
			cursor: Cursor{Seq: 51, Epoch: 1}, hasCursor: true,
			stats: TrackerStats{Applied: 58, Replayed: 50, Restarts: 1},
		},
		{
			name:   "a restart the caller recognises at seq 0 clears at once",
			window: 3,
			steps:  steps(applyRange(0, 9), observe(5, ActionDuplicate), observeRestart(0, ActionRestart), observe(1, ActionApply)),
			cursor: Cursor{Seq: 1, Epoch: 1}, hasCursor: true,
			stats: TrackerStats{Applied: 12, Duplicates: 1, Restarts: 1},
		},
		{
			name:   "ObserveRestart beyond the cursor is an ordinary batch",
			steps:  steps(applyRange(0, 3), observeRestart(4, ActionApply)),
			cursor: Cursor{Seq: 4}, hasCursor: true,
			stats: TrackerStats{Applied: 5},
		},
		{
			name:   "a seq more than MaxSeqJump past the cursor is refused and changes nothing",
			steps:  steps(applyRange(0, 3), observe(4+MaxSeqJump+1, ActionRefuse), observe(4, ActionApply), observe(5, ActionApply)),
			cursor: Cursor{Seq: 5}, hasCursor: true,
			stats: TrackerStats{Applied: 6},
		},
		{
			name:   "a jump of MaxSeqJump is still a gap",
			steps:  steps(applyRange(0, 3), gap(4+MaxSeqJump, 4, 3+MaxSeqJump), finish(ActionReset)),
			cursor: Cursor{Seq: 4 + MaxSeqJump, Epoch: 1}, hasCursor: true,
			stats: TrackerStats{Applied: 5, Gaps: 1, Resets: 1},
		},
		{
			name:   "the end marker's seq is refused, even as a first batch",
			steps:  steps(observe(^uint64(0), ActionRefuse), observe(7, ActionApply), observe(^uint64(0), ActionRefuse)),
			cursor: Cursor{Seq: 7}, hasCursor: true,
			stats: TrackerStats{Applied: 1},
		},
		{
			name:   "the largest seq short of the end marker is taken without overflow",
			steps:  steps(observe(^uint64(0)-1, ActionApply), observe(0, ActionRestart)),
			cursor: Cursor{Seq: 0, Epoch: 1}, hasCursor: true,
			stats: TrackerStats{Applied: 2, Restarts: 1},
		},
		{
			name: "an implausible replayed seq is refused; the replay goes on",
			steps: steps(applyRange(0, 2), gap(5, 3, 4), replayed(3, ActionApply), replayed(4+MaxSeqJump+1, ActionRefuse),
				replayed(4, ActionApply), finish(ActionApply)),
			cursor: Cursor{Seq: 5}, hasCursor: true,
			stats: TrackerStats{Applied: 6, Replayed: 2, Gaps: 1},
		},
		{
			name:   "finish without an open replay does nothing",
			steps:  steps(observe(0, ActionApply), finish(ActionNone)),
			cursor: Cursor{Seq: 0}, hasCursor: true,
			stats: TrackerStats{Applied: 1},
		},
		{
			name:   "a batch that did not decode makes the next one clear the worker",
			steps:  steps(applyRange(0, 2), discard(), observe(3, ActionReset), observe(4, ActionApply)),
			cursor: Cursor{Seq: 4, Epoch: 1}, hasCursor: true,
			stats: TrackerStats{Applied: 5, Resets: 1},
		},
		{
			name: "a discarded replayed batch makes the next one clear",
			steps: steps(applyRange(0, 2), gap(5, 3, 4), replayed(3, ActionApply), discard(),
				replayed(4, ActionReset), finish(ActionApply)),
			cursor: Cursor{Seq: 5, Epoch: 1}, hasCursor: true,
			stats: TrackerStats{Applied: 6, Replayed: 2, Gaps: 1, Resets: 1},
		},
		{
			name:   "a reset already clears what a discard asked for",
			steps:  steps(applyRange(0, 2), discard(), gap(5, 3, 4), finish(ActionReset), observe(6, ActionApply)),
			cursor: Cursor{Seq: 6, Epoch: 1}, hasCursor: true,
			stats: TrackerStats{Applied: 5, Gaps: 1, Resets: 1},
		},
		{
			name: "fresh: the next live batch starts a new stream, whatever its seq, and clears",
			steps: steps(applyRange(0, 5), fresh(0), observe(900, ActionRestart), observe(901, ActionApply),
				gap(903, 902, 902)),
			cursor: Cursor{Seq: 901, Epoch: 1}, hasCursor: true,
			stats: TrackerStats{Applied: 8, Restarts: 1, Gaps: 1}, replaying: true,
		},
		{
			name:   "fresh: a seq back near zero is no gap either",
			steps:  steps(applyRange(10, 20), fresh(0), observe(1, ActionRestart), observe(2, ActionApply)),
			cursor: Cursor{Seq: 2, Epoch: 1}, hasCursor: true,
			stats: TrackerStats{Applied: 13, Restarts: 1},
		},
		{
			name:   "fresh: the first replayed batch starts the new stream",
			steps:  steps(applyRange(0, 3), gap(9, 4, 8), fresh(0), replayed(5, ActionRestart), replayed(6, ActionApply), observe(7, ActionApply)),
			cursor: Cursor{Seq: 7, Epoch: 1}, hasCursor: true,
			stats: TrackerStats{Applied: 7, Replayed: 2, Gaps: 1, Restarts: 1},
		},
		{
			name:   "fresh: the epoch goes above the index's cursor",
			steps:  steps(resume(40, 3), observe(41, ActionApply), fresh(7), observe(0, ActionRestart)),
			cursor: Cursor{Seq: 0, Epoch: 8}, hasCursor: true,
			stats: TrackerStats{Applied: 2, Restarts: 1},
		},
		{
			name:   "fresh: nothing applied since",
			steps:  steps(applyRange(0, 2), fresh(0)),
			cursor: Cursor{Epoch: 0}, hasCursor: false,
			stats: TrackerStats{Applied: 3, Restarts: 1},
		},
		{
			name:      "nothing applied yet",
			steps:     nil,
			hasCursor: false,
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tr := NewTracker(c.window)
			for i, s := range c.steps {
				at := fmt.Sprintf("step %d (%s %d)", i, s.op, s.seq)
				switch s.op {
				case "observe", "observe-restart":
					d := tr.Observe
					if s.op == "observe-restart" {
						d = tr.ObserveRestart
					}
					want := Decision{Action: s.want, From: s.from, To: s.to, Restart: s.restart}
					if d := d(s.seq); d != want {
						t.Fatalf("%s: got %+v (%s), want %+v (%s)", at, d, d.Action, want, want.Action)
					}
				case "replayed":
					if got := tr.Replayed(s.seq); got != s.want {
						t.Fatalf("%s: got %s, want %s", at, got, s.want)
					}
				case "finish":
					if got := tr.FinishReplay(); got != s.want {
						t.Fatalf("%s: got %s, want %s", at, got, s.want)
					}
				case "resume":
					tr.Resume(Cursor{Seq: s.seq, Epoch: s.from})
				case "discard":
					tr.Discard()
				case "fresh":
					tr.Fresh(s.from)
				}
			}
			cur, ok := tr.Cursor()
			if ok != c.hasCursor || cur != c.cursor {
				t.Errorf("Cursor() = %+v, %v; want %+v, %v", cur, ok, c.cursor, c.hasCursor)
			}
			if got := tr.Stats(); got != c.stats {
				t.Errorf("stats %+v, want %+v", got, c.stats)
			}
			if tr.Replaying() != c.replaying {
				t.Errorf("Replaying() = %v, want %v", tr.Replaying(), c.replaying)
			}
		})
	}
}

func TestNewTrackerDefaultWindow(t *testing.T) {
	tr := NewTracker(0)
	tr.Observe(DefaultRestartWindow + 10)
	if d := tr.Observe(DefaultRestartWindow - 1); d.Action != ActionGap || d.From != 0 {
		t.Fatalf("seq just below the default window: got %+v, want a restart replaying from 0", d)
	}
	tr = NewTracker(0)
	tr.Observe(DefaultRestartWindow + 10)
	if d := tr.Observe(DefaultRestartWindow); d.Action != ActionDuplicate {
		t.Fatalf("seq at the default window: got %s, want duplicate", d.Action)
	}
}

func TestActionClearsAndApplies(t *testing.T) {
	for a := ActionNone; a <= ActionRefuse; a++ {
		if want := a == ActionRestart || a == ActionReset; a.Clears() != want {
			t.Errorf("%s.Clears() = %v, want %v", a, a.Clears(), want)
		}
		if want := a == ActionApply || a == ActionRestart || a == ActionReset; a.Applies() != want {
			t.Errorf("%s.Applies() = %v, want %v", a, a.Applies(), want)
		}
	}
}

func TestNamesOfActions(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{ActionNone.String(), "none"}, {ActionApply.String(), "apply"}, {ActionDuplicate.String(), "duplicate"},
		{ActionGap.String(), "gap"}, {ActionRestart.String(), "restart"}, {ActionReset.String(), "reset"},
		{ActionRefuse.String(), "refuse"},
		{Action(99).String(), "Action(?)"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
}
