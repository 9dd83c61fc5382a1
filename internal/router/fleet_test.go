package router

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	kvindexv1 "github.com/kvindex/kvindex/api/proto/kvindex/v1"
	"github.com/kvindex/kvindex/bench/fakeengine"
	kvindex "github.com/kvindex/kvindex/clients/go"
	"github.com/kvindex/kvindex/internal/workerspec"
)

// The workers file is re-read when it changes: a worker added there takes
// requests, one removed stops taking them, and a broken file keeps the last list.
func TestWorkersFileIsReloaded(t *testing.T) {
	f := startFleet(t, 2, nil)
	path := filepath.Join(t.TempDir(), "workers.yaml")
	write := func(ids ...string) { writeWorkersFile(t, f, path, ids...) }
	write("w0")
	cfg := testConfig(t, f)
	cfg.Workers = nil
	cfg.WorkersFile = path
	cfg.Policy = PolicyRoundRobin
	rt := startRouter(t, cfg)
	ids := func() []string {
		var out []string
		for _, w := range rt.fleet.Workers() {
			out = append(out, w.ID)
		}
		return out
	}
	waitFor(t, 10*time.Second, "w0 from the file", func() bool { return slices.Equal(ids(), []string{"w0"}) })
	write("w0", "w1")
	waitFor(t, 10*time.Second, "w1 added", func() bool { return slices.Equal(ids(), []string{"w0", "w1"}) })
	for range 4 {
		if code, _, raw := post(t, rt.url, "/v1/completions", completionBody("hello file", 1)); code != http.StatusOK {
			t.Fatalf("%d %s", code, raw)
		}
	}
	if rt.servedCount("w1") != 2 {
		t.Errorf("w1 served %d of 4 round-robin requests after it was added, want 2", rt.servedCount("w1"))
	}
	atomicWrite(t, path, "workers: [{id: broken")
	time.Sleep(3 * cfg.WorkersRefresh)
	atomicWrite(t, path, "")           // an empty file is a half-written one: ignored
	time.Sleep(3 * cfg.WorkersRefresh) // a broken file must not change anything
	if !slices.Equal(ids(), []string{"w0", "w1"}) {
		t.Fatalf("after a broken file the workers are %v, want the last good list", ids())
	}
	write("w1")
	waitFor(t, 10*time.Second, "w0 removed", func() bool { return slices.Equal(ids(), []string{"w1"}) })
}

