package router

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvindex/kvindex/bench/fakeengine"
	"github.com/kvindex/kvindex/bench/fakeengine/fakeenginetest"
	"github.com/kvindex/kvindex/internal/ingest"
	"github.com/kvindex/kvindex/internal/server"
	"github.com/kvindex/kvindex/internal/tokenize"
	"github.com/kvindex/kvindex/internal/workerspec"
)

const testModel = "test/model"

// engineConfig is a fake engine for router tests: blocks of 4 tokens, room for
// a few long prompts, no sleeping.
func engineConfig() fakeengine.Config {
	c := fakeenginetest.Config()
	c.Model = testModel
	c.NumGPUBlocks = 512
	c.MaxModelLen = 8192
	return c
}

// fleet is a set of running fake engines by worker id.
type fleet struct {
	ids     []string
	engines map[string]*fakeengine.Engine
}

// startFleet starts n engines named w0..w(n-1); mutate may adjust engine i.
func startFleet(t testing.TB, n int, mutate func(i int, c *fakeengine.Config)) *fleet {
	t.Helper()
	f := &fleet{engines: map[string]*fakeengine.Engine{}}
	for i := range n {
		c := engineConfig()
		if mutate != nil {
			mutate(i, &c)
		}
		id := fmt.Sprintf("w%d", i)
		f.ids = append(f.ids, id)
		f.engines[id] = fakeenginetest.Start(t, c)
	}
	return f
}

