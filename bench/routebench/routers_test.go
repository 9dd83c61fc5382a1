package routebench

import (
	"crypto/sha256"
	"fmt"
	"math"
	"testing"

	"github.com/kvindex/kvindex/bench/fakeengine"
	"github.com/kvindex/kvindex/internal/router"
)

// simulatedDigest is a digest of an offline row's simulated figures (every
// column but the measured wall-clock and CPU ones, and every TTFT).
func simulatedDigest(t *testing.T, cfg Config, trace, policy string) string {
	t.Helper()
	r := offlineRow(t, cfg, trace, policy)
	r.DecisionP50, r.DecisionP99, r.DecisionCPUP50, r.DecisionCPUP99, r.WallSeconds = 0, 0, 0, 0, 0
	r.OracleHitRate, r.IndexerCPUMs = math.Inf(1), math.Inf(1) // NaN offline; NaN prints fine but say so
	return fmt.Sprintf("%x", sha256.Sum256(fmt.Appendf(nil, "%+v", r)))[:16]
}

// TestOfflineOneRouterIsUnchanged: with one router the ledger has nothing to
// share, so turning it on must not change a single simulated figure; and the
// simulator is deterministic for its seeds (two runs of one configuration agree),
// or the comparison would prove nothing.
func TestOfflineOneRouterIsUnchanged(t *testing.T) {
	cases := []struct{ trace, policy string }{
		{"chat", "kv-aware"},
		{"burst", "kv-aware"},
		{"agentic", "kv-aware"},
		{"agentic", "dynamo-approx"},
		{"document", "sglang-cache-aware"},
		{"chat", "session"},
	}
	for _, c := range cases {
		t.Run(c.trace+"/"+c.policy, func(t *testing.T) {
			digest := func(ledger bool) string {
				cfg := smallConfig()
				cfg.Routers, cfg.Ledger = 1, ledger
				return simulatedDigest(t, cfg, c.trace, c.policy)
			}
			off, again := digest(false), digest(false)
			if off != again {
				t.Fatalf("two runs without the ledger differ (%s, %s): the simulator is not deterministic", off, again)
			}
			if on := digest(true); on != off {
				t.Errorf("one router with the ledger simulates differently (%s) from one without (%s)", on, off)
			}
		})
	}
}

// burstSpread replays the burst trace through routers and reports the hit rate
// and the mean number of workers each burst's siblings went to.
func burstSpread(t *testing.T, routers int, ledger bool) (hit, spread float64) {
	t.Helper()
	cfg := smallConfig()
	cfg.Workers, cfg.Requests, cfg.Routers, cfg.Ledger = 8, 400, routers, ledger
	s, tr := testSim(t, &cfg, "burst", "kv-aware")
	outs, err := s.run()
	if err != nil {
		t.Fatal(err)
	}
	row := summarize(tr.Name, "kv-aware", "offline", cfg.Workers, cfg.BlockSize, 40, outs, nil, cfg.SLOTTFT)
	workers := map[int]map[int]bool{}
	for i, r := range tr.Requests {
		if workers[r.Group] == nil {
			workers[r.Group] = map[int]bool{}
		}
		workers[r.Group][s.reqs[i].worker] = true
	}
	n := 0
	for _, ws := range workers {
		n += len(ws)
	}
	return row.HitRate, float64(n) / float64(len(workers))
}

// TestOfflineRoutersShareThroughLedger: a burst's siblings enter through 4
// routers in turn at one instant. With the ledger every router sees the same
// fleet-wide load and last push's decisions, so they pick alike and siblings
// co-locate nearly as through one router; without it each sees its own quarter
// and they scatter. Virtual clock: the figures are exact for the seed.
func TestOfflineRoutersShareThroughLedger(t *testing.T) {
	oneHit, oneSpread := burstSpread(t, 1, true)
	onHit, onSpread := burstSpread(t, 4, true)
	offHit, offSpread := burstSpread(t, 4, false)
	t.Logf("hit rate / workers per burst: 1 router %.4f / %.2f, 4 with the ledger %.4f / %.2f, 4 without %.4f / %.2f",
		oneHit, oneSpread, onHit, onSpread, offHit, offSpread)
	if oneSpread > 1.1 {
		t.Fatalf("one router spreads a burst over %.2f workers: the baseline does not co-locate", oneSpread)
	}
	if onHit < 0.9*oneHit || onSpread > 1.5 {
		t.Errorf("4 routers with the ledger: hit %.4f (one router %.4f), %.2f workers per burst: siblings do not co-locate", onHit, oneHit, onSpread)
	}
	if offHit > onHit-0.1 || offSpread < onSpread+1 {
		t.Errorf("4 routers without the ledger: hit %.4f, %.2f workers per burst, not measurably worse than with it (%.4f, %.2f)",
			offHit, offSpread, onHit, onSpread)
	}
}

// TestOfflineLedgerPushRevealsOthers: another router's reservation, decision and
// session binding reach a router at the next push, not before, and a router
// never sees its own load twice.
func TestOfflineLedgerPushRevealsOthers(t *testing.T) {
	cfg := smallConfig()
	cfg.Routers, cfg.Requests = 2, 2
	s, tr := testSim(t, &cfg, "burst", "kv-aware")
	req := &tr.Requests[0]
	s.clock = req.Arrival
	if err := s.arrive(0); err != nil { // through router 0
		t.Fatal(err)
	}
	w := s.reqs[0].worker
	local, keys := router.PromptKeys(req.Prompt, cfg.BlockSize, simModel, "", "")
	route := &router.RouteRequest{Model: simModel, BaseModel: simModel, PromptTokens: len(req.Prompt), BlockSize: cfg.BlockSize,
		OutputTokens: req.OutputTokens, Keys: keys, LocalKeys: local, SessionKey: "s:" + req.Session}
	view := func(k int) router.Candidate {
		return s.candidates(s.routers[k], route, fakeengine.Request{Prompt: req.Prompt, MaxTokens: req.OutputTokens})[w]
	}
	own := view(0)
	if own.Load.InFlight != 1 || own.Overlap.Blocks() != len(keys) || !own.SessionBound {
		t.Fatalf("router 0's own view of worker %d: %+v", w, own)
	}
	if c := view(1); c.Load != (router.Load{}) || c.Overlap.Blocks() != 0 || c.SessionBound || c.SharedActive != 0 {
		t.Fatalf("router 1 sees router 0's decision before any push: %+v", c)
	}
	s.ledgerPush()
	c := view(1)
	if c.Load != own.Load {
		t.Errorf("router 1 after the push: load %+v, router 0 holds %+v", c.Load, own.Load)
	}
	if c.Overlap.Blocks() != len(keys) || c.Overlap.Source != router.SourcePredicted || !c.SessionBound {
		t.Errorf("router 1 after the push: overlap %+v session bound %v; want router 0's decision predicted and its session bound", c.Overlap, c.SessionBound)
	}
	if c.SharedActive != own.SharedActive || c.SharedPrefill != own.SharedPrefill {
		t.Errorf("router 1 after the push shares %d/%d blocks with worker %d, router 0 (holding the load) %d/%d",
			c.SharedActive, c.SharedPrefill, w, own.SharedActive, own.SharedPrefill)
	}
	if again := view(0); again.Load != own.Load {
		t.Errorf("router 0 after the push: load %+v, its own is %+v (counted twice?)", again.Load, own.Load)
	}
}
