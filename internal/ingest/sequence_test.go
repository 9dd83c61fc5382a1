package ingest

import (
	"fmt"
	"testing"
)

// step is one call on a Tracker and what it must answer.
type step struct {
	op       string // "observe", "replayed", "finish", "resume"
	seq      uint64
	want     Action
	from, to uint64 // for ActionGap
}

func observe(seq uint64, want Action) step { return step{op: "observe", seq: seq, want: want} }
func gap(seq, from, to uint64) step {
	return step{op: "observe", seq: seq, want: ActionGap, from: from, to: to}
}
func replayed(seq uint64, want Action) step { return step{op: "replayed", seq: seq, want: want} }
func finish(want Action) step               { return step{op: "finish", want: want} }
func resume(last uint64) step               { return step{op: "resume", seq: last} }

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
		name     string
		window   uint64
		steps    []step
		last     uint64
		hasLast  bool
		stats    TrackerStats
		replying bool
	}{
		{
			name:  "first batch is accepted whatever its seq",
			steps: steps(observe(500, ActionApply), observe(501, ActionApply)),
			last:  501, hasLast: true,
			stats: TrackerStats{Applied: 2},
		},
		{
			name:  "in order from zero",
			steps: applyRange(0, 3),
			last:  3, hasLast: true,
			stats: TrackerStats{Applied: 4},
		},
		{
			name: "gap filled by replay, then the held batch",
			steps: steps(applyRange(0, 2), gap(5, 3, 4),
				replayed(3, ActionApply), replayed(4, ActionApply), finish(ActionApply),
				observe(6, ActionApply)),
			last: 6, hasLast: true,
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
			last: 9, hasLast: true,
			stats: TrackerStats{Applied: 10, Replayed: 6, Duplicates: 4, Gaps: 1},
		},
		{
			name: "replay that starts after the gap resets the worker at its first batch",
			steps: steps(applyRange(0, 2), gap(10, 3, 9),
				replayed(6, ActionReset), replayed(7, ActionApply), replayed(8, ActionApply), replayed(9, ActionApply),
				finish(ActionApply), observe(11, ActionApply)),
			last: 11, hasLast: true,
			stats: TrackerStats{Applied: 9, Replayed: 4, Gaps: 1, Resets: 1},
		},
		{
			name: "replay that ends before the held batch resets the worker at it",
			steps: steps(applyRange(0, 2), gap(10, 3, 9),
				replayed(3, ActionApply), replayed(4, ActionApply), finish(ActionReset),
				observe(11, ActionApply)),
			last: 11, hasLast: true,
			stats: TrackerStats{Applied: 7, Replayed: 2, Gaps: 1, Resets: 1},
		},
		{
			name:  "no replay possible: finish at once resets",
			steps: steps(applyRange(0, 2), gap(10, 3, 9), finish(ActionReset), observe(11, ActionApply)),
			last:  11, hasLast: true,
			stats: TrackerStats{Applied: 5, Gaps: 1, Resets: 1},
		},
		{
			name: "replayed duplicates before the gap are dropped",
			steps: steps(applyRange(0, 2), gap(5, 3, 4),
				replayed(1, ActionDuplicate), replayed(2, ActionDuplicate), replayed(3, ActionApply),
				replayed(4, ActionApply), finish(ActionApply)),
			last: 5, hasLast: true,
			stats: TrackerStats{Applied: 6, Replayed: 2, Duplicates: 2, Gaps: 1},
		},
		{
			name: "a live batch during a replay does not open a second one",
			steps: steps(applyRange(0, 2), gap(5, 3, 4), gap(7, 3, 6),
				replayed(3, ActionApply), replayed(4, ActionApply), replayed(5, ActionApply),
				replayed(6, ActionApply), replayed(7, ActionApply), finish(ActionDuplicate)),
			last: 7, hasLast: true,
			stats: TrackerStats{Applied: 8, Replayed: 5, Duplicates: 1, Gaps: 1},
		},
		{
			name: "engine restart: seq back to 0, then the new stream",
			steps: steps(applyRange(0, 5), observe(0, ActionRestart),
				observe(0, ActionApply), observe(1, ActionApply)),
			last: 1, hasLast: true,
			stats: TrackerStats{Applied: 8, Restarts: 1},
		},
		{
			name: "engine restart seen late: the new stream's start is replayed",
			steps: steps(applyRange(100, 101), observe(2, ActionRestart), gap(2, 0, 1),
				replayed(0, ActionApply), replayed(1, ActionApply), finish(ActionApply)),
			last: 2, hasLast: true,
			stats: TrackerStats{Applied: 5, Replayed: 2, Gaps: 1, Restarts: 1},
		},
		{
			name:  "engine restart right after its first batch",
			steps: steps(observe(0, ActionApply), observe(0, ActionRestart), observe(0, ActionApply)),
			last:  0, hasLast: true,
			stats: TrackerStats{Applied: 2, Restarts: 1},
		},
		{
			name:   "going back far from zero is a duplicate, not a restart",
			window: 1000,
			steps:  steps(applyRange(5000, 5001), observe(4000, ActionDuplicate), observe(5002, ActionApply)),
			last:   5002, hasLast: true,
			stats: TrackerStats{Applied: 3, Duplicates: 1},
		},
		{
			name:    "restart while a replay is open abandons the replay",
			steps:   steps(applyRange(0, 2), gap(5, 3, 4), observe(0, ActionRestart), finish(ActionNone)),
			hasLast: false,
			stats:   TrackerStats{Applied: 3, Gaps: 1, Restarts: 1},
		},
		{
			name:  "resume from a cursor continues after it",
			steps: steps(resume(99), observe(100, ActionApply)),
			last:  100, hasLast: true,
			stats: TrackerStats{Applied: 1},
		},
		{
			name:  "resume from a cursor, then a gap",
			steps: steps(resume(99), gap(105, 100, 104), replayed(100, ActionApply)),
			last:  100, hasLast: true, replying: true,
			stats: TrackerStats{Applied: 1, Replayed: 1, Gaps: 1},
		},
		{
			name:    "resume from a cursor, then a seq near 0 is a restart",
			steps:   steps(resume(99), observe(3, ActionRestart), gap(3, 0, 2)),
			hasLast: false, replying: true,
			stats: TrackerStats{Restarts: 1, Gaps: 1},
		},
		{
			name:   "resume from a cursor, then an old seq beyond the window is a duplicate",
			window: 10,
			steps:  steps(resume(99), observe(50, ActionDuplicate), observe(100, ActionApply)),
			last:   100, hasLast: true,
			stats: TrackerStats{Applied: 1, Duplicates: 1},
		},
		{
			name:  "finish without an open replay does nothing",
			steps: steps(observe(0, ActionApply), finish(ActionNone)),
			last:  0, hasLast: true,
			stats: TrackerStats{Applied: 1},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tr := NewTracker(c.window)
			for i, s := range c.steps {
				at := fmt.Sprintf("step %d (%s %d)", i, s.op, s.seq)
				switch s.op {
				case "observe":
					d := tr.Observe(s.seq)
					want := Decision{Action: s.want, From: s.from, To: s.to}
					if d != want {
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
					tr.Resume(s.seq)
				}
			}
			last, ok := tr.Last()
			if ok != c.hasLast || (ok && last != c.last) {
				t.Errorf("Last() = %d, %v; want %d, %v", last, ok, c.last, c.hasLast)
			}
			if got := tr.Stats(); got != c.stats {
				t.Errorf("stats %+v, want %+v", got, c.stats)
			}
			if tr.Replaying() != c.replying {
				t.Errorf("Replaying() = %v, want %v", tr.Replaying(), c.replying)
			}
		})
	}
}

func TestNewTrackerDefaultWindow(t *testing.T) {
	tr := NewTracker(0)
	tr.Observe(DefaultRestartWindow + 10)
	if d := tr.Observe(DefaultRestartWindow - 1); d.Action != ActionRestart {
		t.Fatalf("seq just below the default window: got %s, want restart", d.Action)
	}
	tr = NewTracker(0)
	tr.Observe(DefaultRestartWindow + 10)
	if d := tr.Observe(DefaultRestartWindow); d.Action != ActionDuplicate {
		t.Fatalf("seq at the default window: got %s, want duplicate", d.Action)
	}
}
