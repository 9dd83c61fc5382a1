package router

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/kvindex/kvindex/bench/fakeengine"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func completionBody(prompt string, maxTokens int) string {
	return fmt.Sprintf(`{"model":%q,"prompt":%s,"max_tokens":%d}`, testModel, quote(prompt), maxTokens)
}

// A request with a long prefix lands somewhere; a request sharing the prefix goes
// to the same worker (the engine reports the prefix as cached); with that
// worker's busy threshold reached, the next one goes elsewhere.
func TestKVAwareFollowsTheCachedPrefix(t *testing.T) {
	f := startFleet(t, 3, nil)
	ix := startIndexer(t, f)
	cfg := testConfig(t, f)
	cfg.Indexer = []string{ix.addr}
	cfg.IndexerTimeout = time.Second    // -race on busy cores; one missed 20 ms deadline routes 1 s without the index
	cfg.PredictedTTL = time.Millisecond // decisions must come from the index here
	cfg.MaxActiveDecodeBlocks = 150     // one long request in flight makes a worker busy
	rt := startRouter(t, cfg)

	prefix := words("shared-prefix", 300) // ~1000 tokens, ~250 blocks of 4
	first := rt.servedBy(t, f.ids, func() {
		if code, _, raw := post(t, rt.url, "/v1/completions", completionBody(prefix+" first question", 4)); code != http.StatusOK {
			t.Fatalf("first request: %d %s", code, raw)
		}
	})
	ix.caughtUp(t, f)
	available, captured := testutil.ToFloat64(rt.metrics.hitAvailable), testutil.ToFloat64(rt.metrics.hitCaptured)
	var c completion
	second := rt.servedBy(t, f.ids, func() {
		var code int
		var raw string
		if code, c, raw = post(t, rt.url, "/v1/completions", completionBody(prefix+" second question", 4)); code != http.StatusOK {
			t.Fatalf("second request: %d %s", code, raw)
		}
	})
	if second != first {
		t.Fatalf("a request sharing the prefix went to %s, want %s (which caches it)", second, first)
	}
	if cached := c.Usage.PromptTokensDetails.CachedTokens; cached < c.Usage.PromptTokens/2 {
		t.Fatalf("engine %s reports %d of %d prompt tokens cached; the prefix should be", first, cached, c.Usage.PromptTokens)
	}
	// The hit metrics: the best overlap on offer was the chosen worker's, and it
	// is no more than what the engine then found in its cache.
	available = testutil.ToFloat64(rt.metrics.hitAvailable) - available
	captured = testutil.ToFloat64(rt.metrics.hitCaptured) - captured
	if captured == 0 || captured != available || captured*4 > float64(c.Usage.PromptTokensDetails.CachedTokens) {
		t.Errorf("hit blocks captured %v of %v available for the second request, engine cached %d tokens (blocks of 4): want equal, nonzero, and within the engine's hit",
			captured, available, c.Usage.PromptTokensDetails.CachedTokens)
	}
	if n := rt.metrics.decisions.WithLabelValues(PolicyKVAware, string(SourceIndex)); testutil.ToFloat64(n) < 2 {
		t.Errorf("decisions from the index = %v, want both", testutil.ToFloat64(n))
	}

	// Make the cache holder busy: a request that hangs before its first token
	// keeps its blocks reserved there.
	if err := f.engines[first].SetFaults(fakeengine.Faults{FailStatus: 500, HangBeforeFirstToken: 3 * time.Second}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		postAside(t, rt.url, "/v1/completions", completionBody(prefix+" third question", 4))
	}()
	waitFor(t, 5*time.Second, "the hanging request to be reserved on "+first, func() bool {
		return rt.ledger.Load(Target{Worker: first}).InFlight == 1
	})
	fourth := rt.servedBy(t, f.ids, func() {
		if code, _, raw := post(t, rt.url, "/v1/completions", completionBody(prefix+" fourth question", 4)); code != http.StatusOK {
			t.Fatalf("fourth request: %d %s", code, raw)
		}
	})
	if fourth == first {
		t.Fatalf("with %s over --max-active-decode-blocks the request still went there", first)
	}
	if got := testutil.ToFloat64(rt.metrics.excluded.WithLabelValues(ExcludeBusy)); got < 1 {
		t.Errorf("busy exclusions = %v, want at least 1", got)
	}
	wg.Wait()
	rt.assertNoLoad(t, f.ids)
}

