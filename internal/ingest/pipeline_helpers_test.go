package ingest

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/kvindex/kvindex/bench/fakeengine"
	"github.com/kvindex/kvindex/bench/fakeengine/fakeenginetest"
	"github.com/kvindex/kvindex/internal/kvblock"
	"github.com/kvindex/kvindex/internal/logbuf"
	"github.com/kvindex/kvindex/internal/radix"
	"github.com/kvindex/kvindex/internal/workerspec"
)

// pipeline is a real single-node ingest pipeline: Manager -> LocalSink -> Applier
// -> radix.Index, with its own Prometheus registry.
type pipeline struct {
	t       *testing.T
	index   *radix.Index
	applier *Applier
	sink    *LocalSink
	mgr     *Manager
	reg     *prometheus.Registry
	logs    *logbuf.Buffer

	cancel  context.CancelFunc
	sinkErr chan error
	runErr  chan error
	bindErr chan error // ServeBind's, with --zmq-bind
}

// testManagerConfig returns a config suited to tests: short poll and replay
// timeouts, and no idle replays, so that replay counters count gaps only.
func testManagerConfig() ManagerConfig {
	c := DefaultManagerConfig()
	c.IdleReplayInterval = 0
	c.DefaultBlockSize = 0
	c.PollInterval = 10 * time.Millisecond
	c.ReplayTimeout = time.Second
	c.WorkersFilePoll = 20 * time.Millisecond
	return c
}

// startPipeline builds the pipeline, starts the sink and the Manager, and waits
// until the Manager has set up its sockets. Cleanup stops everything and checks
// that the Manager's ZMQ context terminates (it would hang on a leaked socket).
func startPipeline(t *testing.T, cfg ManagerConfig) *pipeline {
	t.Helper()
	p := newPipeline(t, cfg)
	p.start()
	t.Cleanup(p.stop)
	return p
}

func newPipeline(t *testing.T, cfg ManagerConfig) *pipeline {
	t.Helper()
	return newPipelineThrough(t, cfg, nil)
}