// specs are the router's --worker values for the fleet.
func (f *fleet) specs(t testing.TB) []workerspec.Spec {
	t.Helper()
	var out []workerspec.Spec
	for _, id := range f.ids {
		e := f.engines[id]
		c := e.Config()
		s := workerspec.Spec{ID: id, Model: c.Model, BlockSize: c.BlockSize, DPSize: c.DataParallelSize, HTTP: e.URL(),
			Endpoint: e.EventEndpoints()[0], Replay: e.ReplayEndpoints()[0]}
		if c.Role != fakeengine.RoleBoth {
			s.Role = string(c.Role)
		}
		if err := s.Validate(); err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	return out
}

// indexer is an in-process indexer (a raft cluster of one) following a fleet.
type indexer struct {
	cfg  server.Config
	srv  *server.Server
	addr string
	stop func()
}

func startIndexer(t testing.TB, f *fleet) *indexer {
	t.Helper()
	return startIndexerWith(t, f, nil)
}

// startIndexerWith is startIndexer with configure adjusting the indexer's config.
func startIndexerWith(t testing.TB, f *fleet, configure func(*server.Config)) *indexer {
	t.Helper()
	cfg := server.DefaultConfig()
	cfg.NodeID = "router-test"
	cfg.DataDir = t.TempDir()
	cfg.HTTPAddr, cfg.GRPCAddr, cfg.Raft.RaftAddr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	cfg.Ingest.Workers = f.specs(t)
	cfg.Ingest.DefaultBlockSize = 4
	cfg.Ingest.PollInterval = 10 * time.Millisecond
	cfg.Ingest.IdleReplayInterval = 50 * time.Millisecond
	cfg.Tokenizers = tokenize.Specs{{Model: testModel, Dir: server.BuiltinTokenizer}}
	if configure != nil {
		configure(&cfg)
	}
	ix := &indexer{cfg: cfg}
	ix.start(t)
	return ix
}

// start runs the indexer from ix.cfg; after the first start it keeps the
// addresses it got, so a restarted indexer is where the router looks for it.
func (ix *indexer) start(t testing.TB) {
	t.Helper()
	srv, err := server.New(ix.cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	ix.cfg.HTTPAddr, ix.cfg.GRPCAddr, ix.cfg.Raft.RaftAddr = srv.HTTPAddr(), srv.GRPCAddr(), srv.RaftAddr()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	ix.srv, ix.addr = srv, srv.GRPCAddr()
	stopped := false
	ix.stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("indexer: %v", err)
		}
	}
	t.Cleanup(ix.stop)
	waitFor(t, 30*time.Second, "the indexer to become ready", func() bool {
		resp, err := http.Get("http://" + srv.HTTPAddr() + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

// caughtUp waits until the indexer applied every event batch the engines sent.
func (ix *indexer) caughtUp(t testing.TB, f *fleet) {
	t.Helper()
	for _, id := range f.ids {
		e := f.engines[id]
		if err := e.Flush(context.Background()); err != nil {
			t.Fatal(err)
		}
		for _, rt := range e.CacheTruth().Ranks {
			waitFor(t, 30*time.Second, fmt.Sprintf("the indexer to apply %s/%d seq %d", id, rt.DPRank, rt.LastSeq), func() bool {
				c, ok := ix.srv.Applier().Cursor(ingest.Stream{Worker: id, DPRank: rt.DPRank})
				return rt.LastSeq < 0 || ok && int64(c.Seq) >= rt.LastSeq
			})
		}
	}
}

// testRouter is a Router serving on a loopback port.
type testRouter struct {
	*Router
	url string
}

// testConfig is a router configuration over the fleet's workers.
func testConfig(t testing.TB, f *fleet) Config {
	cfg := DefaultConfig()
	cfg.Listen = "127.0.0.1:0"
	cfg.Workers = f.specs(t)
	cfg.BlockSize = 4
	cfg.WorkersRefresh = 100 * time.Millisecond
	cfg.LogLevel = "debug"
	return cfg
}

func startRouter(t testing.TB, cfg Config) *testRouter {
	t.Helper()
	return startRouterWith(t, cfg, nil)
}

// startRouterWith is startRouter with a hook that may adjust the Router (inject
// a fake clock, a discovery source) before it serves anything.
func startRouterWith(t testing.TB, cfg Config, adjust func(*Router)) *testRouter {
	t.Helper()
	r, err := New(cfg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	if adjust != nil {
		adjust(r)
	}
	l, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx, l) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("router: %v", err)
		}
	})
	return &testRouter{Router: r, url: "http://" + l.Addr().String()}
}

// testLogger writes the router's log to stderr when KVINDEX_TEST_LOG is set.
func testLogger(t testing.TB) *slog.Logger {
	if os.Getenv("KVINDEX_TEST_LOG") == "" {
		return nil
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("test", t.Name())
}

// completion is the part of an engine's answer the tests read.
type completion struct {
	Choices []struct {
		Text    string `json:"text"`
		Message struct {
			Content string `json:"content"`
		} `json:"message"`
	} `json:"choices"`
	Usage struct {
		PromptTokens        int `json:"prompt_tokens"`
		PromptTokensDetails struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
	KVTransferParams json.RawMessage `json:"kv_transfer_params"`
}

// writeWorkersFile writes path (atomically) as a workers file naming f's
// engines ids.
func writeWorkersFile(t *testing.T, f *fleet, path string, ids ...string) {
	t.Helper()
	var b strings.Builder
	b.WriteString("workers:\n")
	for _, id := range ids {
		fmt.Fprintf(&b, "  - {id: %s, model: %s, block-size: 4, http: %s}\n", id, testModel, f.engines[id].URL())
	}
	atomicWrite(t, path, b.String())
}

// post sends body to the router and returns the status, the decoded answer
// (when 200) and the raw body.
func post(t testing.TB, url, path, body string, header ...string) (int, completion, string) {
	t.Helper()
	code, c, raw, err := tryPost(url, path, body, header...)
	if err != nil {
		t.Fatal(err)
	}
	return code, c, raw
}

// postAside is post for a goroutine other than the test's, which must not call
// FailNow (the test would hang on what it waits for instead of failing): a
// failure is reported with t.Error, and the status is then 0.
func postAside(t testing.TB, url, path, body string, header ...string) (int, completion, string) {
	t.Helper()
	code, c, raw, err := tryPost(url, path, body, header...)
	if err != nil {
		t.Error(err)
	}
	return code, c, raw
}

// tryPost is post with its failure returned (status 0).
func tryPost(url, path, body string, header ...string) (int, completion, string, error) {
	resp, raw, err := trySend(url, path, body, header...)
	if err != nil {
		return 0, completion{}, "", err
	}
	var c completion
	if resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(raw, &c); err != nil {
			return 0, completion{}, string(raw), fmt.Errorf("answer %q: %w", raw, err)
		}
	}
	return resp.StatusCode, c, string(raw), nil
}

// send posts a JSON body with header's name/value pairs and returns the
// response (its body read and closed) and the body.
func send(t testing.TB, url, path, body string, header ...string) (*http.Response, []byte) {
	t.Helper()
	resp, raw, err := trySend(url, path, body, header...)
	if err != nil {
		t.Fatal(err)
	}
	return resp, raw
}

// trySend is send with its failure returned.
func trySend(url, path, body string, header ...string) (*http.Response, []byte, error) {
	req, err := http.NewRequest(http.MethodPost, url+path, strings.NewReader(body))
	if err != nil {
		return nil, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, nil, fmt.Errorf("reading the answer of %s: %w", path, err)
	}
	return resp, raw, nil
}

// sseEvents reads an SSE body into its data payloads.
func sseEvents(t testing.TB, r io.Reader) []string {
	t.Helper()
	var out []string
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			out = append(out, d)
		}
	}
	return out
}

