package ingest

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/kvindex/kvindex/bench/fakeengine/fakeenginetest"
	"github.com/kvindex/kvindex/internal/workerspec"
)

// Run is called again and again (a node that loses and regains Raft leadership):
// every Run stops every goroutine and socket it started, and the next one resumes
// each stream from the index's cursors, replaying what was published meanwhile.
func TestRunStopsCleanlyAndResumesFromCursors(t *testing.T) {
	first := fakeenginetest.Start(t, engineConfig())
	second := fakeenginetest.Start(t, engineConfig())
	viaFile := fakeenginetest.Start(t, engineConfig())
	dir := t.TempDir()
	file := filepath.Join(dir, "workers.yaml")
	writeWorkersFile(t, file, connectSpec("from-file", viaFile))

	cfg := testManagerConfig()
	cfg.WorkersFile = file
	cfg.Workers = []workerspec.Spec{connectSpec("first", first)}
	// Each Run subscribes anew, and a burst published before a subscription is
	// live reaches the index only through an idle stream's replay.
	cfg.IdleReplayInterval = 20 * time.Millisecond
	p := newPipeline(t, cfg)
	if err := p.mgr.AddWorker(connectSpec("second", second)); err != nil {
		t.Fatal(err)
	}
	engines := []followed{{"first", first}, {"second", second}, {"from-file", viaFile}}

	sinkCtx, stopSink := context.WithCancel(context.Background())
	sinkDone := make(chan error, 1)
	go func() { sinkDone <- p.sink.Run(sinkCtx) }()
	baseline := runtime.NumGoroutine()

	for round := range 4 {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- p.mgr.Run(ctx, p.sink, p.applier) }()
		waitFor(t, "Run to start", p.mgr.Running)
		if err := p.mgr.Run(ctx, p.sink, p.applier); !errors.Is(err, ErrRunning) {
			t.Fatalf("a second concurrent Run returned %v, want ErrRunning", err)
		}
		if round == 0 {
			handshake(t, p, engines...)
		}
		// Traffic while running, then while stopped: the next Run must replay it.
		traffic{seed: uint64(40 + round), requests: 10, inFlight: 2}.run(t, first, second, viaFile)
		waitConverged(t, p.applier, engines...)
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("round %d: Run returned %v", round, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("round %d: Run did not return after cancel", round)
		}
		if p.mgr.Running() {
			t.Fatal("Running() after Run returned")
		}
		traffic{seed: uint64(50 + round), requests: 6, inFlight: 2}.run(t, first, second, viaFile)
	}
	// One more Run picks up what the last round published while stopped.
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.mgr.Run(ctx, p.sink, p.applier) }()
	waitConverged(t, p.applier, engines...)
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > baseline {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines after the runs, %d before:\n%s", runtime.NumGoroutine(), baseline, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond)
	}
	stopSink()
	if err := <-sinkDone; err != nil {
		t.Fatal(err)
	}
	closed := make(chan error, 1)
	go func() { closed <- p.mgr.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Manager.Close hangs: a ZMQ socket was left open")
	}
	if err := p.mgr.Run(context.Background(), p.sink, p.applier); !errors.Is(err, ErrClosed) {
		t.Errorf("Run after Close = %v, want ErrClosed", err)
	}
	if got := p.counter("kvindex_ingest_resets_total", nil); got != 0 {
		t.Errorf("resets = %v, want 0: every stop was covered by replay", got)
	}
	assertIndexEqualsTruth(t, p.index, engines...)
}

// An engine whose live batches never arrive (every one withheld) is still indexed
// exactly, through the replays an idle stream asks for.
func TestIdleStreamIsCaughtUpByReplay(t *testing.T) {
	cfg := testManagerConfig()
	cfg.IdleReplayInterval = 20 * time.Millisecond
	p := startPipeline(t, cfg)
	ecfg := engineConfig()
	ecfg.Faults.DropEveryNBatches = 1
	silent := fakeenginetest.Start(t, ecfg)
	if err := p.mgr.AddWorker(connectSpec("silent", silent)); err != nil {
		t.Fatal(err)
	}
	traffic{seed: 61, requests: 30, inFlight: 3}.run(t, silent)
	engines := []followed{{"silent", silent}}
	waitConverged(t, p.applier, engines...)
	p.stopRun()
	if got := p.counter("kvindex_ingest_batches_total", map[string]string{"worker": "silent", "result": "applied"}); got == 0 {
		t.Fatal("nothing applied")
	}
	if got := p.counter("kvindex_ingest_replayed_batches_total", map[string]string{"worker": "silent", "reason": "catch_up"}); got != p.counter("kvindex_ingest_batches_total", map[string]string{"worker": "silent", "result": "applied"}) {
		t.Errorf("replayed batches = %v, want every applied batch", got)
	}
	assertIndexEqualsTruth(t, p.index, engines...)
}