// --workers-from-indexer follows the indexer's registry: a worker registered
// there becomes routable, one unregistered goes.
func TestWorkersFromIndexerFollowTheRegistry(t *testing.T) {
	f := startFleet(t, 2, nil)
	one := &fleet{ids: []string{"w0"}, engines: map[string]*fakeengine.Engine{"w0": f.engines["w0"]}}
	ix := startIndexer(t, one)
	cfg := testConfig(t, f)
	cfg.Workers = nil
	cfg.Indexer = []string{ix.addr}
	cfg.WorkersFromIndexer = true
	rt := startRouter(t, cfg)
	has := func(id string) bool { return rt.fleet.View().byID[id] != nil }
	waitFor(t, 10*time.Second, "w0 from the registry", func() bool { return has("w0") })

	c, err := kvindex.New(kvindex.Options{Addrs: []string{ix.addr}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	e := f.engines["w1"]
	ctx := context.Background()
	spec := &kvindexv1.WorkerSpec{Id: "w1", Model: testModel, BlockSize: 4, HttpEndpoint: e.URL(),
		EventsEndpoint: e.EventEndpoints()[0], ReplayEndpoint: e.ReplayEndpoints()[0]}
	if _, err := c.RegisterWorker(ctx, spec); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "w1 registered", func() bool { return has("w1") })
	if _, err := c.UnregisterWorker(ctx, "w1"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "w1 unregistered", func() bool { return !has("w1") })
}

// LoRA adapters an engine lists in /v1/models are routable models of that engine
// only, and the router's /v1/models is the union.
func TestLoRAAdaptersFromTheEnginesModels(t *testing.T) {
	f := startFleet(t, 2, func(i int, c *fakeengine.Config) {
		if i == 1 {
			c.LoRAModules = []string{"sql-adapter"}
		}
	})
	rt := startRouter(t, testConfig(t, f))
	waitFor(t, 10*time.Second, "the adapter to be learned", func() bool {
		_, ok := rt.fleet.View().byID["w1"].Serves("sql-adapter")
		return ok
	})
	for range 3 {
		got := rt.servedBy(t, f.ids, func() {
			body := fmt.Sprintf(`{"model":"sql-adapter","prompt":%s,"max_tokens":1}`, quote(words("lora", 20)))
			if code, _, raw := post(t, rt.url, "/v1/completions", body); code != http.StatusOK {
				t.Fatalf("%d %s", code, raw)
			}
		})
		if got != "w1" {
			t.Fatalf("a request for the adapter went to %s, which does not serve it", got)
		}
	}
	resp, err := http.Get(rt.url + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var list modelList
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range list.Data {
		names = append(names, m.ID)
	}
	slices.Sort(names)
	if !slices.Equal(names, []string{"sql-adapter", testModel}) {
		t.Errorf("/v1/models = %v, want the base model and the adapter", names)
	}
}

// Other /v1/* POSTs go to a worker of the request's model, chosen by load: with
// a request in flight on one of the model's two workers, they go to the other.
func TestOtherOpenAIPostsAreForwarded(t *testing.T) {
	const modelB = "test/model-b"
	f := startFleet(t, 3, func(i int, c *fakeengine.Config) {
		if i == 2 {
			c.Model = modelB
		}
	})
	rt := startRouter(t, testConfig(t, f))
	embed := func(model string) string {
		t.Helper()
		// The fake engine serves no /v1/embeddings: its own 404 relayed proves
		// the path and body reached it.
		resp, err := http.Post(rt.url+"/v1/embeddings", "application/json", strings.NewReader(`{"model":"`+model+`","input":"x"}`))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound && resp.StatusCode != http.StatusMethodNotAllowed {
			t.Fatalf("/v1/embeddings: %d %s, want the engine's own 404/405 relayed", resp.StatusCode, body)
		}
		return resp.Header.Get(HeaderServedBy)
	}
	for range 3 {
		if got := embed(modelB); got != "w2" {
			t.Fatalf("/v1/embeddings for %s went to %q, its only worker is w2", modelB, got)
		}
	}

	// A completion hangs on one of test/model's workers; embeddings go to the other.
	for _, id := range []string{"w0", "w1"} {
		if err := f.engines[id].SetFaults(fakeengine.Faults{FailStatus: 500, HangBeforeFirstToken: 3 * time.Second}); err != nil {
			t.Fatal(err)
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		postAside(t, rt.url, "/v1/completions", completionBody(words("busy", 40), 2))
	}()
	busy := ""
	waitFor(t, 10*time.Second, "the completion to be in flight", func() bool {
		for _, id := range []string{"w0", "w1"} {
			if rt.ledger.Load(Target{Worker: id}).InFlight == 1 {
				busy = id
			}
		}
		return busy != ""
	})
	for range 6 { // a load-blind pick would pass 6 times in a row once in 64
		if got := embed(testModel); got == busy || got == "w2" {
			t.Fatalf("/v1/embeddings for %s went to %q while %s had a request in flight", testModel, got, busy)
		}
	}
	<-done
	rt.assertNoLoad(t, f.ids)
}

// With --scrape-engine-metrics the engines' own queue lengths count as load.
func TestEngineMetricsAreScraped(t *testing.T) {
	f := startFleet(t, 2, func(i int, c *fakeengine.Config) {
		if i == 0 {
			c.Faults.HangBeforeFirstToken = 0
			c.TimeScale = 0.05
		}
	})
	cfg := testConfig(t, f)
	cfg.ScrapeEngineMetrics = true
	cfg.ScrapeInterval = 20 * time.Millisecond
	cfg.Policy = PolicyLeastLoaded
	rt := startRouter(t, cfg)
	// Load w0 behind the router's back: requests sent straight to the engine,
	// long enough to outlast the test (they end with it).
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for range 3 {
		go func() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, f.engines["w0"].URL()+"/v1/completions",
				strings.NewReader(completionBody(words("direct", 20), 1000)))
			if resp, err := http.DefaultClient.Do(req); err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}
	waitFor(t, 10*time.Second, "the scrape to see w0's requests", func() bool {
		l := rt.engineLoad(Target{Worker: "w0"})
		return l.Running+l.Waiting >= 3 && l.KVUsage > 0
	})
	if l, want := rt.engineLoad(Target{Worker: "w0"}), f.engines["w0"].Config().NumGPUBlocks; l.GPUBlocks != want {
		t.Errorf("scraped capacity %d GPU blocks, the engine has %d", l.GPUBlocks, want)
	}
	// /debug/route shows what the engines report, and kv-aware's decode term
	// counts the blocks w0's engine holds for requests the router never saw.
	cfg.Policy = PolicyKVAware
	kv := startRouter(t, cfg)
	waitFor(t, 10*time.Second, "the second router's scrape", func() bool { return kv.engineLoad(Target{Worker: "w0"}).KVUsage > 0 })
	byWorker := map[string]candidateJSON{}
	for _, c := range dryRun(t, kv.url, completionBody("scraped", 1)).Candidates {
		byWorker[c.Worker] = c
	}
	w0, w1 := byWorker["w0"], byWorker["w1"]
	if w0.EngineRunning+w0.EngineWaiting < 3 || w0.EngineKVUsage <= 0 || w0.InFlight < 3 || w0.EngineGPUBlocks <= 0 {
		t.Errorf("w0 as /debug/route shows it: %+v; its engine runs 3 requests", w0)
	}
	if w1.EngineKVUsage != 0 || w1.Decode != 0 || w0.Decode != 0 {
		t.Fatalf("w1 %+v should be idle and the router should have no request on w0 %+v", w1, w0)
	}
	if got, want := w0.Terms.ActiveDecodeBlocks-w1.Terms.ActiveDecodeBlocks, math.Ceil(w0.EngineKVUsage*float64(w0.EngineGPUBlocks)); got != want {
		t.Errorf("w0's decode term exceeds idle w1's by %v blocks, want the engine's %v (usage %v of %d)", got, want, w0.EngineKVUsage, w0.EngineGPUBlocks)
	}
	for range 3 {
		if got := rt.servedBy(t, f.ids, func() { post(t, rt.url, "/v1/completions", completionBody("scraped", 1)) }); got != "w1" {
			t.Fatalf("least-loaded sent a request to %s, whose engine reports 3 requests running", got)
		}
	}
}

// SIGTERM (the context ending) lets an in-flight stream finish.
func TestShutdownDrainsInFlightStreams(t *testing.T) {
	f := startFleet(t, 1, func(_ int, c *fakeengine.Config) { c.TimeScale = 0.05 })
	cfg := testConfig(t, f)
	r, err := New(cfg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx, l) }()
	resp, err := http.Post("http://"+l.Addr().String()+"/v1/completions", "application/json", strings.NewReader(streamBody(words("drain", 20), 30)))
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1)
	if _, err := resp.Body.Read(buf); err != nil {
		t.Fatal(err)
	}
	cancel() // the stream has started: shutdown must wait for it
	events := sseEvents(t, io.MultiReader(strings.NewReader(string(buf)), resp.Body))
	resp.Body.Close()
	if len(events) == 0 || events[len(events)-1] != "[DONE]" {
		t.Fatalf("the stream was cut by shutdown: %d events, last %q", len(events), events[len(events)-1:])
	}
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if got := testutil.ToFloat64(r.metrics.requests.WithLabelValues(PolicyKVAware, resultOK, "w0")); got != 1 {
		t.Errorf("requests ok = %v, want 1", got)
	}
}

