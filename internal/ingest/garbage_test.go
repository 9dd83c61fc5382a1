package ingest

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvindex/kvindex/bench/fakeengine"
	"github.com/kvindex/kvindex/internal/workerspec"
)

// rawPub is a bare libzmq PUB socket for sending hand-made frames.
type rawPub struct {
	t    *testing.T
	sock *zmq.Socket
}

func newRawPub(t *testing.T, zctx *zmq.Context) *rawPub {
	t.Helper()
	sock, err := zctx.NewSocket(zmq.PUB)
	if err != nil {
		t.Fatal(err)
	}
	if err := sock.SetLinger(0); err != nil {
		t.Fatal(err)
	}
	if err := sock.SetSndhwm(0); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sock.Close() })
	return &rawPub{t: t, sock: sock}
}

func (p *rawPub) send(parts ...[]byte) {
	p.t.Helper()
	args := make([]any, len(parts))
	for i, part := range parts {
		args[i] = part
	}
	if _, err := p.sock.SendMessage(args...); err != nil {
		p.t.Fatal(err)
	}
}

func seqPart(seq uint64) []byte { return binary.BigEndian.AppendUint64(nil, seq) }

func newTestZMQContext(t *testing.T) *zmq.Context {
	t.Helper()
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { zctx.Term() })
	return zctx
}

// validPayload is a real one-event batch, as an engine encodes it.
func validPayload(t *testing.T) []byte {
	t.Helper()
	payload, err := fakeengine.EncodeBatch(fakeengine.Batch{TS: 1, Events: []fakeengine.Event{{
		Kind: fakeengine.BlockStored, BlockHashes: []uint64{1, 2}, TokenIDs: []uint32{1, 2, 3, 4, 5, 6, 7, 8},
		BlockSize: 4, Medium: fakeengine.MediumGPU,
	}}}, fakeengine.WireMap)
	if err != nil {
		t.Fatal(err)
	}
	return payload
}

func TestGarbageIsCountedLoggedOnceAndChangesNothing(t *testing.T) {
	cfg := testManagerConfig()
	cfg.ZMQBind = "tcp://127.0.0.1:*"
	cfg.BadInputLogInterval = time.Hour
	p := startPipeline(t, cfg)

	engine := bindEngine(t, p, nil)
	worker := topicWorkerID(t, engine)
	if err := p.mgr.AddWorker(workerspec.Spec{ID: worker, Model: engine.Config().Model, Replay: engine.ReplayEndpoints()[0]}); err != nil {
		t.Fatal(err)
	}
	healthy := []followed{{worker, engine}}
	handshake(t, p, healthy...)
	traffic{seed: 31, requests: 30, inFlight: 3}.run(t, engine)
	waitConverged(t, p.applier, healthy...)
	digest := p.index.Digest()

	pub := newRawPub(t, newTestZMQContext(t))
	if err := pub.sock.Connect(p.mgr.BindEndpoint()); err != nil {
		t.Fatal(err)
	}
	// The subscription reaches a connecting PUB some time after it connects:
	// probe (with batches of an impossible dp rank, counted apart) until one is
	// counted; everything sent after it arrives.
	probe, err := fakeengine.EncodeBatch(fakeengine.Batch{TS: 1, DPRank: 5000}, fakeengine.WireArray)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the garbage publisher's subscription", func() bool {
		pub.send([]byte("kv@prober@m"), seqPart(0), probe)
		return p.counter("kvindex_ingest_decode_errors_total", map[string]string{"source": "bind", "reason": "bad_rank"}) > 0
	})
	base := map[string]float64{}

	rng := rand.New(rand.NewPCG(3, 4))
	random := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.UintN(256))
		}
		return b
	}
	ghost := []byte("kv@ghost@fake/llama-3.1-8b")
	valid := validPayload(t)
	const rounds = 25
	for i := range rounds {
		pub.send(random(1 + rng.IntN(64)))                         // one part: bad frame
		pub.send(ghost, random(7), valid)                          // 7-byte seq: bad frame
		pub.send(ghost, seqPart(uint64(i)), valid, []byte("more")) // four parts: bad frame
		pub.send(ghost, seqPart(uint64(i)), random(1+rng.IntN(512)))
		pub.send(ghost, seqPart(uint64(i)), valid[:1+rng.IntN(len(valid)-1)]) // truncated
		pub.send([]byte("kv@"), seqPart(uint64(i)), valid)                    // topic names no worker
	}
	huge := bytes.Repeat([]byte{0x90}, 64<<20)
	pub.send(ghost, seqPart(99), huge)
	huge = nil
	want := map[string]float64{
		"bad_frame": base["bad_frame"] + 3*rounds,
		"bad_topic": base["bad_topic"] + rounds,
		"oversize":  base["oversize"] + 1,
	}
	waitFor(t, "every garbage frame counted", func() bool {
		for reason, n := range want {
			if p.counter("kvindex_ingest_decode_errors_total", map[string]string{"source": "bind", "reason": reason}) < n {
				return false
			}
		}
		// Random bytes may happen to decode (a msgpack positive fixint, say) and
		// then fail as a batch; either way they are malformed.
		return p.counter("kvindex_ingest_decode_errors_total", map[string]string{"source": "bind", "reason": "malformed"}) >= base["malformed"]+2*rounds
	})
	for reason, n := range want {
		if got := p.counter("kvindex_ingest_decode_errors_total", map[string]string{"source": "bind", "reason": reason}); got != n {
			t.Errorf("decode errors %s = %v, want %v", reason, got, n)
		}
	}

	if p.index.Digest() != digest {
		t.Error("garbage changed the index")
	}
	for _, w := range p.mgr.Workers() {
		if w.Spec.ID == "ghost" || w.Spec.ID == "prober" {
			t.Error("garbage registered a worker")
		}
	}
	logs := p.logs.String()
	for _, msg := range []string{"dropping malformed frame", "dropping frame whose topic names no worker", "reason=oversize", "reason=malformed"} {
		if n := strings.Count(logs, msg); n != 1 {
			t.Errorf("log lines with %q = %d, want 1 (rate-limited)", msg, n)
		}
	}

	// Still healthy: the real engine's new traffic is indexed exactly.
	traffic{seed: 32, requests: 20, inFlight: 3}.run(t, engine)
	waitConverged(t, p.applier, healthy...)
	p.stopRun()
	assertIndexEqualsTruth(t, p.index, healthy...)
}