func writeWorkersFile(t *testing.T, path string, specs ...workerspec.Spec) {
	t.Helper()
	var b []byte
	b = append(b, "workers:\n"...)
	for _, s := range specs {
		b = append(b, "  - id: "+s.ID+"\n    model: "+s.Model+"\n    endpoint: "+s.Endpoint+"\n    replay: "+s.Replay+"\n"...)
		if s.Topic != "" {
			b = append(b, "    topic: \""+s.Topic+"\"\n"...)
		}
	}
	// Write then rename, as config management does, so a reload never sees half a file.
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// Adding a worker to the workers file subscribes to it; removing it stops the
// subscription and drops its blocks.
func TestWorkersFileReloadStartsAndStopsSubscriptions(t *testing.T) {
	a := fakeenginetest.Start(t, engineConfig())
	b := fakeenginetest.Start(t, engineConfig())
	file := filepath.Join(t.TempDir(), "workers.yaml")
	writeWorkersFile(t, file, connectSpec("a", a))
	cfg := testManagerConfig()
	cfg.WorkersFile = file
	p := startPipeline(t, cfg)

	handshake(t, p, followed{"a", a})
	traffic{seed: 71, requests: 10, inFlight: 2}.run(t, a)
	waitConverged(t, p.applier, followed{"a", a})

	writeWorkersFile(t, file, connectSpec("a", a), connectSpec("b", b))
	waitFor(t, "worker b registered", func() bool { return hasWorker(p.mgr, "b") })
	handshake(t, p, followed{"b", b})
	traffic{seed: 72, requests: 10, inFlight: 2}.run(t, a, b)
	waitConverged(t, p.applier, followed{"a", a}, followed{"b", b})

	writeWorkersFile(t, file, connectSpec("b", b))
	waitFor(t, "worker a unregistered", func() bool { return !hasWorker(p.mgr, "a") })
	waitFor(t, "worker a's blocks and cursor dropped", func() bool {
		_, ok := p.applier.Cursor(Stream{Worker: "a"})
		return !ok
	})
	traffic{seed: 73, requests: 10, inFlight: 2}.run(t, a, b)
	waitConverged(t, p.applier, followed{"b", b})
	if err := p.sink.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, ok := p.applier.Cursor(Stream{Worker: "a"}); ok {
		t.Error("worker a's batches are still applied after its removal")
	}
	p.stopRun()
	assertIndexEqualsTruth(t, p.index, followed{"b", b})
}

func hasWorker(m *Manager, id string) bool {
	for _, w := range m.Workers() {
		if w.Spec.ID == id {
			return true
		}
	}
	return false
}

// A worker's streams restart when its spec changes (a registry update, kube
// discovery replacing a spec, /register of a dp rank). What the old streams
// handed to the sink may not be applied yet; the new streams must continue
// from where the old ones stood, not from the index's lagging cursor. Here
// the old stream's gap reset (a new epoch) still waits in the sink's queue
// when the spec changes: the stream must go on in that epoch, or the index
// drops every later batch of the worker.
func TestSpecChangeWithAResetInFlightKeepsFollowingTheEngine(t *testing.T) {
	e := newHandEngine(t)
	p, gate := startGatedPipeline(t, testManagerConfig())
	const w = "w"
	s := Stream{Worker: w}
	spec := e.spec(w)
	batch := map[uint64][]byte{}
	for seq := uint64(0); seq <= 8; seq++ {
		batch[seq] = oneBlock(t, float64(1000+seq), 100+seq)
	}

	e.setMute(true) // the replay socket hangs: gaps reset the worker
	if err := p.mgr.AddWorker(spec); err != nil {
		t.Fatal(err)
	}
	e.publishUntil(t, "seq 0 applied", 0, batch[0], func() bool { _, ok := p.applier.Cursor(s); return ok })
	e.publish(1, batch[1])
	e.publish(2, batch[2])
	waitFor(t, "seq 2 applied", func() bool { c, _ := p.applier.Cursor(s); return c.Seq == 2 })

	// 3 and 4 are lost; no replay: seq 5 resets the worker in epoch 1, and
	// that batch waits in the sink's queue.
	gate.close()
	e.publish(5, batch[5])
	if b := gate.next(t); !b.Reset || b.Seq != 5 || b.Epoch != 1 {
		t.Fatalf("batch held at the applier: seq %d epoch %d reset %v, want the gap's reset at seq 5, epoch 1", b.Seq, b.Epoch, b.Reset)
	}
	e.setBuffer(map[uint64][]byte{0: batch[0], 1: batch[1], 2: batch[2], 3: batch[3], 4: batch[4], 5: batch[5]})
	e.setMute(false)
	catchUps := func() float64 {
		return p.counter("kvindex_ingest_replays_total", map[string]string{"worker": w, "reason": "catch_up"})
	}
	before := catchUps()
	changed := spec
	changed.Labels = map[string]string{"zone": "b"}
	if err := p.mgr.AddWorker(changed); err != nil {
		t.Fatal(err)
	}
	// The new stream has taken its position and caught up before the reset applies.
	waitFor(t, "the new stream's catch-up", func() bool { return catchUps() > before })
	gate.open()

	// The engine goes on; the new stream may miss live batches while it
	// subscribes, which the replay buffer has.
	e.setBuffer(batch)
	e.publishUntil(t, "seq 8 handed off", 8, batch[8], func() bool { seq, ok := p.handedOff(w); return ok && seq == 8 })
	p.flush()
	if c, _ := p.applier.Cursor(s); c.Seq != 8 || c.Epoch != 1 {
		t.Errorf("index cursor = seq %d epoch %d, want seq 8 epoch 1: the index dropped the batches after the spec change", c.Seq, c.Epoch)
	}
	if missing := len(hashRange(105, 108)) - len(holding(p.index, s, hashRange(105, 108)...)); missing != 0 {
		t.Errorf("%d of the blocks of seqs 5..8 are missing from the index", missing)
	}
}

// The old stream's first batches are still queued when the spec changes: the
// index has no cursor for the stream yet. A batch lost meanwhile (here a
// BlockRemoved) must still be seen missing: without a replay endpoint the
// worker's blocks are dropped, never kept stale.
func TestSpecChangeBeforeTheFirstBatchIsAppliedStillSeesAGap(t *testing.T) {
	e := newHandEngine(t)
	p, gate := startGatedPipeline(t, testManagerConfig())
	const w = "w"
	s := Stream{Worker: w}
	spec := e.spec(w)
	spec.Replay = ""
	gate.close()
	if err := p.mgr.AddWorker(spec); err != nil {
		t.Fatal(err)
	}
	e.publishUntil(t, "seq 0 handed off", 0, oneBlock(t, 1000, 100), func() bool { _, ok := p.handedOff(w); return ok })
	changed := spec
	changed.Labels = map[string]string{"zone": "b"}
	if err := p.mgr.AddWorker(changed); err != nil {
		t.Fatal(err)
	}
	// Seq 1, which removed the block of seq 0, is lost; seq 2 comes.
	e.publishUntil(t, "seq 2 handed off", 2, oneBlock(t, 1002, 102), func() bool { seq, ok := p.handedOff(w); return ok && seq == 2 })
	gate.open()
	p.flush()
	if got := p.counter("kvindex_ingest_resets_total", map[string]string{"worker": w, "reason": "gap"}); got != 1 {
		t.Errorf("gap resets = %v, want 1 (seq 1 never came)", got)
	}
	if c, _ := p.applier.Cursor(s); c.Seq != 2 || c.Epoch != 1 {
		t.Errorf("index cursor = seq %d epoch %d, want seq 2 in epoch 1", c.Seq, c.Epoch)
	}
	if held := holding(p.index, s, 100, 102); !slices.Equal(held, []uint64{102}) {
		t.Errorf("the index holds blocks %v, want only 102: the block seq 1 removed must not survive", held)
	}
}
