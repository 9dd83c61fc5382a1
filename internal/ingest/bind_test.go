package ingest

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvindex/kvindex/bench/fakeengine/fakeenginetest"
	"github.com/kvindex/kvindex/internal/ingest/wire"
)

// lossyForwarder is a Forwarder that loses every nth frame and queues the
// others for a FrameInput, as a follower's queue and stream to the leader do.
// It also sends a copy of every 5th frame again 10 frames later, as a frame
// that reached the leader by two ways (its own socket and a follower's queue).
type lossyForwarder struct {
	every  int
	frames chan wire.Frame

	mu      sync.Mutex
	n, lost int
	late    []wire.Frame // copies to send again, with the frame count to send them at
	lateAt  []int
	copies  int
}

func (f *lossyForwarder) Forward(fr wire.Frame) {
	f.mu.Lock()
	f.n++
	drop := f.n%f.every == 0
	if drop {
		f.lost++
	}
	var again []wire.Frame
	for len(f.lateAt) > 0 && f.lateAt[0] <= f.n {
		again = append(again, f.late[0])
		f.late, f.lateAt = f.late[1:], f.lateAt[1:]
		f.copies++
	}
	if !drop && f.n%5 == 0 {
		f.late, f.lateAt = append(f.late, fr), append(f.lateAt, f.n+10)
	}
	f.mu.Unlock()
	if !drop {
		f.frames <- fr
	}
	for _, c := range again {
		f.frames <- c
	}
}

