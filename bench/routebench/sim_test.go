package routebench

import (
	"math"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/kvindex/kvindex/bench/fakeengine"
	"github.com/kvindex/kvindex/bench/traces"
)

func smallConfig() Config {
	c := DefaultConfig()
	c.Offline = true
	c.Workers = 4
	c.Requests = 80
	c.GPUBlocks = 600 // small: eviction happens
	c.CPUBlocks = 300
	c.Progress, c.Plots = false, false
	return c
}

// TestOfflineConservesRequests: every request of the trace finishes exactly once,
// none fails, and each was handed to exactly one worker.
func TestOfflineConservesRequests(t *testing.T) {
	cases := []struct {
		trace, policy string
		delay         time.Duration
	}{
		{"chat", "kv-aware", 0},
		{"chat", "round-robin", 0},
		{"burst", "kv-aware", 0},
		{"agentic", "dynamo-approx", 0},
		{"document", "sglang-cache-aware", 0},
		{"shared-system", "llm-d-weighted", 50 * time.Millisecond},
		{"unique", "oracle", 0},
		{"chat", "session", 20 * time.Millisecond},
		{"agentic", "prefix-hash", 0},
		{"burst", "kv-aware-no-overlay", 0},
	}
	for _, c := range cases {
		t.Run(c.trace+"/"+c.policy, func(t *testing.T) {
			cfg := smallConfig()
			cfg.EventDelay = c.delay
			tr, err := traces.Open(c.trace, traces.Options{Seed: 5, Requests: cfg.Requests, Rate: 40}, false)
			if err != nil {
				t.Fatal(err)
			}
			spec, err := specFor(c.policy)
			if err != nil {
				t.Fatal(err)
			}
			s, err := newSimulator(&cfg, spec, tr)
			if err != nil {
				t.Fatal(err)
			}
			outs, err := s.run()
			if err != nil {
				t.Fatal(err)
			}
			for i, n := range s.done {
				if n != 1 {
					t.Fatalf("request %d finished %d times", i, n)
				}
				if outs[i].failed {
					t.Fatalf("request %d failed", i)
				}
				if outs[i].ttft <= 0 || outs[i].e2e < outs[i].ttft {
					t.Fatalf("request %d: ttft %v e2e %v", i, outs[i].ttft, outs[i].e2e)
				}
			}
			handed := 0
			for _, subs := range s.submissions {
				handed += len(subs)
			}
			if handed != len(tr.Requests) {
				t.Fatalf("%d requests handed to workers, trace has %d", handed, len(tr.Requests))
			}
			for w := range s.ranks {
				if !s.ranks[w].Idle() {
					t.Fatalf("worker %d still busy at the end", w)
				}
			}
		})
	}
}

// TestOfflineCachesEqualTheEngineModelAlone replays each worker's submissions, at
// the same virtual times, on a fresh engine model with nothing else around: its
// cache must end exactly as the simulated worker's did (the simulator drives the
// engine model and adds nothing to it).
func TestOfflineCachesEqualTheEngineModelAlone(t *testing.T) {
	// Eviction must happen in at least one run (round-robin, which has no random
	// choice, always spreads the trace enough); kv-aware may keep every worker's
	// cache below its size.
	evicted := false
	defer func() {
		if !evicted {
			t.Errorf("no worker filled its cache in any run: the test does not exercise eviction")
		}
	}()
	for _, policy := range []string{"kv-aware", "round-robin", "oracle"} {
		t.Run(policy, func(t *testing.T) {
			cfg := smallConfig()
			tr, err := traces.Open("agentic", traces.Options{Seed: 9, Requests: cfg.Requests, Rate: 30}, false)
			if err != nil {
				t.Fatal(err)
			}
			spec, _ := specFor(policy)
			s, err := newSimulator(&cfg, spec, tr)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.run(); err != nil {
				t.Fatal(err)
			}
			for w := range s.ranks {
				got := s.ranks[w].Blocks()
				want := replayAlone(t, &cfg, w, s.submissions[w])
				if !slices.EqualFunc(got, want, func(a, b fakeengine.CachedBlock) bool {
					return a.Hash == b.Hash && slices.Equal(a.Tiers, b.Tiers)
				}) {
					t.Fatalf("worker %d: simulated cache has %d blocks, the engine model alone %d", w, len(got), len(want))
				}
				evicted = evicted || len(got) >= cfg.GPUBlocks
			}
		})
	}
}

