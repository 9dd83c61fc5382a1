package ingest

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/kvindex/kvindex/bench/fakeengine"
	"github.com/kvindex/kvindex/bench/fakeengine/fakeenginetest"
	"github.com/kvindex/kvindex/internal/workerspec"
)

// droppedSeqs counts the seqs in (after, last] that an engine dropping every nth
// batch withheld (seq n-1, 2n-1, ...; see fakeengine.Faults).
func droppedSeqs(after, last int64, n int64) int {
	d := 0
	for seq := after + 1; seq <= last; seq++ {
		if (seq+1)%n == 0 {
			d++
		}
	}
	return d
}

// lastSeqs returns every rank's LastSeq.
func lastSeqs(e *fakeengine.Engine) []int64 {
	var out []int64
	for _, rt := range e.CacheTruth().Ranks {
		out = append(out, rt.LastSeq)
	}
	return out
}

// publishPastDrop makes an engine publish until no rank's last batch is a dropped
// one: a withheld last batch is a gap nobody can see until the next batch.
func publishPastDrop(t *testing.T, e *fakeengine.Engine, n int64) {
	t.Helper()
	for round := 0; ; round++ {
		dropped := false
		for _, seq := range lastSeqs(e) {
			dropped = dropped || (seq+1)%n == 0
		}
		if !dropped {
			return
		}
		if round == 20 {
			t.Fatal("the engine keeps ending on a dropped batch")
		}
		if _, err := e.Generate(context.Background(), fakeengine.Request{Prompt: []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9}, MaxTokens: 2}); err != nil {
			t.Fatal(err)
		}
		if err := e.Flush(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

func TestDroppedBatchesAreReplayed(t *testing.T) {
	const every = 50
	cfg := testManagerConfig()
	cfg.ZMQBind = "tcp://127.0.0.1:*"
	p := startPipeline(t, cfg)

	plain := fakeenginetest.Start(t, engineConfig())
	legacy := func() *fakeengine.Engine {
		c := engineConfig()
		c.ReplayLayout = fakeengine.ReplayLegacy
		c.NumCPUBlocks = 16
		return fakeenginetest.Start(t, c)
	}()
	viaBind := bindEngine(t, p, nil)
	bindID := topicWorkerID(t, viaBind)
	engines := []followed{{"plain", plain}, {"legacy", legacy}, {bindID, viaBind}}
	for _, f := range engines[:2] {
		if err := p.mgr.AddWorker(connectSpec(f.worker, f.engine)); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.mgr.AddWorker(workerspec.Spec{ID: bindID, Model: viaBind.Config().Model, Replay: viaBind.ReplayEndpoints()[0]}); err != nil {
		t.Fatal(err)
	}

	// Warm up without faults, so that every stream is followed before the drops
	// start and every drop is a gap on a live stream.
	handshake(t, p, engines...)
	traffic{seed: 7, requests: 8, inFlight: 2}.run(t, plain, legacy, viaBind)
	waitConverged(t, p.applier, engines...)
	before := map[string][]int64{}
	for _, f := range engines {
		before[f.worker] = lastSeqs(f.engine)
		if err := f.engine.SetFaults(fakeengine.Faults{DropEveryNBatches: every, FailStatus: 500}); err != nil {
			t.Fatal(err)
		}
	}
	traffic{seed: 8, requests: 150, inFlight: 4, salts: []string{"s1"}}.run(t, plain, legacy, viaBind)
	for _, f := range engines {
		publishPastDrop(t, f.engine, every)
	}
	waitConverged(t, p.applier, engines...)
	p.stopRun()

	total := 0
	for _, f := range engines {
		want := 0
		for r, last := range lastSeqs(f.engine) {
			want += droppedSeqs(before[f.worker][r], last, every)
		}
		total += want
		w := map[string]string{"worker": f.worker}
		gap := map[string]string{"worker": f.worker, "reason": "gap"}
		ok := map[string]string{"worker": f.worker, "reason": "gap", "result": "ok"}
		// What must hold: every withheld batch is a gap that a replay filled. A
		// busy machine may lose one more live batch to ZMQ (a late subscription,
		// a full queue): that is one more gap, replayed like the others, so the
		// counts are lower bounds and every gap must have been replayed.
		gaps := p.counter("kvindex_ingest_gaps_total", w)
		if gaps < float64(want) {
			t.Errorf("%s: gaps = %v, want at least %d (batches the engine withheld)", f.worker, gaps, want)
		}
		if got := p.counter("kvindex_ingest_replays_total", ok); got != gaps {
			t.Errorf("%s: successful gap replays = %v, want one per gap (%v)", f.worker, got, gaps)
		}
		if got := p.counter("kvindex_ingest_replayed_batches_total", gap); got < float64(want) {
			t.Errorf("%s: replayed batches = %v, want at least %d", f.worker, got, want)
		}
		if got := p.counter("kvindex_ingest_resets_total", w); got != 0 {
			t.Errorf("%s: resets = %v, want 0 (every gap was replayable)", f.worker, got)
		}
	}
	if total < 6 {
		t.Fatalf("only %d batches were dropped; the test needs more traffic to mean something", total)
	}
	assertIndexEqualsTruth(t, p.index, engines...)
}

// TestEngineRestartLeavesNoBlockOfTheOldStream restarts an engine whose streams
// count from 0 (vLLM) and one counting from 1 (llm-d's publishers): both are one
// restart, no gap and no other reset.
func TestEngineRestartLeavesNoBlockOfTheOldStream(t *testing.T) {
	for _, firstSeq := range []int64{0, 1} {
		t.Run(fmt.Sprintf("first_seq_%d", firstSeq), func(t *testing.T) { testEngineRestart(t, firstSeq) })
	}
}

func testEngineRestart(t *testing.T, firstSeq int64) {
	p := startPipeline(t, testManagerConfig())
	rc := engineConfig()
	rc.KVEventsFirstSeq = firstSeq
	restarted := fakeenginetest.Start(t, rc)
	steady := fakeenginetest.Start(t, engineConfig())
	engines := []followed{{"restarted", restarted}, {"steady", steady}}
	for _, f := range engines {
		if err := p.mgr.AddWorker(connectSpec(f.worker, f.engine)); err != nil {
			t.Fatal(err)
		}
	}
	handshake(t, p, engines...)
	traffic{seed: 21, requests: 40, inFlight: 3}.run(t, restarted, steady)
	waitConverged(t, p.applier, engines...)
	old := truthBlocks(t, engines[0])
	oldCursor, _ := p.applier.Cursor(Stream{Worker: "restarted"})
	// A live batch lost to ZMQ's slow-joiner window at start-up is a gap of its
	// own; the restart must add none.
	gapsBefore := p.counter("kvindex_ingest_gaps_total", map[string]string{"worker": "restarted"})

	if err := restarted.RestartEventStream(); err != nil {
		t.Fatal(err)
	}
	traffic{seed: 22, requests: 20, inFlight: 3}.run(t, restarted, steady)
	waitFor(t, "the restarted stream's new epoch", func() bool {
		c, ok := p.applier.Cursor(Stream{Worker: "restarted"})
		return ok && c.Epoch > oldCursor.Epoch
	})
	waitConverged(t, p.applier, engines...)
	p.stopRun()

	if got := p.counter("kvindex_ingest_resets_total", map[string]string{"worker": "restarted", "reason": "restart"}); got != 1 {
		t.Errorf("restart resets = %v, want 1", got)
	}
	if got := p.counter("kvindex_ingest_resets_total", map[string]string{"worker": "restarted"}); got != 1 {
		t.Errorf("resets of any reason = %v, want only the restart", got)
	}
	if got := p.counter("kvindex_ingest_gaps_total", map[string]string{"worker": "restarted"}); got != gapsBefore {
		t.Errorf("gaps = %v after the restart, %v before: a restart is not a gap", got, gapsBefore)
	}
	if got := p.counter("kvindex_ingest_resets_total", map[string]string{"worker": "steady"}); got != 0 {
		t.Errorf("the steady engine was reset %v times", got)
	}
	current := map[uint64]bool{}
	for _, tb := range truthBlocks(t, engines[0]) {
		current[tb.block.Hash] = true
	}
	survivors := 0
	for _, tb := range old {
		if current[tb.block.Hash] {
			continue // cached again by the new stream
		}
		for _, tier := range tb.tiers {
			if res, _ := p.index.Removed(tb.worker, []uint64{tb.block.Hash}, tier); res.Removed != 0 {
				survivors++
			}
		}
	}
	if survivors != 0 {
		t.Errorf("%d blocks of the engine's old stream survive in the index", survivors)
	}
	if len(old) == 0 {
		t.Fatal("the engine cached nothing before its restart")
	}
	assertIndexEqualsTruth(t, p.index, engines...)
}

// An engine restarts and the first live batch we get of its new stream is seq
// 5 (0..4 lost while the SUB socket reconnected): the old stream's blocks go,
// the new stream's start is replayed, and it is no gap. Also when a replay
// took the stream's cursor past the live batches seen (an idle catch-up
// brought 2..9 the live socket lost): seq 5 then lies between the last live
// seq and the cursor, but it is stamped later than every batch applied, which
// no copy of an applied batch is, so it is the restart, not a duplicate.
func TestEngineRestartSeenLateClearsTheOldStreamWithoutAGap(t *testing.T) {
	for _, caughtUp := range []bool{false, true} {
		t.Run(fmt.Sprintf("old_stream_caught_up_by_replay_%v", caughtUp), func(t *testing.T) { testRestartSeenLate(t, caughtUp) })
	}
}

func testRestartSeenLate(t *testing.T, caughtUp bool) {
	e := newHandEngine(t)
	cfg := testManagerConfig()
	cfg.IdleReplayInterval = 100 * time.Millisecond
	p := startPipeline(t, cfg)
	const w = "w"
	s := Stream{Worker: w}
	old, fresh := map[uint64][]byte{}, map[uint64][]byte{}
	for seq := uint64(0); seq <= 12; seq++ {
		old[seq] = oneBlock(t, float64(1000+seq), 100+seq)
		fresh[seq] = oneBlock(t, float64(2000+seq), 200+seq)
	}
	e.setBuffer(map[uint64][]byte{0: old[0]})
	if err := p.mgr.AddWorker(e.spec(w)); err != nil {
		t.Fatal(err)
	}
	e.publishUntil(t, "live seq 1 applied", 1, old[1], func() bool { c, _ := p.applier.Cursor(s); return c.Seq == 1 })
	buffer := map[uint64][]byte{}
	for seq := uint64(0); seq <= 9; seq++ {
		buffer[seq] = old[seq]
	}
	e.setBuffer(buffer)
	if !caughtUp {
		for seq := uint64(2); seq <= 9; seq++ {
			e.publish(seq, old[seq])
		}
	} // else 2..9 are lost live; the idle catch-up brings them
	waitFor(t, "the old stream applied to 9", func() bool { c, _ := p.applier.Cursor(s); return c.Seq == 9 })

	// The engine restarts; its first five batches are lost to the reconnect.
	// Its buffer holds no more than it published until seq 5 is handled: an
	// idle catch-up would otherwise take its seqs past the old cursor for the
	// old stream's continuation.
	buffer = map[uint64][]byte{}
	for seq := uint64(0); seq <= 5; seq++ {
		buffer[seq] = fresh[seq]
	}
	e.setBuffer(buffer)
	duplicates := func() float64 {
		return p.counter("kvindex_ingest_batches_total", map[string]string{"worker": w, "result": "duplicate"})
	}
	dups := duplicates()
	e.publish(5, fresh[5])
	waitFor(t, "seq 5 handled", func() bool { seq, _ := p.handedOff(w); return seq == 5 || duplicates() > dups })
	e.setBuffer(fresh)
	for seq := uint64(6); seq <= 12; seq++ {
		e.publish(seq, fresh[seq])
	}
	waitFor(t, "seq 12 of the new stream handed off", func() bool { seq, ok := p.handedOff(w); return ok && seq == 12 })
	p.flush()
	p.stopRun()

	if c, _ := p.applier.Cursor(s); c != (Cursor{Seq: 12, Epoch: 1}) {
		t.Errorf("index cursor = %+v, want seq 12 in epoch 1 (one clear, the restart's)", c)
	}
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"kvindex_ingest_resets_total", map[string]string{"worker": w, "reason": "restart"}, 1},
		{"kvindex_ingest_resets_total", map[string]string{"worker": w}, 1},
		{"kvindex_ingest_gaps_total", map[string]string{"worker": w}, 0},
		{"kvindex_ingest_replays_total", map[string]string{"worker": w, "reason": "gap"}, 0},
		{"kvindex_ingest_replays_total", map[string]string{"worker": w, "reason": "restart", "result": "ok"}, 1},
	} {
		if got := p.counter(c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	if stale := holding(p.index, s, hashRange(100, 112)...); len(stale) != 0 {
		t.Errorf("blocks %v of the engine's old stream survive its restart", stale)
	}
	if held := holding(p.index, s, hashRange(200, 212)...); !slices.Equal(held, hashRange(200, 212)) {
		t.Errorf("the index holds %v of the new stream's blocks 200..212", held)
	}
}