// A frame beyond libzmq's hard limit (4x the frame limit) is refused by libzmq
// itself, which drops that connection; the publisher reconnects and its later
// frames are received.
func TestFrameBeyondHardLimitOnlyCostsItsConnection(t *testing.T) {
	cfg := testManagerConfig()
	cfg.ZMQBind = "tcp://127.0.0.1:*"
	cfg.MaxFrameBytes = 1024
	p := startPipeline(t, cfg)
	pub := newRawPub(t, newTestZMQContext(t))
	if err := pub.sock.Connect(p.mgr.BindEndpoint()); err != nil {
		t.Fatal(err)
	}
	badTopic := func() float64 {
		return p.counter("kvindex_ingest_decode_errors_total", map[string]string{"source": "bind", "reason": "bad_topic"})
	}
	waitFor(t, "subscription", func() bool {
		pub.send([]byte("x"), seqPart(0), []byte{0x90})
		return badTopic() > 0
	})
	pub.send([]byte("kv@ghost@m"), seqPart(1), make([]byte, 2<<20))
	before := badTopic()
	waitFor(t, "frames after the oversized one", func() bool {
		pub.send([]byte("x"), seqPart(2), []byte{0x90})
		return badTopic() > before
	})
	if got := p.counter("kvindex_ingest_decode_errors_total", map[string]string{"reason": "oversize"}); got != 0 {
		t.Errorf("oversize = %v: libzmq should have refused the frame before us", got)
	}
}

// One live frame with a seq no engine sends next, the replay end marker's
// 2^64-1 or one far beyond the cursor (a publisher bug, a stray sender on the
// socket), is bad input: counted and dropped. The stream must not reset to it,
// or every later batch of the engine would look old and be dropped.
func TestImplausibleSeqIsDroppedAndTheStreamGoesOn(t *testing.T) {
	for _, c := range []struct {
		name    string
		seq     uint64
		counter string
		labels  map[string]string
	}{
		{"end marker's seq", ^uint64(0), "kvindex_ingest_decode_errors_total", map[string]string{"source": "zmq", "reason": "bad_frame"}},
		{"2^33 past the cursor", 3 + 1<<33, "kvindex_ingest_batches_total", map[string]string{"worker": "w", "result": "bad_seq"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newHandEngine(t)
			p := startPipeline(t, testManagerConfig())
			s := Stream{Worker: "w"}
			batch := map[uint64][]byte{}
			for seq := uint64(0); seq <= 6; seq++ {
				batch[seq] = oneBlock(t, float64(1000+seq), 100+seq)
			}
			e.setBuffer(map[uint64][]byte{0: batch[0], 1: batch[1], 2: batch[2], 3: batch[3]})
			if err := p.mgr.AddWorker(e.spec("w")); err != nil {
				t.Fatal(err)
			}
			e.publishUntil(t, "seq 3 applied", 3, batch[3], func() bool { cur, _ := p.applier.Cursor(s); return cur.Seq == 3 })
			e.publish(c.seq, oneBlock(t, 1003.5, 999))
			e.setBuffer(batch)
			for seq := uint64(4); seq <= 6; seq++ {
				e.publish(seq, batch[seq])
			}
			waitFor(t, "seq 6 handed off", func() bool { seq, ok := p.handedOff("w"); return ok && seq == 6 })
			p.flush()
			if got := p.counter(c.counter, c.labels); got != 1 {
				t.Errorf("%s%v = %v, want 1 (the bogus frame)", c.counter, c.labels, got)
			}
			if got := p.counter("kvindex_ingest_resets_total", nil); got != 0 {
				t.Errorf("resets = %v, want 0: one bogus frame must not clear the worker", got)
			}
			if cur, _ := p.applier.Cursor(s); cur != (Cursor{Seq: 6}) {
				t.Errorf("index cursor = %+v, want seq 6 in epoch 0", cur)
			}
			if held := holding(p.index, s, append(hashRange(100, 106), 999)...); !slices.Equal(held, hashRange(100, 106)) {
				t.Errorf("the index holds blocks %v, want 100..106 (the engine's) and not 999 (the bogus frame's)", held)
			}
		})
	}
}
