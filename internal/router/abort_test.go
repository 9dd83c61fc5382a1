package router

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvindex/kvindex/internal/workerspec"
)

// brokenBodyEngine answers every generation with a 200 whose JSON body breaks off
// after its first bytes, as an engine dying mid-answer does.
func brokenBodyEngine(t *testing.T) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == http.MethodGet && r.URL.Path == "/v1/models":
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"object":"list","data":[{"id":%q,"object":"model"}]}`, testModel)
		case r.Method == http.MethodPost && strings.HasPrefix(r.URL.Path, "/v1/"):
			io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Content-Length", "1000")
			w.WriteHeader(http.StatusOK)
			w.Write([]byte(`{"id":"cmpl-1","choices":[`))
			w.(http.Flusher).Flush()
			panic(http.ErrAbortHandler)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

// A non-streaming answer that breaks after its first bytes cannot be retried or
// repaired: the client's connection is aborted. The request's load must still be
// released and the failure must still reach the breaker and the metrics.
func TestBrokenNonStreamingAnswerReleasesLoadAndCountsAFailure(t *testing.T) {
	srv := brokenBodyEngine(t)
	cfg := DefaultConfig()
	cfg.Listen = "127.0.0.1:0"
	cfg.BlockSize = 4
	cfg.Workers = []workerspec.Spec{{ID: "bad", Model: testModel, HTTP: srv.URL}}
	rt := startRouter(t, cfg)
	for i := range 3 {
		resp, err := http.Post(rt.url+"/v1/completions", "application/json", strings.NewReader(completionBody(fmt.Sprintf("broken %d", i), 4)))
		if err == nil {
			_, err = io.ReadAll(resp.Body)
			resp.Body.Close()
		}
		if err == nil {
			t.Fatalf("request %d: the client got a complete answer from a broken body", i)
		}
	}
	waitFor(t, 5*time.Second, "the broken requests' load to be released", func() bool { return len(rt.ledger.Loads()) == 0 })
	rt.assertNoLoad(t, []string{"bad"})
	if got := testutil.ToFloat64(rt.metrics.requests.WithLabelValues(PolicyKVAware, resultUpstreamError, "bad")); got != 3 {
		t.Errorf("requests{result=upstream_error,worker=bad} = %v, want 3", got)
	}
	if got := testutil.ToFloat64(rt.metrics.breakerTrips.WithLabelValues("bad")); got != 1 {
		t.Errorf("breaker trips = %v after 3 broken answers, want 1", got)
	}
}