// newPipelineThrough is newPipeline whose sink applies through wrap(applier)
// (the applier itself when wrap is nil).
func newPipelineThrough(t *testing.T, cfg ManagerConfig, wrap func(*Applier) BatchApplier) *pipeline {
	t.Helper()
	p := &pipeline{t: t, index: radix.New(radix.Config{}), reg: prometheus.NewRegistry(), logs: &logbuf.Buffer{}}
	logger := slog.New(slog.NewTextHandler(p.logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	p.applier = NewApplier(p.index)
	var applier BatchApplier = p.applier
	if wrap != nil {
		applier = wrap(p.applier)
	}
	var err error
	if p.sink, err = NewLocalSink(applier, 0, logger, p.reg); err != nil {
		t.Fatal(err)
	}
	if p.mgr, err = NewManager(cfg, logger, p.reg); err != nil {
		t.Fatal(err)
	}
	return p
}

func (p *pipeline) start() {
	p.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	p.cancel = cancel
	p.sinkErr, p.runErr = make(chan error, 1), make(chan error, 1)
	go func() { p.sinkErr <- p.sink.Run(ctx) }()
	go func() { p.runErr <- p.mgr.Run(ctx, p.sink, p.applier) }()
	if p.mgr.cfg.ZMQBind != "" {
		p.bindErr = make(chan error, 1)
		go func() { p.bindErr <- p.mgr.ServeBind(ctx, nil) }()
	}
	waitFor(p.t, "manager running", func() bool {
		select {
		case err := <-p.runErr:
			p.t.Fatalf("Run returned early: %v", err)
		case err := <-p.bindErr: // never ready while bindErr is nil
			p.t.Fatalf("ServeBind returned early: %v", err)
		default:
		}
		return p.mgr.Running() && (p.bindErr == nil || p.mgr.BindEndpoint() != "")
	})
}

// stopRun stops the Manager and the sink (the index stays readable).
func (p *pipeline) stopRun() {
	p.t.Helper()
	if p.cancel == nil {
		return
	}
	p.cancel()
	p.cancel = nil
	waits := []chan error{p.runErr, p.sinkErr}
	if p.bindErr != nil {
		waits = append(waits, p.bindErr)
	}
	for _, ch := range waits {
		select {
		case err := <-ch:
			if err != nil {
				p.t.Errorf("stopped with error: %v", err)
			}
		case <-time.After(10 * time.Second):
			p.t.Fatal("Manager or sink did not stop within 10s")
		}
	}
}

func (p *pipeline) stop() {
	p.stopRun()
	closed := make(chan error, 1)
	go func() { closed <- p.mgr.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			p.t.Errorf("Manager.Close: %v", err)
		}
	case <-time.After(10 * time.Second):
		p.t.Error("Manager.Close hangs: a ZMQ socket was left open")
	}
}

// flush waits until the sink has applied everything submitted so far.
func (p *pipeline) flush() {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.sink.Flush(ctx); err != nil {
		p.t.Fatalf("sink flush: %v", err)
	}
}

// handedOff is the seq of the last batch worker's rank 0 handed to the sink,
// from its status (ok false before its first).
func (p *pipeline) handedOff(worker string) (seq uint64, ok bool) {
	for _, w := range p.mgr.Workers() {
		for _, st := range w.Streams {
			if w.Spec.ID == worker && st.DPRank == 0 && st.State != StateConnecting {
				return st.LastSeq, true
			}
		}
	}
	return 0, false
}

// counter sums every series of a metric whose labels include want.
func (p *pipeline) counter(name string, want map[string]string) float64 {
	p.t.Helper()
	return gatherSum(p.t, p.reg, name, want)
}

func gatherSum(t *testing.T, reg prometheus.Gatherer, name string, want map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if !labelsInclude(m.GetLabel(), want) {
				continue
			}
			switch {
			case m.Counter != nil:
				sum += m.Counter.GetValue()
			case m.Gauge != nil:
				sum += m.Gauge.GetValue()
			case m.Histogram != nil:
				sum += float64(m.Histogram.GetSampleCount())
			}
		}
	}
	return sum
}

