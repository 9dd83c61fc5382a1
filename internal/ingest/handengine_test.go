package ingest

import (
	"context"
	"encoding/binary"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvindex/kvindex/bench/fakeengine"
	"github.com/kvindex/kvindex/internal/radix"
	"github.com/kvindex/kvindex/internal/workerspec"
)

// handEngine is an engine the test drives batch by batch, on real libzmq: a
// PUB socket for live batches (publish) and a ROUTER replay socket that answers
// a request the way vLLM's legacy layout does (["", seq, payload] per buffered
// batch from the asked seq on, then the end marker) from a buffer the test
// sets. While mute, it ignores requests: a replay socket that hangs.
type handEngine struct {
	pub   *rawPub
	pubEP string
	repEP string

	mu     sync.Mutex
	mute   bool              // guarded by mu
	buffer map[uint64][]byte // guarded by mu
}

func newHandEngine(t *testing.T) *handEngine {
	t.Helper()
	zctx := newTestZMQContext(t)
	e := &handEngine{pub: newRawPub(t, zctx), buffer: map[uint64][]byte{}}
	if err := e.pub.sock.Bind("tcp://127.0.0.1:*"); err != nil {
		t.Fatal(err)
	}
	e.pubEP, _ = e.pub.sock.GetLastEndpoint()
	router, err := zctx.NewSocket(zmq.ROUTER)
	if err != nil {
		t.Fatal(err)
	}
	if err := router.SetLinger(0); err != nil {
		t.Fatal(err)
	}
	if err := router.Bind("tcp://127.0.0.1:*"); err != nil {
		t.Fatal(err)
	}
	e.repEP, _ = router.GetLastEndpoint()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer router.Close()
		e.serve(ctx, router)
	}()
	t.Cleanup(func() { cancel(); <-done })
	return e
}

// serve answers replay requests until ctx ends; it owns router.
func (e *handEngine) serve(ctx context.Context, router *zmq.Socket) {
	poller := zmq.NewPoller()
	poller.Add(router, zmq.POLLIN)
	for ctx.Err() == nil {
		polled, err := poller.Poll(10 * time.Millisecond)
		if err != nil || len(polled) == 0 {
			continue
		}
		parts, err := router.RecvMessageBytes(zmq.DONTWAIT)
		if err != nil || len(parts) != 3 || len(parts[1]) != 0 || len(parts[2]) != 8 {
			continue
		}
		from := binary.BigEndian.Uint64(parts[2])
		e.mu.Lock()
		mute, buffer := e.mute, maps.Clone(e.buffer)
		e.mu.Unlock()
		if mute {
			continue
		}
		seqs := slices.Sorted(maps.Keys(buffer))
		for _, seq := range seqs {
			if seq >= from {
				router.SendMessage(parts[0], []byte{}, seqPart(seq), buffer[seq])
			}
		}
		router.SendMessage(parts[0], []byte{}, seqPart(^uint64(0)), []byte{})
	}
}

func (e *handEngine) setMute(mute bool) {
	e.mu.Lock()
	e.mute = mute
	e.mu.Unlock()
}

// setBuffer makes the replay buffer hold exactly these batches.
func (e *handEngine) setBuffer(b map[uint64][]byte) {
	e.mu.Lock()
	e.buffer = maps.Clone(b)
	e.mu.Unlock()
}

func (e *handEngine) publish(seq uint64, payload []byte) { e.pub.send([]byte{}, seqPart(seq), payload) }

// publishUntil publishes the batch again and again until cond holds: a SUB
// socket misses what is published before its subscription reaches the PUB.
func (e *handEngine) publishUntil(t *testing.T, what string, seq uint64, payload []byte, cond func() bool) {
	t.Helper()
	waitFor(t, what, func() bool {
		e.publish(seq, payload)
		time.Sleep(20 * time.Millisecond)
		return cond()
	})
}

// spec is the engine as worker id (model "m", block size 4).
func (e *handEngine) spec(id string) workerspec.Spec {
	return workerspec.Spec{ID: id, Model: "m", BlockSize: 4, Endpoint: e.pubEP, Replay: e.repEP}
}

// oneBlock is a batch stamped ts storing one root block of 4 tokens whose
// engine hash is hash.
func oneBlock(t *testing.T, ts float64, hash uint64) []byte {
	t.Helper()
	tok := uint32(hash)
	payload, err := fakeengine.EncodeBatch(fakeengine.Batch{TS: ts, Events: []fakeengine.Event{{
		Kind: fakeengine.BlockStored, BlockHashes: []uint64{hash}, TokenIDs: []uint32{tok, tok + 1, tok + 2, tok + 3},
		BlockSize: 4, Medium: fakeengine.MediumGPU,
	}}}, fakeengine.WireMap)
	if err != nil {
		t.Fatal(err)
	}
	return payload
}

// holding lists which of hashes the index holds on GPU for s. It removes them
// to find out: call it once, at the end.
func holding(ix *radix.Index, s Stream, hashes ...uint64) []uint64 {
	var held []uint64
	for _, h := range hashes {
		if res, _ := ix.Removed(s, []uint64{h}, radix.TierGPU); res.Removed == 1 {
			held = append(held, h)
		}
	}
	return held
}

// hashRange is from, from+1, ..., to.
func hashRange(from, to uint64) []uint64 {
	var out []uint64
	for h := from; h <= to; h++ {
		out = append(out, h)
	}
	return out
}

// applyGate is the real Applier behind a gate: while the gate is closed,
// Apply waits (the batches stay in the LocalSink's queue, as behind a busy
// apply loop or a Raft entry not yet committed) and reports each batch it
// holds on arrived.
type applyGate struct {
	*Applier
	arrived chan StreamBatch

	mu     sync.Mutex
	closed chan struct{} // guarded by mu; nil while open
}

// startGatedPipeline is startPipeline whose sink applies through an applyGate,
// open at first; the gate opens before the pipeline stops.
func startGatedPipeline(t *testing.T, cfg ManagerConfig) (*pipeline, *applyGate) {
	t.Helper()
	g := &applyGate{arrived: make(chan StreamBatch, 64)}
	p := newPipelineThrough(t, cfg, func(a *Applier) BatchApplier { g.Applier = a; return g })
	p.start()
	t.Cleanup(p.stop)
	t.Cleanup(g.open) // runs first
	return p, g
}

func (g *applyGate) Apply(b StreamBatch) ApplyResult {
	g.mu.Lock()
	closed := g.closed
	g.mu.Unlock()
	if closed != nil {
		select {
		case g.arrived <- b:
		default:
		}
		<-closed
	}
	return g.Applier.Apply(b)
}

func (g *applyGate) close() {
	g.mu.Lock()
	if g.closed == nil {
		g.closed = make(chan struct{})
	}
	g.mu.Unlock()
}

func (g *applyGate) open() {
	g.mu.Lock()
	if g.closed != nil {
		close(g.closed)
		g.closed = nil
	}
	g.mu.Unlock()
}

// next is the next batch that reached the closed gate.
func (g *applyGate) next(t *testing.T) StreamBatch {
	t.Helper()
	select {
	case b := <-g.arrived:
		return b
	case <-time.After(30 * time.Second):
		t.Fatal("no batch reached the applier within 30s")
	}
	return StreamBatch{}
}
