package ingest

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
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
