package server

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	indexerv1 "github.com/kvindex/kvindex/api/proto/indexer/v1"
	kvindexv1 "github.com/kvindex/kvindex/api/proto/kvindex/v1"
	"github.com/kvindex/kvindex/bench/fakeengine"
	"github.com/kvindex/kvindex/bench/fakeengine/fakeenginetest"
	"github.com/kvindex/kvindex/internal/ingest"
	"github.com/kvindex/kvindex/internal/tokenize"
	"github.com/kvindex/kvindex/internal/workerspec"
)

// Health probing in tests: a death takes a few probes, well inside the polls'
// deadlines, and a healthy engine slowed down by -race on busy cores is never
// failing for that long (each probe may take up to maxHealthProbeTimeout). No
// test asserts how long anything took.
const (
	testDeadAfter      = 2 * time.Second
	testHealthInterval = 100 * time.Millisecond
)

func withHealth(c *Config) {
	c.WorkerDeadAfter, c.WorkerHealthInterval = testDeadAfter, testHealthInterval
}

// restartEngine closes e and starts a new engine process in its place: the
// same HTTP, PUB and replay addresses, an empty cache and a new event stream.
func restartEngine(t *testing.T, e *fakeengine.Engine) *fakeengine.Engine {
	t.Helper()
	cfg := e.Config()
	_, port, err := net.SplitHostPort(e.Addr())
	if err != nil {
		t.Fatal(err)
	}
	fmt.Sscan(port, &cfg.Port)
	portOf := func(ep string) string { return ep[strings.LastIndex(ep, ":")+1:] }
	cfg.KVEventsEndpoint = "tcp://*:" + portOf(e.EventEndpoints()[0])
	cfg.KVEventsReplayEndpoint = "tcp://*:" + portOf(e.ReplayEndpoints()[0])
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	// Not fakeenginetest.Start: it picks new ports for several dp ranks.
	ne, err := fakeengine.New(cfg, slog.New(slog.DiscardHandler))
	if err == nil {
		if err = ne.Start(); err != nil {
			ne.Close()
		}
	}
	if err != nil {
		t.Fatalf("restarting the engine on its addresses: %v", err)
	}
	t.Cleanup(func() { ne.Close() })
	return ne
}

// flakyHealth stands in front of an engine's /health: it fails the first
// `fail` probes with 503, then answers what the engine answers.
type flakyHealth struct {
	srv *httptest.Server

	mu        sync.Mutex
	fail      int // probes left to fail; guarded by mu
	failed    int // guarded by mu
	okAfter   int // probes passed through after the last failure; guarded by mu
	engineURL string
}

func newFlakyHealth(t *testing.T, engineURL string, fail int) *flakyHealth {
	h := &flakyHealth{fail: fail, engineURL: engineURL}
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/health" {
			http.NotFound(w, r)
			return
		}
		h.mu.Lock()
		if h.fail > 0 {
			h.fail--
			h.failed++
			h.mu.Unlock()
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		h.mu.Unlock()
		resp, err := http.Get(h.engineURL + "/health")
		if err != nil {
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		resp.Body.Close()
		h.mu.Lock()
		h.okAfter++
		h.mu.Unlock()
		w.WriteHeader(resp.StatusCode)
	}))
	t.Cleanup(h.srv.Close)
	return h
}

func (h *flakyHealth) counts() (failed, okAfter int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.failed, h.okAfter
}

// node is what the checks below need of one indexer: its Server and clients.
type probeNode struct {
	name  string
	srv   *Server
	index kvindexv1.IndexServiceClient
	llmd  indexerv1.IndexerServiceClient
}

