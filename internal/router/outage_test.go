package router

import (
	"fmt"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// With the indexer gone no request fails: decisions come from the router's own
// approximate index (and the predicted overlay), conversations still find their
// worker; when the indexer is back, decisions come from it again by themselves.
func TestIndexerOutageFallsBackAndRecovers(t *testing.T) {
	f := startFleet(t, 3, nil)
	ix := startIndexer(t, f)
	cfg := testConfig(t, f)
	cfg.Indexer = []string{ix.addr}
	cfg.IndexerTimeout = 200 * time.Millisecond // generous under -race; the default is 20ms
	cfg.IndexerRetryAfter = 100 * time.Millisecond
	cfg.PredictedTTL = time.Millisecond // only the index or the approximate index may speak
	rt := startRouter(t, cfg)
	source := func(s Source) float64 {
		return testutil.ToFloat64(rt.metrics.decisions.WithLabelValues(PolicyKVAware, string(s)))
	}

	ask := func(prompt string) string {
		return rt.servedBy(t, f.ids, func() {
			if code, _, raw := post(t, rt.url, "/v1/completions", completionBody(prompt, 2)); code != http.StatusOK {
				t.Fatalf("%d %s", code, raw)
			}
		})
	}
	conv := words("conversation", 200)
	home := ask(conv + " turn 0")
	ix.caughtUp(t, f)
	if got := ask(conv + " turn 1"); got != home {
		t.Fatalf("with the indexer up, turn 1 went to %s, want %s", got, home)
	}
	if source(SourceIndex) < 2 {
		t.Fatalf("decisions from the index = %v, want 2", source(SourceIndex))
	}

	ix.stop()
	before := source(SourceApproximate) + source(SourcePredicted)
	indexedBefore := source(SourceIndex)
	for i := 2; i < 6; i++ {
		if got := ask(fmt.Sprintf("%s turn %d", conv, i)); got != home {
			t.Errorf("with the indexer down, turn %d went to %s, want %s (approximate index)", i, got, home)
		}
	}
	// A decision taken within --router-predicted-ttl of the one before is labelled
	// predicted; every other one must come from the approximate index.
	if got := source(SourceApproximate) + source(SourcePredicted) - before; got != 4 {
		t.Errorf("decisions from the router's own overlays while the indexer was down = %v, want all 4", got)
	}
	if source(SourceIndex) != indexedBefore {
		t.Errorf("decisions from the index grew from %v to %v with the indexer down", indexedBefore, source(SourceIndex))
	}
	if testutil.ToFloat64(rt.metrics.indexerUp) != 0 {
		t.Error("kvindex_router_indexer_up is 1 with the indexer down")
	}

	ix.start(t)
	ix.caughtUp(t, f)
	indexed := source(SourceIndex)
	waitFor(t, 30*time.Second, "decisions to come from the index again", func() bool {
		ask(conv + " turn again")
		return source(SourceIndex) > indexed
	})
	if testutil.ToFloat64(rt.metrics.indexerUp) != 1 {
		t.Error("kvindex_router_indexer_up is 0 after the indexer came back")
	}
	// ask stops the test at a failed request already; the counters must agree
	// (an upstream error is counted under the worker that failed it).
	for _, w := range append([]string{""}, f.ids...) {
		for _, result := range []string{resultUpstreamError, resultNoWorker, resultClientError} {
			if n := testutil.ToFloat64(rt.metrics.requests.WithLabelValues(PolicyKVAware, result, w)); n != 0 {
				t.Errorf("requests{result=%s,worker=%q} = %v, want 0", result, w, n)
			}
		}
	}
	rt.assertNoLoad(t, f.ids)
}

// --indexer is a cluster's member list, followed as the Go client does: a dead
// first member does not keep the router off the index.
func TestIndexerListSkipsADeadMember(t *testing.T) {
	f := startFleet(t, 3, nil)
	ix := startIndexer(t, f)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := l.Addr().String()
	l.Close()
	cfg := testConfig(t, f)
	cfg.Indexer = []string{dead, ix.addr}
	cfg.IndexerTimeout = time.Second // -race on busy cores
	cfg.IndexerRetryAfter = 100 * time.Millisecond
	cfg.PredictedTTL = time.Millisecond // only the index (or the approximate index) may speak
	rt := startRouter(t, cfg)
	fromIndex := func() float64 {
		return testutil.ToFloat64(rt.metrics.decisions.WithLabelValues(PolicyKVAware, string(SourceIndex)))
	}
	ask := func(prompt string) string {
		return rt.servedBy(t, f.ids, func() {
			if code, _, raw := post(t, rt.url, "/v1/completions", completionBody(prompt, 2)); code != http.StatusOK {
				t.Fatalf("%d %s", code, raw)
			}
		})
	}
	conv := words("members", 200)
	home := ask(conv + " turn 0")
	ix.caughtUp(t, f)
	for i := 1; ; i++ {
		before := fromIndex()
		got := ask(fmt.Sprintf("%s turn %d", conv, i))
		if fromIndex() > before {
			if got != home {
				t.Fatalf("turn %d, decided from the index, went to %s; the prefix is on %s", i, got, home)
			}
			break
		}
		if i == 50 {
			t.Fatal("50 requests and no decision came from the live member of the list")
		}
	}
	rt.assertNoLoad(t, f.ids)
}

// A slow indexer costs one request its deadline, not every request: a query
// that misses --indexer-timeout marks the indexer down for
// --indexer-retry-after, and meanwhile requests are routed on the router's own
// decisions without asking it. No request fails.
func TestSlowIndexerCostsOneQuery(t *testing.T) {
	f := startFleet(t, 3, nil)
	ix := startIndexer(t, f)
	cfg := testConfig(t, f)
	cfg.Indexer = []string{ix.addr}
	cfg.IndexerTimeout = time.Microsecond // no answer is ever in time
	cfg.IndexerRetryAfter = time.Hour
	rt := startRouter(t, cfg)
	conv := words("slow", 200)
	var home string
	for i := range 5 {
		got := rt.servedBy(t, f.ids, func() {
			if code, _, raw := post(t, rt.url, "/v1/completions", completionBody(fmt.Sprintf("%s turn %d", conv, i), 2)); code != http.StatusOK {
				t.Fatalf("turn %d: %d %s", i, code, raw)
			}
		})
		if i == 0 {
			home = got
		} else if got != home {
			t.Errorf("turn %d went to %s, turn 0 to %s: the router's own decisions should keep it there", i, got, home)
		}
	}
	if n := histogramCount(t, rt.metrics.indexerLatency.WithLabelValues("error").(prometheus.Histogram)); n != 1 {
		t.Errorf("%d indexer queries failed, want 1 (then the indexer is not asked for --indexer-retry-after)", n)
	}
	if n := histogramCount(t, rt.metrics.indexerLatency.WithLabelValues("ok").(prometheus.Histogram)); n != 0 {
		t.Errorf("%d indexer queries answered within 1µs", n)
	}
	if testutil.ToFloat64(rt.metrics.indexerUp) != 0 {
		t.Error("kvindex_router_indexer_up is 1 after a query missed its deadline")
	}
	if n := testutil.ToFloat64(rt.metrics.decisions.WithLabelValues(PolicyKVAware, string(SourceIndex))); n != 0 {
		t.Errorf("%v decisions from the index", n)
	}
	rt.assertNoLoad(t, f.ids)
}
