package raftstore

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/workerspec"
)

// A worker unregistered and registered again while a batch of its first
// registration is still unproposed: Submit returns once the batch is in the
// entry being filled, and admin entries go to raft at once, so that batch
// commits after both.

// TestBatchSubmittedBeforeUnregisterCommittingAfterReregisterIsDropped holds a
// submitted batch in the entry being filled (a long MaxBatchWait) while the
// worker is unregistered and registered again, then proposes it: on every
// replica it must be dropped, bring back no block, and leave the stream's
// cursor fenced, so that the new registration's stream, started afresh above
// it, gets in.
func TestBatchSubmittedBeforeUnregisterCommittingAfterReregisterIsDropped(t *testing.T) {
	c := makeCluster(t, 3, func(_ string, cfg *Config) { cfg.MaxBatchWait = time.Minute })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	leader := c.leader(20 * time.Second)
	w, s := workerspec.Spec{ID: "w", Model: "m"}, ws("w", 0)
	if _, err := leader.RegisterWorker(ctx, w); err != nil {
		t.Fatal(err)
	}
	if err := leader.Submit(ctx, stored(s, 3, 10, false, 1)); err != nil {
		t.Fatal(err)
	}
	if err := leader.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if err := leader.Submit(ctx, stored(s, 3, 11, false, 2)); err != nil { // held: not proposed yet
		t.Fatal(err)
	}
	if _, err := leader.UnregisterWorker(ctx, w.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := leader.RegisterWorker(ctx, w); err != nil {
		t.Fatal(err)
	}
	if err := leader.Flush(ctx); err != nil { // proposes the held batch, after both
		t.Fatal(err)
	}
	c.waitConverged(30 * time.Second)
	for _, tn := range c.nodes {
		n := tn.get()
		if held := n.Index().HeldBlocks(s); held != 0 {
			t.Errorf("%s: the re-registered worker holds %d blocks of its first registration", tn.id, held)
		}
		if cur, _ := n.Applier().Cursor(s); cur.Fence == 0 || cur.Epoch != 3 || cur.Seq != 10 {
			t.Errorf("%s: cursor %+v, want epoch 3 seq 10 and fenced: the late batch moved it", tn.id, cur)
		}
	}
	// The new registration's stream, as ingest starts it on finding the fence.
	for i := range uint64(3) {
		if err := leader.Submit(ctx, stored(s, 4, i, i == 0, 100+i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := leader.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	c.waitConverged(30 * time.Second)
	for _, tn := range c.nodes {
		if held := tn.get().Index().HeldBlocks(s); held != 3 {
			t.Errorf("%s: the new registration's stream holds %d blocks, want 3", tn.id, held)
		}
	}
}

// TestReregisteredWorkerIsIngestedAgain runs ingest with a fake engine on the
// leader and unregisters and registers its worker again, as the server's
// registry follower does: ingest finds the streams fenced and starts them
// afresh, and the worker's blocks come back into the index.
func TestReregisteredWorkerIsIngestedAgain(t *testing.T) {
	engine := startFakeEngine(t, 1)
	spec := engineSpec("engine-a", engine)
	s := ws(spec.ID, 0)
	c := makeCluster(t, 3, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	mgr := newEngineManager(t, nil)
	defer mgr.Close()
	leader := c.leader(20 * time.Second)
	runCtx, stopRun := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		leader.RunWhileLeader(runCtx, func(lctx context.Context) { mgr.Run(lctx, leader, leader.Applier()) })
	}()
	defer func() { stopRun(); wg.Wait() }()

	generate := func(seed uint64) {
		t.Helper()
		gctx, stop := context.WithTimeout(ctx, 500*time.Millisecond)
		defer stop()
		if _, err := engineTraffic(gctx, engine, seed); err != nil {
			t.Fatal(err)
		}
	}
	register := func() {
		t.Helper()
		if _, err := leader.RegisterWorker(ctx, spec); err != nil {
			t.Fatal(err)
		}
		if err := mgr.AddWorker(spec); err != nil {
			t.Fatal(err)
		}
	}
	held := func() bool { return leader.Index().HeldBlocks(s) > 0 }
	register()
	waitFor(t, 60*time.Second, func() bool { generate(1); return held() })

	if _, err := leader.UnregisterWorker(ctx, spec.ID); err != nil {
		t.Fatal(err)
	}
	mgr.RemoveWorker(spec.ID)
	if cur, ok := leader.Applier().Cursor(s); !ok || cur.Fence == 0 {
		t.Fatalf("cursor after the unregistration %+v, %v; want fenced", cur, ok)
	}
	register()
	waitFor(t, 60*time.Second, func() bool { generate(2); return held() })
	if cur, _ := leader.Applier().Cursor(s); cur.Fence != 0 {
		t.Errorf("cursor %+v still fenced although the stream is applied again", cur)
	}
}
