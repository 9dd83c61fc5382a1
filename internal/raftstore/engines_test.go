package raftstore

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvindex/kvindex/bench/fakeengine"
	"github.com/kvindex/kvindex/bench/fakeengine/fakeenginetest"
	"github.com/kvindex/kvindex/internal/ingest"
	"github.com/kvindex/kvindex/internal/workerspec"
)

// TestLeaderKillSoakWithFakeEngines is the leader-kill test with the real
// pipeline: fake vLLM engines publish KV events on ZMQ with replay sockets, every
// node runs ingest's Manager while it leads (Manager.Run with the Node as Sink and
// its Applier as CursorSource), and the leader is killed abruptly several times
// while the engines serve requests. In the end every replica holds the same
// index, it holds exactly the blocks the engines cache, and every replica applied
// every batch of every stream once. With KVINDEX_LONG=1 (make test-long) the
// leader is killed every 10 s for 2 minutes.
func TestLeaderKillSoakWithFakeEngines(t *testing.T) {
	kills, every := 3, 1500*time.Millisecond
	if os.Getenv("KVINDEX_LONG") != "" {
		kills, every = 12, 10*time.Second
	}
	engines := []*fakeengine.Engine{startFakeEngine(t, 1), startFakeEngine(t, 2)}
	specs := []workerspec.Spec{engineSpec("engine-a", engines[0]), engineSpec("engine-b", engines[1])}

	var logsMu sync.Mutex
	type incarnation struct {
		log    *applyLog
		killed bool
	}
	incarnations := map[string][]*incarnation{}
	newLog := func(id string) BatchObserver {
		inc := &incarnation{log: newApplyLog()}
		logsMu.Lock()
		incarnations[id] = append(incarnations[id], inc)
		logsMu.Unlock()
		return inc.log.observe
	}
	c := makeCluster(t, 3, func(id string, cfg *Config) { cfg.OnBatch = newLog(id) })

	ctx, cancel := context.WithCancel(context.Background())
	var ingestWG sync.WaitGroup
	managers := map[*Node]*ingest.Manager{}
	defer func() {
		cancel()
		ingestWG.Wait()
		for _, m := range managers {
			m.Close()
		}
	}()
	runIngest := func(n *Node) {
		mgr := newEngineManager(t, specs)
		managers[n] = mgr
		ingestWG.Add(1)
		go func() {
			defer ingestWG.Done()
			n.RunWhileLeader(ctx, func(lctx context.Context) {
				if err := mgr.Run(lctx, n, n.Applier()); err != nil && lctx.Err() == nil {
					t.Errorf("%s: ingest stopped: %v", n.ID(), err)
				}
			})
		}()
	}
	for _, tn := range c.nodes {
		runIngest(tn.get())
	}

	// Until a subscription is live, what an engine publishes reaches the index only
	// through replay; clearing its cache publishes AllBlocksCleared, so from the
	// first batch the leader applies of each stream, index and engine agree.
	waitFor(t, 20*time.Second, func() bool {
		leader := c.leader(10 * time.Second)
		for _, e := range engines {
			if err := e.ResetPrefixCache(); err != nil {
				t.Fatal(err)
			}
		}
		for _, s := range specs {
			for r := range s.Ranks() {
				if _, ok := leader.Applier().Cursor(ws(s.ID, r)); !ok {
					return false
				}
			}
		}
		return true
	})

	trafficCtx, stopTraffic := context.WithCancel(ctx)
	var trafficWG sync.WaitGroup
	var requests, trafficErrs sync.Map
	for i, e := range engines {
		for w := range 3 {
			trafficWG.Add(1)
			go func() {
				defer trafficWG.Done()
				n, err := engineTraffic(trafficCtx, e, uint64(10*i+w))
				requests.Store(10*i+w, n)
				if err != nil {
					trafficErrs.Store(10*i+w, err)
				}
			}()
		}
	}

	var failovers []time.Duration
	for range kills {
		time.Sleep(every)
		start := time.Now()
		old, oldNode := c.killLeader()
		managers[oldNode].Close()
		delete(managers, oldNode)
		logsMu.Lock()
		incs := incarnations[old.id]
		incs[len(incs)-1].killed = true
		logsMu.Unlock()
		for leaderAmong(c.live()) == nil {
			if time.Since(start) > 20*time.Second {
				t.Fatalf("no new leader 20 s after killing %s", old.id)
			}
			time.Sleep(5 * time.Millisecond)
		}
		failovers = append(failovers, time.Since(start))
		old.cfg.OnBatch = newLog(old.id)
		runIngest(c.restart(old))
	}
	time.Sleep(time.Second)
	stopTraffic()
	trafficWG.Wait()
	trafficErrs.Range(func(k, v any) bool { t.Errorf("traffic %v: %v", k, v); return true })
	flushCtx, cancelFlush := context.WithTimeout(ctx, 10*time.Second)
	for _, e := range engines {
		if err := e.Flush(flushCtx); err != nil {
			t.Fatal(err)
		}
	}
	cancelFlush()

	// The engines are idle now: wait until every replica is at each stream's last seq.
	last := map[ingest.Stream]uint64{}
	for i, e := range engines {
		for _, rt := range e.CacheTruth().Ranks {
			last[ws(specs[i].ID, rt.DPRank)] = uint64(rt.LastSeq)
		}
	}
	waitCaughtUp(t, c, last, 60*time.Second)

	var digest [32]byte
	for i, tn := range c.live() {
		d := tn.get().Index().Digest()
		if i > 0 && d != digest {
			t.Errorf("%s: index digest differs from %s's", tn.id, c.live()[0].id)
		}
		digest = d
	}
	byID := map[string]*fakeengine.Engine{}
	for i, e := range engines {
		byID[specs[i].ID] = e
	}
	cached := fakeenginetest.AssertIndexHoldsTruth(t, c.live()[0].get().Index(), byID)

	published := 0
	for _, seq := range last {
		published += int(seq) + 1
	}
	var lost, dup, reproposed int
	logsMu.Lock()
	for id, incs := range incarnations {
		for i, inc := range incs {
			l, d, _ := inc.log.audit(nil)
			if !inc.killed {
				for s, seq := range last {
					if got := inc.log.lastApplied(s); got != seq {
						t.Errorf("%s (incarnation %d): stream %v applied up to %d, the engine published %d", id, i, s, got, seq)
					}
				}
			}
			if l != 0 || d != 0 {
				t.Errorf("%s (incarnation %d, killed %v): %d batches lost (holes), %d applied twice", id, i, inc.killed, l, d)
			}
			lost += l
			dup += d
			reproposed = max(reproposed, inc.log.duplicates)
		}
	}
	logsMu.Unlock()
	var total int
	requests.Range(func(_, v any) bool { total += v.(int); return true })
	t.Logf("leader kills: %d; requests served: %d; event batches published: %d over %d streams; cached blocks compared: %d; "+
		"lost: %d; applied twice: %d; re-proposed batches dropped by the cursors (max over replicas): %d; time to new leader: %v",
		kills, total, published, len(last), cached, lost, dup, reproposed, failovers)
}

