package ingest

import (
	"context"
	"fmt"
	"testing"

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
