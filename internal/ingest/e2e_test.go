package ingest

import (
	"testing"

	"github.com/kvindex/kvindex/bench/fakeengine"
	"github.com/kvindex/kvindex/bench/fakeengine/fakeenginetest"
	"github.com/kvindex/kvindex/internal/ingest/wire"
	"github.com/kvindex/kvindex/internal/workerspec"
)

// bindEngine starts an engine that connects its PUB socket to the Manager's bind
// socket (its ROUTER replay socket still binds).
func bindEngine(t *testing.T, p *pipeline, mutate func(*fakeengine.Config)) *fakeengine.Engine {
	t.Helper()
	cfg := engineConfig()
	cfg.KVEventsEndpoint = p.mgr.BindEndpoint()
	if mutate != nil {
		mutate(&cfg)
	}
	return fakeenginetest.Start(t, cfg)
}

// topicWorkerID is the worker id bind mode derives from an engine's topic.
func topicWorkerID(t *testing.T, e *fakeengine.Engine) string {
	t.Helper()
	worker, _, err := wire.ParseTopic(e.Topic())
	if err != nil {
		t.Fatal(err)
	}
	return worker
}

// handshake makes idle engines publish until the Manager has applied a batch of
// every rank: a subscription becomes live some time after it is made (ZMQ's slow
// joiner), and traffic sent before would reach the index only through replays.
// Each round publishes AllBlocksCleared, so whatever batch the Manager sees first,
// the index and the engine agree from there on.
func handshake(t *testing.T, p *pipeline, engines ...followed) {
	t.Helper()
	for _, f := range engines {
		waitFor(t, "first batch of "+f.worker, func() bool {
			if err := f.engine.ResetPrefixCache(); err != nil {
				t.Fatal(err)
			}
			for r := range f.engine.Config().DataParallelSize {
				if _, ok := p.applier.Cursor(Stream{Worker: f.worker, DPRank: uint32(r)}); !ok {
					return false
				}
			}
			return true
		})
	}
}

func TestIndexEqualsUnionOfEngineCaches(t *testing.T) {
	cfg := testManagerConfig()
	cfg.ZMQBind = "tcp://127.0.0.1:*"
	p := startPipeline(t, cfg)

	plain := fakeenginetest.Start(t, engineConfig())
	legacy := func() *fakeengine.Engine {
		c := engineConfig()
		c.KVEventsWire = fakeengine.WireArray
		c.ReplayLayout = fakeengine.ReplayLegacy
		c.NumCPUBlocks = 24
		return fakeenginetest.Start(t, c)
	}()
	dataParallel := func() *fakeengine.Engine {
		c := engineConfig()
		c.DataParallelSize = 2
		c.NumCPUBlocks = 16
		return fakeenginetest.Start(t, c)
	}()
	lora := func() *fakeengine.Engine {
		c := engineConfig()
		c.LoRAModules = []string{"sql-adapter", "chat-adapter"}
		return fakeenginetest.Start(t, c)
	}()
	connected := []followed{{"plain", plain}, {"legacy", legacy}, {"dp", dataParallel}, {"lora", lora}}
	for _, f := range connected {
		if err := p.mgr.AddWorker(connectSpec(f.worker, f.engine)); err != nil {
			t.Fatal(err)
		}
	}

	// Two engines connect to the bind socket: one registered with its replay
	// endpoint (caught up by replay), one discovered from its topic.
	declared := bindEngine(t, p, func(c *fakeengine.Config) { c.NumCPUBlocks = 16 })
	declaredID := topicWorkerID(t, declared)
	if err := p.mgr.AddWorker(workerspec.Spec{ID: declaredID, Model: declared.Config().Model, Replay: declared.ReplayEndpoints()[0]}); err != nil {
		t.Fatal(err)
	}
	discovered := bindEngine(t, p, func(c *fakeengine.Config) { c.KVEventsReplayEndpoint = "" })
	discoveredID := topicWorkerID(t, discovered)

	all := append(connected, followed{declaredID, declared}, followed{discoveredID, discovered})
	handshake(t, p, all...)
	traffic{seed: 1, requests: 60, inFlight: 4, salts: []string{"tenant-a", "tenant-b"}}.
		run(t, plain, legacy, dataParallel, lora, declared, discovered)
	waitConverged(t, p.applier, all...)
	p.stopRun()

	for _, f := range all {
		if got := p.counter("kvindex_ingest_block_events_total", map[string]string{"worker": f.worker, "type": "BlockRemoved"}); got == 0 {
			t.Errorf("worker %s: no block was evicted; the test needs evictions to mean something", f.worker)
		}
	}
	for _, name := range []string{"kvindex_ingest_resets_total", "kvindex_ingest_decode_errors_total", "kvindex_ingest_refused_events_total"} {
		if got := p.counter(name, nil); got != 0 {
			t.Errorf("%s = %v, want 0 on clean traffic", name, got)
		}
	}
	if got := p.counter("kvindex_ingest_workers", map[string]string{"source": "discovered"}); got != 1 {
		t.Errorf("discovered workers = %v, want 1", got)
	}
	assertIndexEqualsTruth(t, p.index, all...)
}