func newProbeNode(t *testing.T, name string, srv *Server) probeNode {
	t.Helper()
	cc, err := grpc.NewClient(srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return probeNode{name: name, srv: srv, index: kvindexv1.NewIndexServiceClient(cc), llmd: indexerv1.NewIndexerServiceClient(cc)}
}

// workers returns GET /workers as (state, blocks) per worker id.
func (n probeNode) workers(t *testing.T) map[string]*kvindexv1.WorkerInfo {
	t.Helper()
	resp, err := n.index.Workers(context.Background(), &kvindexv1.WorkersRequest{})
	if err != nil {
		t.Fatalf("%s: Workers: %v", n.name, err)
	}
	out := map[string]*kvindexv1.WorkerInfo{}
	for _, w := range resp.Workers {
		out[w.Spec.Id] = w
	}
	return out
}

// waitState polls until worker's state on n satisfies ok.
func (n probeNode) waitState(t *testing.T, worker, want string, ok func(kvindexv1.WorkerState) bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		w := n.workers(t)[worker]
		if w != nil && ok(w.State) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: worker %s never became %s (now %v)", n.name, worker, want, w.GetState())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func isDead(s kvindexv1.WorkerState) bool { return s == kvindexv1.WorkerState_WORKER_STATE_DEAD }
func notDead(s kvindexv1.WorkerState) bool {
	return s != kvindexv1.WorkerState_WORKER_STATE_DEAD
}

// scores asks every scoring API of n about prompt (token ids; text for
// GetPodScores), without naming workers, and returns per API the matched
// blocks of each worker it lists.
func (n probeNode) scores(t *testing.T, prompt []uint32, text string) map[string]map[string]int {
	t.Helper()
	out := map[string]map[string]int{}
	sc, err := n.index.Score(context.Background(), &kvindexv1.ScoreRequest{Model: testModel, TokenIds: prompt})
	if err != nil {
		t.Fatalf("%s: Score: %v", n.name, err)
	}
	out["Score"] = map[string]int{}
	for _, s := range sc.Scores {
		out["Score"][s.Worker] = int(s.MatchedBlocks)
	}
	pods, err := n.llmd.GetPodScores(context.Background(), &indexerv1.GetPodScoresRequest{Prompt: text, ModelName: testModel})
	if err != nil {
		t.Fatalf("%s: GetPodScores: %v", n.name, err)
	}
	out["GetPodScores"] = map[string]int{}
	for _, p := range pods.Scores {
		out["GetPodScores"][p.Pod] = int(p.Score)
	}
	var hr hitRateResponse
	postTo(t, n.srv, "/kv-cache/hit-rate", map[string]any{"model": testModel, "token_ids": prompt}, &hr)
	out["hit-rate"] = map[string]int{}
	for _, p := range hr.Pods {
		out["hit-rate"][p.Pod] = p.MatchedBlocks
	}
	var mc map[string]map[string]struct {
		Longest int `json:"longest_matched"`
	}
	postTo(t, n.srv, "/query?format=mooncake", map[string]any{"model": testModel, "token_ids": prompt}, &mc)
	out["query"] = map[string]int{}
	for w, v := range mc["default"] {
		out["query"][w] = v.Longest / 4
	}
	return out
}

func postTo(t *testing.T, srv *Server, path string, body, into any) {
	t.Helper()
	code, data := httpDo(t, http.MethodPost, "http://"+srv.HTTPAddr()+path, body)
	if code != http.StatusOK {
		t.Fatalf("POST %s: %d %s", path, code, data)
	}
	if err := json.Unmarshal(data, into); err != nil {
		t.Fatalf("POST %s: %v in %s", path, err, data)
	}
}

// waitScored polls until every API of n scores worker with at least one block
// for prompt.
func (n probeNode) waitScored(t *testing.T, worker string, prompt []uint32, text string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		got := n.scores(t, prompt, text)
		missing := ""
		for api, byWorker := range got {
			if byWorker[worker] == 0 {
				missing = api
			}
		}
		if missing == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s never scored %s: %v", n.name, missing, worker, got)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// assertNotScored checks that no scoring API of n lists worker unnamed, and
// that named it scores zero.
func (n probeNode) assertNotScored(t *testing.T, worker string, prompt []uint32, text string) {
	t.Helper()
	for api, byWorker := range n.scores(t, prompt, text) {
		if v, listed := byWorker[worker]; listed {
			t.Errorf("%s: %s lists dead worker %s (%d blocks)", n.name, api, worker, v)
		}
	}
	sc, err := n.index.Score(context.Background(), &kvindexv1.ScoreRequest{Model: testModel, TokenIds: prompt, Workers: []string{worker}})
	if err != nil {
		t.Fatalf("%s: Score naming %s: %v", n.name, worker, err)
	}
	if len(sc.Scores) != 1 || sc.Scores[0].Worker != worker || sc.Scores[0].MatchedBlocks != 0 {
		t.Errorf("%s: Score naming dead worker %s = %v, want it with 0 blocks", n.name, worker, sc.Scores)
	}
}

// heldBlocks is what n's index holds for worker, over its ranks.
func heldBlocks(srv *Server, worker string, ranks uint32) int {
	n := 0
	for r := range ranks {
		n += srv.Index().HeldBlocks(ingest.Stream{Worker: worker, DPRank: r})
	}
	return n
}

// healthEngine starts an engine for the health tests and returns it with the
// worker spec to register (its http URL replaced by http, "" for none).
func healthEngine(t *testing.T, name string, dp int) (*fakeengine.Engine, workerspec.Spec) {
	t.Helper()
	e := startEngineFor(t, engineSpec{name: name, dp: dp, gpuBlocks: 256})
	return e, workerFlagFor(t, name, e)
}

// promptText is a prompt as text and as the builtin tokenizer's token ids
// (what the fake engine caches of it).
func promptText(t *testing.T, s string) (string, []uint32) {
	t.Helper()
	return s, tokenize.NewBuiltin().Encode(s, true)
}

// TestDeadWorker follows a killed engine on one indexer: once its health
// endpoint has failed for --worker-dead-after it is dead in /workers, the
// console and the metrics, its blocks are gone and no scoring API returns it;
// an engine without an http URL, killed at the same time, is never dead and
// keeps its blocks; one failed probe kills nobody. The engine restarted on the
// same addresses comes back as a fresh stream: live, scored, holding exactly
// what the new process caches, with no gap counted.
func TestDeadWorker(t *testing.T) {
	f := newFixture(t, fixtureOptions{engines: []engineSpec{}, configure: withHealth})
	node := newProbeNode(t, "node-a", f.srv)
	e0, s0 := healthEngine(t, "e0", 1) // killed, then restarted
	e1, s1 := healthEngine(t, "e1", 1) // one probe fails
	e2, s2 := healthEngine(t, "e2", 1) // no http URL, killed
	flaky := newFlakyHealth(t, e1.URL(), 1)
	s1.HTTP = flaky.srv.URL
	s2.HTTP = ""
	for _, s := range []workerspec.Spec{s0, s1, s2} {
		if _, err := f.admin.RegisterWorker(context.Background(), &kvindexv1.RegisterWorkerRequest{Worker: specProto(s)}); err != nil {
			t.Fatal(err)
		}
	}
	f.engines = map[string]*fakeengine.Engine{"e0": e0, "e1": e1, "e2": e2}
	oldText, oldPrompt := promptText(t, "the old process caches this prompt, block by block")
	for name := range f.engines {
		f.generate(name, 0, oldPrompt, "")
	}
	for name := range f.engines {
		node.waitScored(t, name, oldPrompt, oldText)
	}
	gapsBefore := labeled(t, f.srv, "kvindex_ingest_gaps_total", "worker", "e0")

	// One failed probe, and healthy ones after it: e1 lives.
	deadline := time.Now().Add(30 * time.Second)
	for failed, ok := flaky.counts(); failed < 1 || ok < 3; failed, ok = flaky.counts() {
		if time.Now().After(deadline) {
			t.Fatalf("the leader probed e1 %d times failed, %d ok after: want 1 and 3", failed, ok)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if st := node.workers(t)["e1"].State; isDead(st) {
		t.Fatalf("e1 is %v after one failed probe", st)
	}

	e0.Close()
	e2.Close()
	delete(f.engines, "e0")
	delete(f.engines, "e2")
	node.waitState(t, "e0", "dead", isDead)

	ws := node.workers(t)
	if got := ws["e0"]; got.GpuBlocks+got.CpuBlocks+got.DiskBlocks != 0 || heldBlocks(f.srv, "e0", 1) != 0 {
		t.Errorf("dead e0 still holds blocks: %v, index %d", got, heldBlocks(f.srv, "e0", 1))
	}
	// e0's death proves the probes ran past --worker-dead-after since both died.
	if isDead(ws["e2"].State) || heldBlocks(f.srv, "e2", 1) == 0 {
		t.Errorf("e2, without an http URL, is %v with %d blocks: want never dead, its blocks kept", ws["e2"].State, heldBlocks(f.srv, "e2", 1))
	}
	if isDead(ws["e1"].State) {
		t.Error("e1 died")
	}
	node.assertNotScored(t, "e0", oldPrompt, oldText)
	if code, body := f.get("/workers"); code != http.StatusOK || !strings.Contains(body, `"WORKER_STATE_DEAD"`) {
		t.Errorf("GET /workers = %d, want e0 as WORKER_STATE_DEAD: %s", code, body)
	}
	for _, w := range f.uiState().Workers {
		if (w.ID == "e0") != (w.State == "dead") {
			t.Errorf("console: %s is %q", w.ID, w.State)
		}
	}
	if got := labeled(t, f.srv, "kvindex_worker_dead", "worker", "e0"); got != 1 {
		t.Errorf("kvindex_worker_dead{worker=e0} = %v, want 1", got)
	}
	if got := counter(t, f.srv, "kvindex_worker_deaths_total"); got != 1 {
		t.Errorf("kvindex_worker_deaths_total = %v, want 1", got)
	}

	// Back on the same addresses: a new process, a new stream from seq 0.
	e0 = restartEngine(t, e0)
	f.engines["e0"] = e0
	// e2 stays down: unregister it so the index must equal the engines' caches.
	if _, err := f.admin.UnregisterWorker(context.Background(), &kvindexv1.UnregisterWorkerRequest{WorkerId: "e2"}); err != nil {
		t.Fatal(err)
	}
	newText, newPrompt := promptText(t, "a new process, a new prompt: nothing of the old one")
	f.generate("e0", 0, newPrompt, "")
	node.waitState(t, "e0", "live", func(s kvindexv1.WorkerState) bool { return s == kvindexv1.WorkerState_WORKER_STATE_LIVE })
	node.waitScored(t, "e0", newPrompt, newText)
	if got := node.scores(t, oldPrompt, oldText)["Score"]["e0"]; got != 0 {
		t.Errorf("restarted e0 scores %d blocks of the old process's prompt, want 0", got)
	}
	fakeenginetest.AssertIndexHoldsTruth(t, f.srv.Index(), f.engines)
	if got := labeled(t, f.srv, "kvindex_ingest_gaps_total", "worker", "e0"); got != gapsBefore {
		t.Errorf("gaps of e0 went from %v to %v: a fresh stream counts none", gapsBefore, got)
	}
	if got := labeled(t, f.srv, "kvindex_ingest_resets_total", "worker", "e0", "reason", "dead"); got != 1 {
		t.Errorf("kvindex_ingest_resets_total{worker=e0,reason=dead} = %v, want 1 (the fresh stream's start)", got)
	}
}

// TestDeadWorkerInCluster: on a 3-node cluster, only the leader probes, and
// every replica drops the dead worker's blocks, reports it dead and stops
// scoring it; restarted, it is scored again on every replica, each holding
// exactly what the new process caches.
func TestDeadWorkerInCluster(t *testing.T) {
	c := makeCluster(t, 3, withHealth)
	leader := c.leader(20 * time.Second)
	e0, s0 := healthEngine(t, "e0", 2)
	e1, s1 := healthEngine(t, "e1", 1)
	_, admin := dialNode(t, c.followers(leader)[0])
	ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+clusterToken)
	for _, s := range []workerspec.Spec{s0, s1} {
		if _, err := admin.RegisterWorker(ctx, &kvindexv1.RegisterWorkerRequest{Worker: specProto(s)}); err != nil {
			t.Fatal(err)
		}
	}
	var nodes []probeNode
	for _, cn := range c.nodes {
		nodes = append(nodes, newProbeNode(t, cn.id, cn.srv))
	}
	oldText, oldPrompt := promptText(t, "every replica holds this prompt of the first process")
	for _, e := range []*fakeengine.Engine{e0, e1} {
		for rank := range uint32(e.Config().DataParallelSize) {
			if _, err := e.Generate(context.Background(), fakeengine.Request{Prompt: oldPrompt, MaxTokens: 1, PinDPRank: true, DPRank: rank}); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, n := range nodes {
		n.waitScored(t, "e0", oldPrompt, oldText)
	}

	e0.Close()
	for _, n := range nodes {
		n.waitState(t, "e0", "dead", isDead)
	}
	for _, n := range nodes {
		if got := heldBlocks(n.srv, "e0", 2); got != 0 {
			t.Errorf("%s: dead e0 holds %d blocks", n.name, got)
		}
		if heldBlocks(n.srv, "e1", 1) == 0 || isDead(n.workers(t)["e1"].State) {
			t.Errorf("%s: e1 lost its blocks or died with e0", n.name)
		}
		n.assertNotScored(t, "e0", oldPrompt, oldText)
		// Followers that never led never probed.
		if labeled(t, n.srv, "kvindex_raft_leader_sessions_total") == 0 {
			if got := labeled(t, n.srv, "kvindex_worker_health_probes_total"); got != 0 {
				t.Errorf("%s never led but probed %v times", n.name, got)
			}
		}
	}

	e0 = restartEngine(t, e0)
	newText, newPrompt := promptText(t, "the second process of e0 caches only this")
	for rank := range uint32(2) {
		if _, err := e0.Generate(context.Background(), fakeengine.Request{Prompt: newPrompt, MaxTokens: 1, PinDPRank: true, DPRank: rank}); err != nil {
			t.Fatal(err)
		}
	}
	engines := map[string]*fakeengine.Engine{"e0": e0, "e1": e1}
	c.caughtUp(c.live(), lastSeqs(t, engines), 30*time.Second)
	for _, n := range nodes {
		n.waitState(t, "e0", "not dead", notDead)
		n.waitScored(t, "e0", newPrompt, newText)
		if got := n.scores(t, oldPrompt, oldText)["Score"]["e0"]; got != 0 {
			t.Errorf("%s: restarted e0 scores %d blocks of the old process's prompt, want 0", n.name, got)
		}
		fakeenginetest.AssertIndexHoldsTruth(t, n.srv.Index(), engines)
	}
	checkClusterDigests(t, c.live())
}