// TestBindFramesForwardedToTheRunningManager is bind mode in a cluster, minus
// raft: a "follower" Manager binds, runs no Run and forwards what engines send
// it, losing every 7th frame on the way, to the "leader" Manager's FrameInput.
// The leader discovers the worker from its llm-d topic with the replay endpoint
// of BindReplayPattern and replays every lost frame (at the gap it makes, or
// by the idle replay when it was the last): its index equals the engine's
// cache with no reset (a late copy is a duplicate, not an engine restart), and
// the follower counted every frame as forwarded.
func TestBindFramesForwardedToTheRunningManager(t *testing.T) {
	// The engine's pod is "127.0.0.1": its replay port goes into the pattern,
	// as a Kubernetes deployment's fixed replay port does.
	engineCfg := engineConfig()
	engineCfg.KVEventsTopic = "kv@127.0.0.1@" + engineCfg.Model

	fcfg := testManagerConfig()
	fcfg.ZMQBind = "tcp://127.0.0.1:*"
	follower := newPipeline(t, fcfg)
	fwd := &lossyForwarder{every: 7, frames: make(chan wire.Frame, 4096)}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	bindErr := make(chan error, 1)
	defer func() {
		cancel()
		wg.Wait()
		if err := <-bindErr; err != nil {
			t.Errorf("ServeBind: %v", err)
		}
		if err := follower.mgr.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}()
	wg.Add(1)
	go func() {
		defer wg.Done()
		bindErr <- follower.mgr.ServeBind(ctx, fwd)
	}()
	waitFor(t, "the bind socket", func() bool { return follower.mgr.BindEndpoint() != "" })
	if err := follower.mgr.ServeBind(ctx, fwd); !errors.Is(err, ErrRunning) {
		t.Errorf("a second ServeBind = %v, want ErrRunning", err)
	}
	if err := follower.mgr.Close(); !errors.Is(err, ErrRunning) {
		t.Errorf("Close while ServeBind runs = %v, want ErrRunning", err)
	}
	engineCfg.KVEventsEndpoint = follower.mgr.BindEndpoint()
	engine := fakeenginetest.Start(t, engineCfg)
	_, port, err := net.SplitHostPort(strings.TrimPrefix(engine.ReplayEndpoints()[0], "tcp://"))
	if err != nil {
		t.Fatal(err)
	}

	lcfg := testManagerConfig()
	lcfg.BindReplayPattern = "tcp://{pod}:" + port
	lcfg.ReplayAllow = []string{"tcp://127.0.0.1:*"}
	// A lost last frame shows no gap: the idle replay finds it, as in production.
	lcfg.IdleReplayInterval = 200 * time.Millisecond
	leader := startPipeline(t, lcfg)
	wg.Add(1)
	go func() {
		defer wg.Done()
		in, err := leader.mgr.NewFrameInput(SourceForwarded)
		if err != nil {
			t.Errorf("NewFrameInput on the running leader: %v", err)
			return
		}
		for {
			select {
			case fr := <-fwd.frames:
				if err := in.Deliver(fr); err != nil {
					t.Errorf("Deliver: %v", err)
					return
				}
			case <-ctx.Done():
				return
			}
		}
	}()

	worker := followed{"127.0.0.1", engine}
	handshake(t, leader, worker)
	traffic{seed: 31, requests: 120, inFlight: 4}.run(t, engine)
	if err := engine.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	waitConverged(t, leader.applier, worker)
	assertIndexEqualsTruth(t, leader.index, worker)

	var spec *WorkerStatus
	for _, ws := range leader.mgr.Workers() {
		if ws.Spec.ID == worker.worker {
			spec = &ws
		}
	}
	if want := "tcp://127.0.0.1:" + port; spec == nil || spec.Source != SourceDiscover || spec.Spec.Replay != want {
		t.Fatalf("leader's worker %s = %+v, want discovered with replay %s", worker.worker, spec, want)
	}
	fwd.mu.Lock()
	lost := fwd.lost
	fwd.mu.Unlock()
	w := map[string]string{"worker": worker.worker}
	gaps := leader.counter("kvindex_ingest_gaps_total", w)
	if lost < 10 || gaps == 0 {
		// A loss is a gap unless an idle replay found it first.
		t.Errorf("the follower lost %d frames, the leader saw %v gaps; want at least 10 losses and gaps", lost, gaps)
	}
	if got := leader.counter("kvindex_ingest_replays_total", map[string]string{"worker": worker.worker, "reason": "gap", "result": "ok"}); got != gaps {
		t.Errorf("successful gap replays = %v, want one per gap (%v)", got, gaps)
	}
	if got := leader.counter("kvindex_ingest_resets_total", w); got != 0 {
		t.Errorf("resets = %v, want 0: every lost frame was replayable, and a late copy is no engine restart", got)
	}
	if got := leader.counter("kvindex_ingest_batches_total", map[string]string{"worker": worker.worker, "result": "duplicate"}); got < float64(fwd.copies) {
		t.Errorf("duplicates = %v, want at least the %d late copies", got, fwd.copies)
	}
	if got := follower.counter("kvindex_ingest_bind_frames_total", map[string]string{"route": "ingested"}); got != 0 {
		t.Errorf("the follower, which runs no Run, ingested %v frames itself", got)
	}
	if got := follower.counter("kvindex_ingest_bind_frames_total", map[string]string{"route": "forwarded"}); got != float64(fwd.n) {
		t.Errorf("forwarded frames counted %v, the forwarder saw %d", got, fwd.n)
	}
	if fwd.copies < 10 {
		t.Errorf("only %d late copies sent: the test proves little", fwd.copies)
	}
	t.Logf("%d frames forwarded, %d lost on the way, %v gaps replayed, %d late copies dropped", fwd.n, lost, gaps, fwd.copies)
}

// TestBindSocketWithoutRunOrForwarderDrops: a Manager that binds but neither
// runs nor forwards counts what it receives as dropped; NewFrameInput refuses.
func TestBindSocketWithoutRunOrForwarderDrops(t *testing.T) {
	cfg := testManagerConfig()
	cfg.ZMQBind = "tcp://127.0.0.1:*"
	p := newPipeline(t, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.mgr.ServeBind(ctx, nil) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("ServeBind: %v", err)
		}
		if err := p.mgr.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}()
	waitFor(t, "the bind socket", func() bool { return p.mgr.BindEndpoint() != "" })
	if _, err := p.mgr.NewFrameInput(SourceForwarded); !errors.Is(err, ErrNotRunning) {
		t.Errorf("NewFrameInput without Run = %v, want ErrNotRunning", err)
	}
	c := engineConfig()
	c.KVEventsEndpoint = p.mgr.BindEndpoint()
	e := fakeenginetest.Start(t, c)
	deadline := time.Now().Add(20 * time.Second)
	for p.counter("kvindex_ingest_bind_frames_total", map[string]string{"route": "dropped"}) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no frame counted as dropped")
		}
		if err := e.ResetPrefixCache(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n := p.index.Stats().Residencies; n != 0 {
		t.Errorf("the index holds %d blocks; nothing runs to apply them", n)
	}
}