// atomicWrite replaces path's content in one step (as Kubernetes updates a
// mounted ConfigMap), so the router never reads a half-written file.
func atomicWrite(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// The fleet announces a change (onChange, which wakes the admission queue) and
// bumps its version only when its workers change: a registry poll or a workers
// file that brings the same list does neither.
func TestFleetAnnouncesOnlyChanges(t *testing.T) {
	f := newFleet(nil, 4, nil)
	changes := 0
	f.onChange = func() { changes++ }
	spec := func(id string) workerspec.Spec {
		return workerspec.Spec{ID: id, Model: testModel, HTTP: "http://" + id + ":8000"}
	}
	for _, step := range []struct {
		what string
		do   func()
		want int
	}{
		{"a worker joins", func() { f.setRegistry([]workerspec.Spec{spec("w0")}) }, 1},
		{"the same registry again", func() { f.setRegistry([]workerspec.Spec{spec("w0")}) }, 0},
		{"the file names the same worker", func() { f.setFile([]workerspec.Spec{spec("w0")}) }, 0},
		{"its first adapters poll", func() { f.setAdapters(map[string]map[string]bool{"w0": {}}) }, 1},
		{"the same adapters", func() { f.setAdapters(map[string]map[string]bool{"w0": {}}) }, 0},
		{"a new adapter", func() { f.setAdapters(map[string]map[string]bool{"w0": {"sql": true}}) }, 1},
		{"a second worker", func() { f.setKube([]workerspec.Spec{spec("w1")}) }, 1},
		{"a worker leaves", func() { f.setKube(nil) }, 1},
	} {
		before, version := changes, f.View().version
		step.do()
		if got, bumped := changes-before, f.View().version != version; got != step.want || bumped != (step.want > 0) {
			t.Fatalf("%s: %d announcements, version bumped %v; want %d and %v", step.what, got, bumped, step.want, step.want > 0)
		}
	}
}