// replayAlone runs one engine model through subs on its own virtual clock, with
// the simulator's rule for ties (a step ending at an arrival's instant starts the
// next step first).
func replayAlone(t *testing.T, cfg *Config, w int, subs []submission) []fakeengine.CachedBlock {
	t.Helper()
	rk, err := fakeengine.NewSimRank(engineConfig(cfg, w), 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	stepEnd := time.Duration(-1)
	step := func(at time.Duration) {
		if d, _, ran := rk.Step(); ran {
			stepEnd = at + d
		} else {
			stepEnd = -1
		}
	}
	next := 0
	for next < len(subs) || stepEnd >= 0 {
		if stepEnd >= 0 && (next == len(subs) || stepEnd <= subs[next].At) {
			step(stepEnd)
			continue
		}
		sub := subs[next]
		next++
		rk.Advance(sub.At)
		if _, err := rk.Submit(sub.Req); err != nil {
			t.Fatal(err)
		}
		if stepEnd < 0 {
			step(sub.At)
		}
	}
	return rk.Blocks()
}

// TestOfflineRunRepeatsExactly: the simulator's figures depend only on the trace
// and --seed, including the policies' random choices (ties, sampling), so a run
// repeats to the last digit; another seed changes a random policy's choices.
// Only the measured wall-clock columns may differ.
func TestOfflineRunRepeatsExactly(t *testing.T) {
	simulated := func(r Row) Row {
		r.DecisionP50, r.DecisionP99, r.DecisionCPUP50, r.DecisionCPUP99, r.WallSeconds = 0, 0, 0, 0, 0
		if math.IsNaN(r.OracleHitRate) { // not computed here; NaN != NaN
			r.OracleHitRate = -1
		}
		if !math.IsNaN(r.IndexerCPUMs) {
			t.Errorf("an offline row with the indexer's CPU %v (no indexer runs)", r.IndexerCPUMs)
		}
		r.IndexerCPUMs = -1
		return r
	}
	run := func(t *testing.T, policy string, seed uint64) Row {
		cfg := smallConfig()
		cfg.Seed = seed
		return simulated(offlineRow(t, cfg, "burst", policy))
	}
	for _, policy := range []string{"random", "power-of-two", "least-loaded", "kv-aware"} {
		t.Run(policy, func(t *testing.T) {
			a, b := run(t, policy, 7), run(t, policy, 7)
			if !reflect.DeepEqual(a, b) {
				t.Errorf("two runs with seed 7 differ:\n%+v\n%+v", a, b)
			}
		})
	}
	if a, b := run(t, "random", 7), run(t, "random", 8); reflect.DeepEqual(a, b) {
		t.Errorf("seeds 7 and 8 gave the random policy the same run: the seed does not reach its choices")
	}
}

// testTrace opens trace with the tests' seed and rate (40/s) and cfg.Requests.
func testTrace(t *testing.T, cfg *Config, trace string) traces.Trace {
	t.Helper()
	tr, err := traces.Open(trace, traces.Options{Seed: 5, Requests: cfg.Requests, Rate: 40}, false)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// offlineRow runs policy on testTrace(trace) offline.
func offlineRow(t *testing.T, cfg Config, trace, policy string) Row {
	t.Helper()
	spec, err := specFor(policy)
	if err != nil {
		t.Fatal(err)
	}
	row, err := runOffline(&cfg, spec, testTrace(t, &cfg, trace), 40, func() {})
	if err != nil {
		t.Fatal(err)
	}
	return row
}

// testSim returns a simulator of policy on testTrace(trace), not yet run.
func testSim(t *testing.T, cfg *Config, trace, policy string) (*simulator, traces.Trace) {
	t.Helper()
	tr := testTrace(t, cfg, trace)
	spec, err := specFor(policy)
	if err != nil {
		t.Fatal(err)
	}
	s, err := newSimulator(cfg, spec, tr)
	if err != nil {
		t.Fatal(err)
	}
	return s, tr
}
