package ingest

import (
	"fmt"
	"testing"
	"time"

	"github.com/kvindex/kvindex/bench/fakeengine"
	"github.com/kvindex/kvindex/internal/workerspec"
)

// TestDiscoveryFloodStopsAtTheLimit floods the bind socket with batches of
// new workers: discovery adds no more than MaxDiscoveredWorkers of those the
// allow-list admits, counts each refusal, and a worker already discovered is
// still followed meanwhile.
func TestDiscoveryFloodStopsAtTheLimit(t *testing.T) {
	const limit = 4
	cfg := testManagerConfig()
	cfg.ZMQBind = "tcp://127.0.0.1:*"
	cfg.MaxDiscoveredWorkers = limit
	cfg.DiscoverAllow = []string{"pod-*"}
	p := startPipeline(t, cfg)
	pub := newRawPub(t, newTestZMQContext(t))
	if err := pub.sock.Connect(p.mgr.BindEndpoint()); err != nil {
		t.Fatal(err)
	}
	payload := validPayload(t)
	refused := func(reason string) float64 {
		return p.counter("kvindex_ingest_decode_errors_total", map[string]string{"source": "bind", "reason": reason})
	}
	waitFor(t, "the publisher's subscription", func() bool {
		pub.send([]byte("kv@intruder@m"), seqPart(1), payload)
		return refused("not_allowed") > 0
	})
	const flood = 60
	for i := range flood {
		pub.send([]byte(fmt.Sprintf("kv@pod-%d@m", i)), seqPart(1), payload)
	}
	waitFor(t, "every flooded worker seen", func() bool { return refused("discovery_limit") >= flood-limit })
	discovered := 0
	for _, ws := range p.mgr.Workers() {
		if ws.Source == SourceDiscover {
			discovered++
		}
	}
	if discovered != limit {
		t.Errorf("%d workers discovered from a flood of %d, want the limit %d", discovered, flood, limit)
	}
	if got := refused("discovery_limit"); got != flood-limit {
		t.Errorf("discovery_limit refusals = %v, want %d", got, flood-limit)
	}
	// pod-0 was admitted: its next batch is applied, flood or not.
	next, err := fakeengine.EncodeBatch(fakeengine.Batch{TS: 2, Events: []fakeengine.Event{{
		Kind: fakeengine.BlockStored, BlockHashes: []uint64{3}, ParentHash: 2, HasParent: true, TokenIDs: []uint32{9, 10, 11, 12},
		BlockSize: 4, Medium: fakeengine.MediumGPU,
	}}}, fakeengine.WireMap)
	if err != nil {
		t.Fatal(err)
	}
	pub.send([]byte("kv@pod-0@m"), seqPart(2), next)
	waitFor(t, "pod-0's second batch applied", func() bool {
		c, ok := p.applier.Cursor(Stream{Worker: "pod-0"})
		return ok && c.Seq == 2
	})
}

// TestNATSReplayHeaderMustBeAllowed: a Kv-Replay endpoint that is not tcp://
// or matches no ReplayAllow pattern is ignored and counted; the batch itself is
// applied either way, and an allowed endpoint is not counted.
func TestNATSReplayHeaderMustBeAllowed(t *testing.T) {
	url := startNATS(t)
	cfg := testManagerConfig()
	cfg.Transport = TransportNATS
	cfg.NATSURL = url
	cfg.ReplayAllow = []string{"tcp://10.0.0.*:5558"}
	p := startPipeline(t, cfg)
	send := natsPublisher(t, url)
	notAllowed := func() float64 {
		return p.counter("kvindex_ingest_decode_errors_total", map[string]string{"source": "nats", "reason": "replay_not_allowed"})
	}
	for i, c := range []struct {
		replay  string
		refused bool
	}{
		{"ipc:///tmp/engine.sock", true},
		{"tcp://169.254.169.254:80", true},
		{"tcp://10.0.0.7:5558", false},
	} {
		worker := fmt.Sprintf("pod-%d", i)
		before := notAllowed()
		send(Subject(cfg.NATSSubjectPrefix, worker, 0), validPayload(t), HeaderSeq, "0", HeaderModel, "m", HeaderReplay, c.replay)
		waitFor(t, worker+"'s batch applied", func() bool { _, ok := p.applier.Cursor(Stream{Worker: worker}); return ok })
		if counted := notAllowed() > before; counted != c.refused {
			t.Errorf("Kv-Replay %q: counted as not allowed = %v, want %v", c.replay, counted, c.refused)
		}
	}
}

