package ingest

import (
	"context"
	"strings"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/kvindex/kvindex/bench/fakeengine"
	"github.com/kvindex/kvindex/bench/fakeengine/fakeenginetest"
	"github.com/kvindex/kvindex/internal/kvblock"
	"github.com/kvindex/kvindex/internal/radix"
)

// startNATS runs an embedded NATS server on a free loopback port.
func startNATS(t *testing.T) string {
	t.Helper()
	s, err := natsserver.NewServer(&natsserver.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats server not ready")
	}
	t.Cleanup(s.Shutdown)
	return s.ClientURL()
}

// natsPublisher connects to the NATS server at url for the test and returns a
// function that publishes data on subject with headers (name, value pairs), as
// a publishing engine does.
func natsPublisher(t *testing.T, url string) func(subject string, data []byte, headers ...string) {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return func(subject string, data []byte, headers ...string) {
		t.Helper()
		msg := &nats.Msg{Subject: subject, Data: data, Header: nats.Header{}}
		for i := 0; i+1 < len(headers); i += 2 {
			msg.Header.Set(headers[i], headers[i+1])
		}
		if err := nc.PublishMsg(msg); err != nil {
			t.Fatal(err)
		}
	}
}

// startRelay relays an engine's every rank to NATS as worker until the test ends.
func startRelay(t *testing.T, url, worker, model string, e *fakeengine.Engine) {
	t.Helper()
	spec := connectSpec(worker, e)
	cfg := DefaultRelayConfig()
	cfg.From, cfg.Replay, cfg.DPSize, cfg.Topic = spec.Endpoint, spec.Replay, spec.DPSize, spec.Topic
	cfg.Worker, cfg.Model, cfg.NATSURL = worker, model, url
	cfg.PollInterval = 10 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := RunRelay(ctx, cfg, nil)
		done <- err
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("relay %s: %v", worker, err)
		}
	})
}

func TestNATSRelayKeepsTheIndexEqualToTheEngines(t *testing.T) {
	const every = 50
	url := startNATS(t)
	cfg := testManagerConfig()
	cfg.Transport = TransportNATS
	cfg.NATSURL = url
	p := startPipeline(t, cfg)

	dropping := fakeenginetest.Start(t, engineConfig())
	dataParallel := func() *fakeengine.Engine {
		c := engineConfig()
		c.DataParallelSize = 2
		c.NumCPUBlocks = 16
		c.KVEventsWire = fakeengine.WireArray
		return fakeenginetest.Start(t, c)
	}()
	// One relay names the model, the other leaves it to the topic.
	startRelay(t, url, "w1", dropping.Config().Model, dropping)
	startRelay(t, url, "w2", "", dataParallel)
	engines := []followed{{"w1", dropping}, {"w2", dataParallel}}
	handshake(t, p, engines...)

	traffic{seed: 81, requests: 10, inFlight: 2}.run(t, dropping, dataParallel)
	waitConverged(t, p.applier, engines...)
	before := lastSeqs(dropping)[0]
	if err := dropping.SetFaults(fakeengine.Faults{DropEveryNBatches: every, FailStatus: 500}); err != nil {
		t.Fatal(err)
	}
	traffic{seed: 82, requests: 120, inFlight: 4, salts: []string{"t"}}.run(t, dropping, dataParallel)
	publishPastDrop(t, dropping, every)
	waitConverged(t, p.applier, engines...)
	p.stopRun()

	want := droppedSeqs(before, lastSeqs(dropping)[0], every)
	if want < 2 {
		t.Fatalf("only %d batches dropped; the test needs more traffic", want)
	}
	w1 := map[string]string{"worker": "w1"}
	if got := p.counter("kvindex_ingest_gaps_total", w1); got != float64(want) {
		t.Errorf("gaps seen through Kv-Seq = %v, want %d", got, want)
	}
	if got := p.counter("kvindex_ingest_replayed_batches_total", map[string]string{"worker": "w1", "reason": "gap"}); got != float64(want) {
		t.Errorf("batches replayed over ZMQ = %v, want %d", got, want)
	}
	if got := p.counter("kvindex_ingest_resets_total", nil); got != 0 {
		t.Errorf("resets = %v, want 0", got)
	}
	if got := p.counter("kvindex_ingest_workers", map[string]string{"source": "discovered"}); got != 2 {
		t.Errorf("workers discovered from subjects = %v, want 2", got)
	}
	assertIndexEqualsTruth(t, p.index, engines...)
}

