package router

import (
	"fmt"
	"math"
	"testing"
)

func costCandidate(id string, prefillTokens, decodeBlocks, overlap int) Candidate {
	return Candidate{Worker: &Worker{ID: id, Ranks: 1}, Load: Load{InFlight: 1, PrefillTokens: prefillTokens, DecodeBlocks: decodeBlocks},
		Overlap: Overlap{GPU: overlap, Source: SourceIndex}}
}

// The dynamo cost, term by term, on hand-computed cases.
func TestKVAwareCostFormula(t *testing.T) {
	cfg := DefaultConfig() // half-life 64 blocks, session weight 0.25
	cfg.PrefillScale = 1   // so that the terms add up plainly
	// 100 prompt blocks, 110 own blocks.
	req := &RouteRequest{PromptTokens: 1600, OutputTokens: 160, BlockSize: 16}
	for _, c := range []struct {
		name string
		cand Candidate
		min  Candidate // the least-loaded other candidate
		want float64
	}{
		{"idle, nothing cached", costCandidate("a", 0, 0, 0), costCandidate("z", 0, 0, 0), 100 + 110},
		{"idle, 60 blocks cached", costCandidate("a", 0, 0, 60), costCandidate("z", 0, 0, 0), 40 + 110},
		{"cached but 64 blocks busier than the least loaded: credit halves", costCandidate("a", 64*16, 0, 60), costCandidate("z", 0, 0, 0),
			64 + 100 - 0.5*60 + 110},
		{"decode load counts", costCandidate("a", 0, 50, 0), costCandidate("z", 0, 0, 0), 100 + 50 + 110},
		{"CPU blocks count three quarters", Candidate{Worker: &Worker{ID: "a", Ranks: 1}, Overlap: Overlap{CPU: 40}}, costCandidate("z", 0, 0, 0),
			100 - 30 + 110},
		{"the engine's KV usage counts when it exceeds the router's own blocks",
			withEngine(costCandidate("a", 0, 50, 0), EngineLoad{KVUsage: 0.25, GPUBlocks: 1000}), costCandidate("z", 0, 0, 0), 100 + 250 + 110},
		{"the router's own blocks count when the engine reports fewer",
			withEngine(costCandidate("a", 0, 50, 0), EngineLoad{KVUsage: 0.01, GPUBlocks: 1000}), costCandidate("z", 0, 0, 0), 100 + 50 + 110},
		{"usage without the engine's capacity is not scored",
			withEngine(costCandidate("a", 0, 50, 0), EngineLoad{KVUsage: 0.9}), costCandidate("z", 0, 0, 0), 100 + 50 + 110},
		{"a fraction of a block in use is a block", withEngine(costCandidate("a", 0, 0, 0), EngineLoad{KVUsage: 0.0001, GPUBlocks: 1000}),
			costCandidate("z", 0, 0, 0), 100 + 1 + 110},
	} {
		t.Run(c.name, func(t *testing.T) {
			cands := []Candidate{c.cand, c.min}
			scoreKVAware(&cfg, req, cands)
			if math.Abs(cands[0].Cost-c.want) > 1e-9 {
				t.Errorf("cost = %v (terms %+v), want %v", cands[0].Cost, cands[0].Terms, c.want)
			}
		})
	}
}

func withEngine(c Candidate, e EngineLoad) Candidate {
	c.Engine = e
	return c
}

// Blocks a request shares with in-flight requests on a candidate are not charged
// again: a sibling of a burst costs only its own tail where its prefix is being
// prefilled, and the whole prompt elsewhere.
func TestSharedBlocksAreChargedOnce(t *testing.T) {
	cfg := DefaultConfig()
	req := &RouteRequest{PromptTokens: 1600, OutputTokens: 16, BlockSize: 16}
	hot := costCandidate("hot", 1600, 101, 100) // the first sibling: 100 blocks prefilling, 101 active
	hot.SharedActive, hot.SharedPrefill = 100, 100
	cold := costCandidate("cold", 0, 0, 0)
	cands := []Candidate{hot, cold}
	scoreKVAware(&cfg, req, cands)
	if cands[0].Cost >= cands[1].Cost {
		t.Fatalf("sibling cost on the worker prefilling its prefix %v >= on an idle worker %v (terms %+v / %+v)",
			cands[0].Cost, cands[1].Cost, cands[0].Terms, cands[1].Terms)
	}
	// Without the sharing (a different prompt), the busy worker is the worse choice.
	hot.SharedActive, hot.SharedPrefill, hot.Overlap = 0, 0, Overlap{}
	cands = []Candidate{hot, cold}
	scoreKVAware(&cfg, req, cands)
	if cands[0].Cost <= cands[1].Cost {
		t.Fatalf("an unrelated prompt costs %v on the busy worker, %v on the idle one", cands[0].Cost, cands[1].Cost)
	}
}

// The session bonus is soft: it decides between equals, not against load.
func TestSessionBonusIsSoft(t *testing.T) {
	cfg := DefaultConfig()
	req := &RouteRequest{PromptTokens: 1600, OutputTokens: 16, BlockSize: 16}
	bound, other := costCandidate("bound", 0, 0, 0), costCandidate("other", 0, 0, 0)
	bound.SessionBound = true
	cands := []Candidate{other, bound}
	if i := (&kvAware{cfg: cfg}).Pick(req, cands); cands[i].Worker.ID != "bound" {
		t.Errorf("between equals the session's worker lost")
	}
	busy := costCandidate("bound", 0, 500, 0)
	busy.SessionBound = true
	cands = []Candidate{other, busy}
	if i := (&kvAware{cfg: cfg}).Pick(req, cands); cands[i].Worker.ID != "other" {
		t.Errorf("the session pinned a request to a worker 500 decode blocks busier")
	}
}

// lmetric is uncached·(load+1), and a temperature samples lower costs more often
// but not only.
func TestLMetricAndTemperature(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Cost = CostLMetric
	req := &RouteRequest{PromptTokens: 1600, BlockSize: 16}
	a := costCandidate("a", 0, 0, 50) // 50 uncached, 1 in flight -> 100
	b := costCandidate("b", 0, 0, 0)  // 100 uncached, 1 in flight -> 200
	cands := []Candidate{a, b}
	scoreKVAware(&cfg, req, cands)
	if cands[0].Cost != 100 || cands[1].Cost != 200 {
		t.Fatalf("lmetric costs = %v, %v; want 100, 200", cands[0].Cost, cands[1].Cost)
	}
	cfg = DefaultConfig()
	cfg.Temperature = 0.5
	p := &kvAware{cfg: cfg}
	counts := map[string]int{}
	for range 4000 {
		cands := []Candidate{costCandidate("cheap", 0, 0, 80), costCandidate("dear", 0, 0, 0)}
		counts[cands[p.Pick(req, cands)].Worker.ID]++
	}
	// weights exp(0) : exp(-1/0.5) = 1 : 0.135 -> the dear one ~12% of the time.
	if counts["dear"] < 300 || counts["dear"] > 700 || counts["cheap"] < 3300 {
		t.Errorf("softmax picks %v, want about 88%% cheap and 12%% dear", fmt.Sprint(counts))
	}
}