// TestNATSDiscoveryIsBounded: discovery on NATS obeys the allow-list and the
// limit as the bind socket does: a worker id no DiscoverAllow pattern matches,
// and a new worker once MaxDiscoveredWorkers are followed, are dropped and
// counted; an admitted worker is followed.
func TestNATSDiscoveryIsBounded(t *testing.T) {
	url := startNATS(t)
	cfg := testManagerConfig()
	cfg.Transport = TransportNATS
	cfg.NATSURL = url
	cfg.DiscoverAllow = []string{"pod-*"}
	cfg.MaxDiscoveredWorkers = 1
	p := startPipeline(t, cfg)
	send := natsPublisher(t, url)
	publish := func(worker string) {
		send(Subject(cfg.NATSSubjectPrefix, worker, 0), validPayload(t), HeaderSeq, "0", HeaderModel, "m")
	}
	refused := func(reason string) float64 {
		return p.counter("kvindex_ingest_decode_errors_total", map[string]string{"source": "nats", "reason": reason})
	}
	waitFor(t, "intruder refused as not allowed", func() bool { publish("intruder"); return refused("not_allowed") > 0 })
	publish("pod-0")
	waitFor(t, "pod-0's batch applied", func() bool { _, ok := p.applier.Cursor(Stream{Worker: "pod-0"}); return ok })
	waitFor(t, "pod-1 refused at the limit", func() bool { publish("pod-1"); return refused("discovery_limit") > 0 })
	for _, w := range []string{"intruder", "pod-1"} {
		if _, ok := p.applier.Cursor(Stream{Worker: w}); ok {
			t.Errorf("%s's batches were applied", w)
		}
	}
	discovered := 0
	for _, ws := range p.mgr.Workers() {
		if ws.Source == SourceDiscover {
			discovered++
		}
	}
	if discovered != 1 {
		t.Errorf("%d workers discovered on NATS, want 1 (the limit)", discovered)
	}
}

// The dp rank of a bind-mode (or NATS) batch comes from the publisher, and
// every rank is a stream (a goroutine, a queue, an index holder on every
// replica): a discovered worker has at most MaxDiscoveredDPRanks of them, a
// registered one its dp-size. Batches of other ranks are counted and dropped;
// those of the allowed ranks are applied.
func TestDPRanksAreBoundedPerWorker(t *testing.T) {
	const limit = 4
	cfg := testManagerConfig()
	cfg.ZMQBind = "tcp://127.0.0.1:*"
	cfg.MaxDiscoveredDPRanks = limit
	p := startPipeline(t, cfg)
	if err := p.mgr.AddWorker(workerspec.Spec{ID: "registered", Model: "m", DPSize: 2}); err != nil {
		t.Fatal(err)
	}
	pub := newRawPub(t, newTestZMQContext(t))
	if err := pub.sock.Connect(p.mgr.BindEndpoint()); err != nil {
		t.Fatal(err)
	}
	send := func(worker string, rank uint32) {
		payload, err := fakeengine.EncodeBatch(fakeengine.Batch{TS: 1, DPRank: rank, Events: []fakeengine.Event{{
			Kind: fakeengine.BlockStored, BlockHashes: []uint64{1}, TokenIDs: []uint32{1, 2, 3, 4}, BlockSize: 4, Medium: fakeengine.MediumGPU,
		}}}, fakeengine.WireMap)
		if err != nil {
			t.Fatal(err)
		}
		pub.send([]byte("kv@"+worker+"@m"), seqPart(0), payload)
	}
	waitFor(t, "the publisher's subscription", func() bool {
		send("discovered", 0)
		time.Sleep(20 * time.Millisecond)
		_, ok := p.applier.Cursor(Stream{Worker: "discovered"})
		return ok
	})
	const ranks = 40
	for rank := uint32(1); rank < ranks; rank++ {
		send("discovered", rank)
	}
	for rank := uint32(0); rank < ranks; rank++ {
		send("registered", rank)
	}
	refused := func(reason string) float64 {
		return p.counter("kvindex_ingest_decode_errors_total", map[string]string{"source": "bind", "reason": reason})
	}
	waitFor(t, "every batch applied or refused", func() bool {
		return refused("rank_limit") >= ranks-limit && refused("dp_size") >= ranks-2 &&
			p.counter("kvindex_ingest_batches_total", map[string]string{"result": "applied"}) >= limit+2
	})
	for _, c := range []struct {
		worker  string
		reason  string
		allowed uint32
	}{{"discovered", "rank_limit", limit}, {"registered", "dp_size", 2}} {
		if got := refused(c.reason); got != float64(ranks-c.allowed) {
			t.Errorf("%s: %s refusals = %v, want %d", c.worker, c.reason, got, ranks-c.allowed)
		}
		for _, w := range p.mgr.Workers() {
			if w.Spec.ID == c.worker && len(w.Streams) != int(c.allowed) {
				t.Errorf("%s runs %d streams, want %d", c.worker, len(w.Streams), c.allowed)
			}
		}
		for rank := range c.allowed {
			if _, ok := p.applier.Cursor(Stream{Worker: c.worker, DPRank: rank}); !ok {
				t.Errorf("%s: the batch of rank %d was not applied", c.worker, rank)
			}
		}
	}
	if got := p.index.Stats().Workers; got != limit+2 {
		t.Errorf("the index holds %d streams, want %d", got, limit+2)
	}
}