func labelsInclude(have []*dto.LabelPair, want map[string]string) bool {
	for k, v := range want {
		found := false
		for _, l := range have {
			if l.GetName() == k && l.GetValue() == v {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// waitFor polls cond until it holds, failing the test after 30s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// engineConfig is a small fake vLLM engine that never sleeps, binds its HTTP, PUB
// and ROUTER sockets to free loopback ports, and evicts often.
func engineConfig() fakeengine.Config {
	c := fakeenginetest.Config()
	c.NumGPUBlocks = 48
	c.MaxNumSeqs = 8
	c.MaxNumBatchedTokens = 64
	c.DefaultMaxTokens = 4
	return c
}

// connectSpec is the --worker spec of an engine whose PUB and ROUTER sockets bind.
func connectSpec(id string, e *fakeengine.Engine) workerspec.Spec {
	cfg := e.Config()
	loopback := strings.NewReplacer("tcp://0.0.0.0:", "tcp://127.0.0.1:")
	spec := workerspec.Spec{ID: id, Model: cfg.Model, BlockSize: cfg.BlockSize, DPSize: cfg.DataParallelSize,
		Endpoint: loopback.Replace(e.EventEndpoints()[0]), Topic: e.Topic()}
	if r := e.ReplayEndpoints(); len(r) > 0 {
		spec.Replay = loopback.Replace(r[0])
	}
	return spec
}

// traffic sends realistic requests to engines: shared system prompts, multi-turn
// conversations that extend earlier prompts, some LoRA and cache-salted requests,
// several in flight per engine, a quarter of them for the engine's LoRA adapters
// when it has some. The system prompts depend on the seed only, so
// engines share them (and their blocks share tree nodes in the index).
type traffic struct {
	seed     uint64
	requests int // per engine
	inFlight int
	salts    []string
}

func (tr traffic) run(t *testing.T, engines ...*fakeengine.Engine) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, len(engines)*tr.inFlight)
	for ei, e := range engines {
		systems := make([][]uint32, 5)
		rng := rand.New(rand.NewPCG(tr.seed, 0))
		for i := range systems {
			systems[i] = tr.tokens(rng, 8+rng.IntN(12))
		}
		var mu sync.Mutex
		var history [][]uint32
		next := 0
		for w := 0; w < tr.inFlight; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(tr.seed+1, uint64(ei*100+w)))
				for {
					mu.Lock()
					if next >= tr.requests {
						mu.Unlock()
						return
					}
					next++
					var prompt []uint32
					if len(history) > 0 && rng.IntN(3) == 0 {
						prev := history[rng.IntN(len(history))]
						prompt = append(slices.Clone(prev), tr.tokens(rng, 3+rng.IntN(10))...)
					} else {
						prompt = append(slices.Clone(systems[rng.IntN(len(systems))]), tr.tokens(rng, 2+rng.IntN(20))...)
					}
					if len(prompt) > 100 {
						prompt = prompt[:100]
					}
					history = append(history, prompt)
					mu.Unlock()
					req := fakeengine.Request{Prompt: prompt, MaxTokens: 1 + rng.IntN(6)}
					if loras := e.Config().LoRAModules; len(loras) > 0 && rng.IntN(4) == 0 {
						req.Model = loras[rng.IntN(len(loras))]
					}
					if len(tr.salts) > 0 && rng.IntN(4) == 0 {
						req.CacheSalt = tr.salts[rng.IntN(len(tr.salts))]
					}
					if _, err := e.Generate(context.Background(), req); err != nil {
						errs <- fmt.Errorf("engine %s: %w", e.Addr(), err)
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for _, e := range engines {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := e.Flush(ctx)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
	}
}

func (tr traffic) tokens(rng *rand.Rand, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(rng.IntN(256))
	}
	return out
}

// followed is an engine as the index knows it: under which worker id.
type followed struct {
	worker string
	engine *fakeengine.Engine
}

// waitConverged waits until, for every rank of every engine, the applier's cursor
// is at the last batch the engine published (its truth's LastSeq).
func waitConverged(t *testing.T, a *Applier, engines ...followed) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var behind []string
		for _, f := range engines {
			for _, rt := range f.engine.CacheTruth().Ranks {
				if rt.LastSeq < 0 {
					continue
				}
				c, ok := a.Cursor(Stream{Worker: f.worker, DPRank: rt.DPRank})
				if !ok || c.Seq != uint64(rt.LastSeq) {
					behind = append(behind, fmt.Sprintf("%s/%d at %v (%d) want %d", f.worker, rt.DPRank, c.Seq, boolInt(ok), rt.LastSeq))
				}
			}
		}
		if len(behind) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("index did not catch up with the engines within 30s: %s", strings.Join(behind, "; "))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// truthBlock is one block an engine rank really caches, with its full prefix.
type truthBlock struct {
	worker Stream
	block  fakeengine.CachedBlock
	tiers  []radix.Tier
	// keys and fastest are the block keys and fastest tiers of the chain from the
	// root to this block; nil when an ancestor is no longer cached (the chain
	// cannot be walked from the root).
	keys    []uint64
	fastest []radix.Tier
	ns      uint64
}

// truthBlocks lists every block of the engines' truth views.
func truthBlocks(t *testing.T, engines ...followed) []truthBlock {
	t.Helper()
	var out []truthBlock
	for _, f := range engines {
		truth := f.engine.CacheTruth()
		for _, rt := range truth.Ranks {
			byHash := map[uint64]fakeengine.CachedBlock{}
			for _, b := range rt.Blocks {
				byHash[b.Hash] = b
			}
			for _, b := range rt.Blocks {
				tb := truthBlock{worker: Stream{Worker: f.worker, DPRank: rt.DPRank}, block: b, tiers: tiersOf(t, b.Tiers)}
				var chain []fakeengine.CachedBlock
				complete := true
				for cur := b; ; {
					chain = append(chain, cur)
					if cur.ParentHash == nil {
						break
					}
					parent, ok := byHash[*cur.ParentHash]
					if !ok {
						complete = false
						break
					}
					cur = parent
				}
				if complete {
					slices.Reverse(chain)
					root := chain[0]
					salt := ""
					extra := root.ExtraKeys
					if root.LoRAName != "" && len(extra) > 0 {
						extra = extra[1:]
					}
					if len(extra) > 0 {
						salt = extra[0]
					}
					tb.ns = kvblock.Namespace{Model: truth.Model, LoRA: root.LoRAName, CacheSalt: salt}.ID()
					for _, c := range chain {
						tb.keys = kvblock.AppendLocalHashes(tb.keys, c.TokenIDs, truth.BlockSize, c.LoRAName)
						tb.fastest = append(tb.fastest, slices.Min(tiersOf(t, c.Tiers)))
					}
				}
				out = append(out, tb)
			}
		}
	}
	return out
}

func tiersOf(t *testing.T, names []string) []radix.Tier {
	t.Helper()
	var out []radix.Tier
	for _, n := range names {
		switch n {
		case "GPU":
			out = append(out, radix.TierGPU)
		case "CPU":
			out = append(out, radix.TierCPU)
		default:
			t.Fatalf("unknown tier %q in truth", n)
		}
	}
	return out
}

// assertIndexEqualsTruth checks, strictly, that the index holds exactly what the
// engines cache:
//  1. every true block whose whole prefix is cached matches to its full depth for
//     its worker, each block counted on its fastest true tier (right keys, right
//     namespace, right place in the tree);
//  2. removing every true (block, tier) from the index removes exactly one thing
//     each time (nothing missing, orphans included);
//  3. after that the index holds nothing (nothing extra: no block, tier or worker
//     the engines do not have).
//
// Step 2 changes the index: call it last.
func assertIndexEqualsTruth(t *testing.T, ix *radix.Index, engines ...followed) {
	t.Helper()
	blocks := truthBlocks(t, engines...)
	if len(blocks) == 0 {
		t.Fatal("the engines cache nothing: the comparison would prove nothing")
	}
	full, failures := 0, 0
	fail := func(format string, args ...any) {
		failures++
		if failures <= 10 {
			t.Errorf(format, args...)
		}
	}
	for _, tb := range blocks {
		if tb.keys == nil {
			continue
		}
		full++
		var got radix.WorkerMatch
		for _, m := range ix.Match(tb.ns, tb.keys, []string{tb.worker.Worker}, nil) {
			if m.Worker == tb.worker {
				got = m
			}
		}
		var want [radix.NumTiers]int
		for _, tier := range tb.fastest {
			want[tier]++
		}
		if got.Blocks != len(tb.keys) || got.PerTier != want {
			fail("%s/%d block %x at depth %d: index matches %d blocks %v, want %d %v",
				tb.worker.Worker, tb.worker.DPRank, tb.block.Hash, len(tb.keys), got.Blocks, got.PerTier, len(tb.keys), want)
		}
	}
	for _, tb := range blocks {
		for _, tier := range tb.tiers {
			res, err := ix.Removed(tb.worker, []uint64{tb.block.Hash}, tier)
			if err != nil || res.Removed != 1 {
				fail("%s/%d block %x on %v is missing from the index (removed %d, err %v)",
					tb.worker.Worker, tb.worker.DPRank, tb.block.Hash, tier, res.Removed, err)
			}
		}
	}
	if st := ix.Stats(); st.Residencies != 0 || st.Detached != 0 {
		fail("index holds %d residencies and %d detached blocks the engines do not cache", st.Residencies, st.Detached)
	}
	if failures > 10 {
		t.Errorf("... %d failures in all", failures)
	}
	t.Logf("compared %d cached blocks (%d with their whole prefix cached) with the index", len(blocks), full)
}