// servedCount is how many requests the router counts as served by each worker
// with result ok.
func (r *testRouter) servedCount(worker string) int {
	return int(testutil.ToFloat64(r.metrics.requests.WithLabelValues(r.policy.Name(), resultOK, worker)))
}

// counted is how many requests the router counted (any result) on workers.
func (r *testRouter) counted(workers []string) int {
	n := 0
	for _, w := range workers {
		for _, result := range []string{resultOK, resultUpstreamError, resultClientError, resultCanceled} {
			n += int(testutil.ToFloat64(r.metrics.requests.WithLabelValues(r.policy.Name(), result, w)))
		}
	}
	return n
}

// servedBy runs fn and returns the worker whose ok count grew by one.
func (r *testRouter) servedBy(t testing.TB, workers []string, fn func()) string {
	t.Helper()
	before := map[string]int{}
	for _, w := range workers {
		before[w] = r.servedCount(w)
	}
	fn()
	got := ""
	for _, w := range workers {
		if d := r.servedCount(w) - before[w]; d == 1 {
			if got != "" {
				t.Fatalf("both %s and %s served the request", got, w)
			}
			got = w
		}
	}
	if got == "" {
		t.Fatal("no worker served the request")
	}
	return got
}

// assertNoLoad checks that the ledger and its gauges are back to zero.
func (r *testRouter) assertNoLoad(t testing.TB, workers []string) {
	t.Helper()
	waitFor(t, 10*time.Second, "every reservation to be released", func() bool { return len(r.ledger.Loads()) == 0 })
	for _, w := range workers {
		for name, g := range map[string]float64{
			"inflight":       testutil.ToFloat64(r.metrics.inflight.WithLabelValues(w, "local")),
			"prefill_tokens": testutil.ToFloat64(r.metrics.prefillTokens.WithLabelValues(w)),
			"decode_blocks":  testutil.ToFloat64(r.metrics.decodeBlocks.WithLabelValues(w)),
		} {
			if g != 0 {
				t.Errorf("gauge %s{worker=%s} = %v after every request ended, want 0", name, w, g)
			}
		}
	}
}

// waitFor polls cond every 10 ms until it holds or the deadline passes.
func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// words is a prompt of n distinct-ish words starting with a tag.
func words(tag string, n int) string {
	var b bytes.Buffer
	b.WriteString(tag)
	for i := range n {
		fmt.Fprintf(&b, " w%d", i%97)
	}
	return b.String()
}

func quote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