// Without a replay endpoint a Kv-Seq gap cannot be filled: the worker's blocks are
// dropped rather than kept stale. Bad subjects and headers are counted.
func TestNATSGapWithoutReplayDropsTheWorkersBlocks(t *testing.T) {
	url := startNATS(t)
	cfg := testManagerConfig()
	cfg.Transport = TransportNATS
	cfg.NATSURL = url
	cfg.NATSSubjectPrefix = "infera.kv.events"
	p := startPipeline(t, cfg)
	send := natsPublisher(t, url)

	const model = "m"
	stored := func(hash uint64, tokens ...uint32) fakeengine.Event {
		return fakeengine.Event{Kind: fakeengine.BlockStored, BlockHashes: []uint64{hash}, TokenIDs: tokens, BlockSize: 2, Medium: fakeengine.MediumGPU}
	}
	publish := func(subject string, seq string, events ...fakeengine.Event) {
		t.Helper()
		payload, err := fakeengine.EncodeBatch(fakeengine.Batch{TS: float64(time.Now().UnixNano()) / 1e9, Events: events}, fakeengine.WireMap)
		if err != nil {
			t.Fatal(err)
		}
		headers := []string{HeaderModel, model}
		if seq != "" {
			headers = append(headers, "kv-seq", seq) // any case
		}
		send(subject, payload, headers...)
	}
	subject := Subject(cfg.NATSSubjectPrefix, "pod-1", 0)
	ns := kvblock.Namespace{Model: model}.ID()
	keysOf := func(tokens ...uint32) []uint64 { return kvblock.AppendLocalHashes(nil, tokens, 2, "") }
	worker := Stream{Worker: "pod-1"}

	publish(subject, "0", stored(10, 1, 2))
	publish(subject, "1", stored(11, 3, 4))
	waitFor(t, "seq 1 applied", func() bool { c, ok := p.applier.Cursor(worker); return ok && c.Seq == 1 })
	if got := matchedIn(p.index, worker, ns, keysOf(1, 2)); got != 1 {
		t.Fatalf("block of seq 0 matches %d, want 1", got)
	}

	publish(subject, "3", stored(13, 7, 8)) // seq 2 lost
	publish(cfg.NATSSubjectPrefix+".pod-1.notarank", "4", stored(14, 9, 9))
	publish(subject, "", stored(15, 9, 9))
	publish(subject, "x", stored(16, 9, 9))
	waitFor(t, "seq 3 applied", func() bool { c, ok := p.applier.Cursor(worker); return ok && c.Seq == 3 })
	waitFor(t, "bad messages counted", func() bool {
		return p.counter("kvindex_ingest_decode_errors_total", map[string]string{"source": "nats"}) == 3
	})
	if got := matchedIn(p.index, worker, ns, keysOf(1, 2)); got != 0 {
		t.Errorf("block of seq 0 survived an unfillable gap (matches %d)", got)
	}
	if got := matchedIn(p.index, worker, ns, keysOf(7, 8)); got != 1 {
		t.Errorf("block of seq 3 matches %d, want 1", got)
	}
	for _, c := range []struct {
		name string
		lbl  map[string]string
		want float64
	}{
		{"kvindex_ingest_gaps_total", map[string]string{"worker": "pod-1"}, 1},
		{"kvindex_ingest_replays_total", map[string]string{"worker": "pod-1", "reason": "gap", "result": "skipped"}, 1},
		{"kvindex_ingest_resets_total", map[string]string{"worker": "pod-1", "reason": "gap"}, 1},
		{"kvindex_ingest_decode_errors_total", map[string]string{"source": "nats", "reason": "bad_subject"}, 1},
		{"kvindex_ingest_decode_errors_total", map[string]string{"source": "nats", "reason": "bad_seq"}, 2},
	} {
		if got := p.counter(c.name, c.lbl); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.lbl, got, c.want)
		}
	}
}

// matchedIn is how many of keys (namespace ns) the index matches for stream s.
func matchedIn(ix *radix.Index, s Stream, ns uint64, keys []uint64) int {
	for _, m := range ix.Match(ns, keys, nil, nil) {
		if m.Worker == s {
			return m.Blocks
		}
	}
	return 0
}

func TestSubjects(t *testing.T) {
	for _, c := range []struct {
		prefix, subject, worker string
		rank                    uint32
		err                     string
	}{
		{"kv.events", "kv.events.pod-1.0", "pod-1", 0, ""},
		{"infera.kv.events", "infera.kv.events.w.17", "w", 17, ""},
		{"kv.events", "kv.events.pod-1", "", 0, "want kv.events.<worker>.<dp_rank>"},
		{"kv.events", "kv.events.pod-1.x", "", 0, "not a number"},
		{"kv.events", "kv.events.pod-1.4096", "", 0, "not a number below"},
		{"kv.events", "other.pod-1.0", "", 0, "not under"},
	} {
		worker, rank, err := parseSubject(c.prefix, c.subject)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("parseSubject(%q) error = %v, want %q", c.subject, err, c.err)
			}
			continue
		}
		if err != nil || worker != c.worker || rank != c.rank {
			t.Errorf("parseSubject(%q) = %q, %d, %v; want %q, %d", c.subject, worker, rank, err, c.worker, c.rank)
		}
		if back := Subject(c.prefix, worker, rank); back != c.subject {
			t.Errorf("Subject(%q, %q, %d) = %q, want %q", c.prefix, worker, rank, back, c.subject)
		}
	}
	for _, bad := range []string{"", "a.b", "a*", "a>", "a b"} {
		if validSubjectToken(bad) == nil {
			t.Errorf("worker %q accepted as a subject token", bad)
		}
	}
}