// newEngineManager returns an ingest Manager for fake engines (block sizes
// from the events, quick polls and replays) following specs; the caller closes it.
func newEngineManager(t *testing.T, specs []workerspec.Spec) *ingest.Manager {
	t.Helper()
	mcfg := ingest.DefaultManagerConfig()
	mcfg.Workers = specs
	mcfg.DefaultBlockSize = 0
	mcfg.PollInterval = 10 * time.Millisecond
	mcfg.ReplayTimeout = time.Second
	mgr, err := ingest.NewManager(mcfg, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	return mgr
}

func startFakeEngine(t *testing.T, dpSize int) *fakeengine.Engine {
	t.Helper()
	cfg := fakeenginetest.Config()
	cfg.DataParallelSize = dpSize
	cfg.TimeScale = 0.2
	cfg.NumGPUBlocks = 64
	cfg.NumCPUBlocks = 32
	cfg.MaxNumSeqs = 8
	cfg.MaxNumBatchedTokens = 64
	cfg.DefaultMaxTokens = 4
	return fakeenginetest.Start(t, cfg)
}

func engineSpec(id string, e *fakeengine.Engine) workerspec.Spec {
	cfg := e.Config()
	loopback := strings.NewReplacer("tcp://0.0.0.0:", "tcp://127.0.0.1:", "tcp://*:", "tcp://127.0.0.1:")
	spec := workerspec.Spec{ID: id, Model: cfg.Model, BlockSize: cfg.BlockSize, DPSize: cfg.DataParallelSize,
		Endpoint: loopback.Replace(e.EventEndpoints()[0]), Topic: e.Topic()}
	if r := e.ReplayEndpoints(); len(r) > 0 {
		spec.Replay = loopback.Replace(r[0])
	}
	return spec
}

// engineTraffic sends requests to e until ctx ends: prompts that share system
// prefixes and extend earlier prompts, so that blocks are reused and evicted.
func engineTraffic(ctx context.Context, e *fakeengine.Engine, seed uint64) (int, error) {
	rng := rand.New(rand.NewPCG(seed, 7))
	tokens := func(n int) []uint32 {
		out := make([]uint32, n)
		for i := range out {
			out[i] = uint32(rng.IntN(256)) // the builtin byte-level vocabulary
		}
		return out
	}
	systems := [][]uint32{tokens(12), tokens(16), tokens(9)}
	var history [][]uint32
	for n := 0; ; n++ {
		if ctx.Err() != nil {
			return n, nil
		}
		var prompt []uint32
		if len(history) > 0 && rng.IntN(3) == 0 {
			prompt = append(slices.Clone(history[rng.IntN(len(history))]), tokens(3+rng.IntN(8))...)
		} else {
			prompt = append(slices.Clone(systems[rng.IntN(len(systems))]), tokens(2+rng.IntN(16))...)
		}
		prompt = prompt[:min(len(prompt), 60)]
		history = append(history, prompt)
		if len(history) > 50 {
			history = history[1:]
		}
		if _, err := e.Generate(ctx, fakeengine.Request{Prompt: prompt, MaxTokens: 1 + rng.IntN(4)}); err != nil && ctx.Err() == nil {
			return n, err
		}
	}
}