// A worker left out of one attempt's candidates (busy then, or tried) keeps
// its indexed overlap for the request's next attempt: the indexer is asked
// once per request, for every worker of the pool, not only for the first
// attempt's candidates.
func TestARetriedDecisionSeesTheOverlapOfAWorkerLeftOutBefore(t *testing.T) {
	f := startFleet(t, 3, nil)
	ix := startIndexer(t, f)
	cfg := testConfig(t, f)
	cfg.Indexer = []string{ix.addr}
	cfg.IndexerTimeout = time.Second
	cfg.PredictedTTL = time.Millisecond // overlaps must come from the index here
	rt := startRouter(t, cfg)
	prefix := words("retry-prefix", 300)
	holder := rt.servedBy(t, f.ids, func() {
		if code, _, raw := post(t, rt.url, "/v1/completions", completionBody(prefix+" first", 4)); code != http.StatusOK {
			t.Fatalf("first request: %d %s", code, raw)
		}
	})
	ix.caughtUp(t, f)
	time.Sleep(10 * time.Millisecond) // the first decision's prediction (1 ms) has expired

	p, err := rt.prepare(http.Header{}, "/v1/completions", endpointCompletions, []byte(completionBody(prefix+" second", 4)))
	if err != nil {
		t.Fatal(err)
	}
	d, err := rt.decide(context.Background(), p, map[string]bool{holder: true}, true)
	if err != nil {
		t.Fatal(err)
	}
	if d.Target.Worker == holder {
		t.Fatalf("the first attempt went to %s, which it had tried", holder)
	}
	d, err = rt.decide(context.Background(), p, map[string]bool{}, true)
	if err != nil {
		t.Fatal(err)
	}
	if d.Target.Worker != holder || d.Source != SourceIndex || d.Captured == 0 {
		t.Fatalf("the next attempt went to %s (source %s, %d blocks captured), want %s, which caches the prefix, from the index",
			d.Target.Worker, d.Source, d.Captured, holder)
	}
}

// Eight siblings of a cold burst (no engine has the prefix yet, the indexer knows
// nothing) land on one worker through the predicted overlay; with that worker
// busy they spread.
func TestColdBurstCoLocatesThroughThePredictedOverlay(t *testing.T) {
	for _, busy := range []bool{false, true} {
		t.Run(fmt.Sprintf("busy=%v", busy), func(t *testing.T) {
			f := startFleet(t, 4, func(_ int, c *fakeengine.Config) { c.Faults.HangBeforeFirstToken = 500 * time.Millisecond })
			cfg := testConfig(t, f) // no indexer: overlap can only come from the router's own decisions
			if busy {
				cfg.MaxPending = 2
			}
			rt := startRouter(t, cfg)
			prefix := words("burst-prefix", 300)
			var wg sync.WaitGroup
			start := make(chan struct{})
			for i := range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					if code, _, raw := postAside(t, rt.url, "/v1/completions", completionBody(fmt.Sprintf("%s sibling %d", prefix, i), 2)); code != http.StatusOK {
						t.Errorf("sibling %d: %d %s", i, code, raw)
					}
				}()
			}
			close(start)
			wg.Wait()
			used := 0
			for _, id := range f.ids {
				if rt.servedCount(id) > 0 {
					used++
				}
			}
			switch {
			case !busy && used != 1:
				t.Errorf("the burst went to %d workers, want 1", used)
			case busy && used < 4:
				t.Errorf("with --max-pending 2 the burst went to %d workers, want all 4", used)
			}
			if got := testutil.ToFloat64(rt.metrics.decisions.WithLabelValues(PolicyKVAware, string(SourcePredicted))); !busy && got < 7 {
				t.Errorf("decisions from the predicted overlay = %v, want at least 7", got)
			}
			rt.assertNoLoad(t, f.ids)
		})
	}
}
