package server

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	dto "github.com/prometheus/client_model/go"

	kvindexv1 "github.com/kvindex/kvindex/api/proto/kvindex/v1"
	"github.com/kvindex/kvindex/bench/fakeengine"
	"github.com/kvindex/kvindex/bench/fakeengine/fakeenginetest"
	"github.com/kvindex/kvindex/internal/ingest"
)

// clusterToken is the admin token of test clusters: forwarded writes must carry it.
const clusterToken = "cluster-secret"

// clusterNode is one indexer of an in-process test cluster: a real Server with
// real gRPC, HTTP and raft TCP listeners on loopback and a data dir of its own.
type clusterNode struct {
	id   string
	cfg  Config // the ports are pinned after the first start, for restarts
	srv  *Server
	stop func() error // ends Run and returns its error
}

type testCluster struct {
	t     *testing.T
	nodes []*clusterNode
}

// clusterLogger discards logs unless KVINDEX_TEST_LOG is set.
func clusterLogger() *slog.Logger {
	if os.Getenv("KVINDEX_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	// Not nil: New defaults a nil logger, but a part built directly
	// (newLoadLedger) would panic on its first log line.
	return slog.New(slog.DiscardHandler)
}

// makeCluster starts n servers: node-0 bootstraps, node-1 joins through node-0
// and every later node through the node before it (a follower, which forwards
// the join to the leader). configure, when set, adjusts each node's Config. It
// returns once every node is a voter and ready.
func makeCluster(t *testing.T, n int, configure func(*Config)) *testCluster {
	t.Helper()
	c := newTestCluster(t)
	for i := range n {
		cfg := clusterConfig(t, i)
		if i > 0 {
			cfg.Join = c.nodes[i-1].srv.GRPCAddr()
		}
		if configure != nil {
			configure(&cfg)
		}
		cn := &clusterNode{id: cfg.NodeID, cfg: cfg}
		c.nodes = append(c.nodes, cn)
		c.start(cn)
		if i == 0 {
			c.waitReady(cn, 20*time.Second)
		}
	}
	c.waitFormed(30 * time.Second)
	return c
}

// newTestCluster is an empty test cluster whose nodes stop when t ends.
func newTestCluster(t *testing.T) *testCluster {
	c := &testCluster{t: t}
	t.Cleanup(func() {
		for _, cn := range c.nodes {
			if cn.srv != nil {
				if err := cn.stop(); err != nil {
					t.Errorf("%s: Run: %v", cn.id, err)
				}
			}
		}
	})
	return c
}

// clusterConfig is the config of test cluster node i ("node-<i>"), alone.
func clusterConfig(t *testing.T, i int) Config {
	cfg := testConfig(t)
	cfg.NodeID = fmt.Sprintf("node-%d", i)
	cfg.AdminToken = clusterToken
	// Timeouts that survive -race on two busy cores without spurious elections.
	cfg.Raft.HeartbeatTimeout = 400 * time.Millisecond
	cfg.Raft.ElectionTimeout = 400 * time.Millisecond
	cfg.Raft.LeaderLeaseTimeout = 300 * time.Millisecond
	cfg.Raft.CommitTimeout = 20 * time.Millisecond
	cfg.Ingest.ReplayTimeout = time.Second
	return cfg
}

// waitFormed waits until every node of c sees all of them as voters and is ready.
func (c *testCluster) waitFormed(timeout time.Duration) {
	c.t.Helper()
	t, n := c.t, len(c.nodes)
	deadline := time.Now().Add(timeout)
	for _, cn := range c.nodes {
		for {
			st, err := cn.srv.node.Cluster()
			voters := 0
			for _, m := range st.Members {
				if m.Suffrage == "voter" {
					voters++
				}
			}
			if err == nil && voters == n && cn.srv.backend.Ready() == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: cluster never formed: %+v, %v, ready: %v", cn.id, st, err, cn.srv.backend.Ready())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// start runs cn's server from its config (and data dir).
func (c *testCluster) start(cn *clusterNode) {
	c.t.Helper()
	srv, err := New(cn.cfg, clusterLogger())
	if err != nil {
		c.t.Fatalf("%s: %v", cn.id, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	cn.srv = srv
	cn.stop = func() error {
		cancel()
		select {
		case err := <-done:
			return err
		case <-time.After(20 * time.Second):
			return fmt.Errorf("%s did not stop", cn.id)
		}
	}
	cn.cfg.HTTPAddr, cn.cfg.GRPCAddr, cn.cfg.Raft.RaftAddr = srv.HTTPAddr(), srv.GRPCAddr(), srv.RaftAddr()
}

// kill stops cn as a crash would (raft's transport drops first, no leadership
// transfer), then lets its Run return.
func (c *testCluster) kill(cn *clusterNode) {
	cn.srv.node.Kill()
	cn.stop() // Run reports the node's death: expected
	cn.srv = nil
}

func (c *testCluster) live() []*clusterNode {
	var out []*clusterNode
	for _, cn := range c.nodes {
		if cn.srv != nil {
			out = append(out, cn)
		}
	}
	return out
}

// leader waits until one live node leads with its ingest running.
func (c *testCluster) leader(timeout time.Duration) *clusterNode {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		for _, cn := range c.live() {
			if cn.srv.node.IsLeader() && cn.srv.ingest.Running() {
				return cn
			}
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("no leader within %v", timeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (c *testCluster) followers(leader *clusterNode) []*clusterNode {
	return slices.DeleteFunc(c.live(), func(cn *clusterNode) bool { return cn == leader })
}

func (c *testCluster) waitReady(cn *clusterNode, timeout time.Duration) {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	for cn.srv.backend.Ready() != nil {
		if time.Now().After(deadline) {
			c.t.Fatalf("%s never became ready: %v", cn.id, cn.srv.backend.Ready())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// caughtUp waits until every given node has applied each stream up to last
// and all of them are at the same applied index.
func (c *testCluster) caughtUp(nodes []*clusterNode, last map[ingest.Stream]uint64, timeout time.Duration) {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		behind := ""
		var applied []uint64
		for _, cn := range nodes {
			for s, seq := range last {
				if cur, ok := cn.srv.Applier().Cursor(s); !ok || cur.Seq < seq {
					behind = fmt.Sprintf("%s: stream %v at %+v, want seq %d", cn.id, s, cur, seq)
				}
			}
			applied = append(applied, cn.srv.backend.AppliedIndex())
		}
		if behind == "" && slices.Min(applied) == slices.Max(applied) {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("replicas never caught up: %s; applied indexes %v", behind, applied)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// clusterEngine is a fake engine with a replay socket and caches small enough
// for the traffic to evict.
func clusterEngine(t *testing.T, name string, dp int) *fakeengine.Engine {
	return startEngineFor(t, engineSpec{name: name, dp: dp, gpuBlocks: 48, cpuBlocks: 24})
}

// lastSeqs flushes the engines and returns each stream's last published seq.
func lastSeqs(t *testing.T, engines map[string]*fakeengine.Engine) map[ingest.Stream]uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out := map[ingest.Stream]uint64{}
	for name, e := range engines {
		if err := e.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		for _, rk := range e.CacheTruth().Ranks {
			out[ingest.Stream{Worker: name, DPRank: rk.DPRank}] = uint64(rk.LastSeq)
		}
	}
	return out
}

// handshake resets the engines' caches until leader follows each of their
// streams. Until a stream is followed, what its engine publishes reaches the
// index only through replay; a cache reset publishes AllBlocksCleared, so from
// a stream's first applied batch on, index and engine agree.
func handshake(t *testing.T, leader *clusterNode, engines map[string]*fakeengine.Engine) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		for _, e := range engines {
			if err := e.ResetPrefixCache(); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(20 * time.Millisecond)
		followed := true
		for s := range lastSeqs(t, engines) {
			if _, ok := leader.srv.Applier().Cursor(s); !ok {
				followed = false
			}
		}
		if followed {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the leader %s never followed every stream", leader.id)
		}
	}
}

// engineLoad sends requests to every engine from a few goroutines each until
// stopped: prompts that share system prefixes and extend earlier ones, so that
// blocks are reused and evicted. It keeps the prompts for later queries.
type engineLoad struct {
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	mu       sync.Mutex
	prompts  [][]uint32 // guarded by mu
	requests int        // guarded by mu
	errs     []error    // guarded by mu
}

func startLoad(engines map[string]*fakeengine.Engine, seed uint64) *engineLoad {
	ctx, cancel := context.WithCancel(context.Background())
	l := &engineLoad{cancel: cancel}
	i := uint64(0)
	for _, e := range engines {
		for range 2 {
			i++
			rng := rand.New(rand.NewPCG(seed, i))
			l.wg.Add(1)
			go func() {
				defer l.wg.Done()
				l.run(ctx, e, rng)
			}()
		}
	}
	return l
}

func (l *engineLoad) run(ctx context.Context, e *fakeengine.Engine, rng *rand.Rand) {
	systems := [][]uint32{tokens(0, 12), tokens(30, 16), tokens(60, 9)}
	var history [][]uint32
	for ctx.Err() == nil {
		var prompt []uint32
		if len(history) > 0 && rng.IntN(3) == 0 {
			prompt = concat(history[rng.IntN(len(history))], tokens(rng.IntN(200), 3+rng.IntN(8)))
		} else {
			prompt = concat(systems[rng.IntN(len(systems))], tokens(rng.IntN(200), 2+rng.IntN(16)))
		}
		prompt = prompt[:min(len(prompt), 60)]
		history = append(history, prompt)
		if len(history) > 40 {
			history = history[1:]
		}
		_, err := e.Generate(ctx, fakeengine.Request{Prompt: prompt, MaxTokens: 1 + rng.IntN(3)})
		l.mu.Lock()
		l.requests++
		l.prompts = append(l.prompts, prompt)
		if err != nil && ctx.Err() == nil {
			l.errs = append(l.errs, err)
		}
		l.mu.Unlock()
		time.Sleep(time.Millisecond)
	}
}

func (l *engineLoad) stop(t *testing.T) {
	l.cancel()
	l.wg.Wait()
	for _, err := range l.errs {
		t.Errorf("traffic: %v", err)
	}
}

// counter reads a counter of srv's metrics registry.
func counter(t *testing.T, srv *Server, name string) float64 {
	t.Helper()
	families, err := srv.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == name && len(f.Metric) == 1 {
			return f.Metric[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("no counter %s", name)
	return 0
}

// labeled sums the series of a counter or gauge of srv whose labels include
// the given name, value pairs (every series when none is given; 0 when none
// matches).
func labeled(t *testing.T, srv *Server, name string, labels ...string) float64 {
	t.Helper()
	families, err := srv.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	series:
		for _, m := range f.Metric {
			for i := 0; i+1 < len(labels); i += 2 {
				if !slices.ContainsFunc(m.Label, func(l *dto.LabelPair) bool { return l.GetName() == labels[i] && l.GetValue() == labels[i+1] }) {
					continue series
				}
			}
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue() // a series is one or the other
		}
	}
	return sum
}

func httpDo(t *testing.T, method, url string, body any) (int, []byte) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		data, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(data)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+clusterToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, data
}

func dialNode(t *testing.T, cn *clusterNode) (kvindexv1.IndexServiceClient, kvindexv1.AdminServiceClient) {
	t.Helper()
	cc, err := grpc.NewClient(cn.srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return kvindexv1.NewIndexServiceClient(cc), kvindexv1.NewAdminServiceClient(cc)
}

// checkReplicas checks, once every live node is caught up with the engines,
// that all hold the same index, equal to what the engines cache, and that Score
// answers the same on every replica at the same applied index.
func checkReplicas(t *testing.T, c *testCluster, engines map[string]*fakeengine.Engine, prompts [][]uint32) {
	t.Helper()
	live := c.live()
	c.caughtUp(live, lastSeqs(t, engines), 60*time.Second)
	digest := live[0].srv.Index().Digest()
	for _, cn := range live[1:] {
		if d := cn.srv.Index().Digest(); d != digest {
			t.Errorf("%s's index digest differs from %s's", cn.id, live[0].id)
		}
	}
	compared := fakeenginetest.AssertIndexHoldsTruth(t, live[0].srv.Index(), engines)
	leader := c.leader(10 * time.Second)
	lc, _ := dialNode(t, leader)
	matched := 0
	for _, p := range prompts {
		req := &kvindexv1.ScoreRequest{Model: testModel, TokenIds: p}
		want, err := lc.Score(context.Background(), req)
		if err != nil {
			t.Fatalf("Score on the leader: %v", err)
		}
		for _, s := range want.Scores {
			matched += int(s.MatchedBlocks)
		}
		for _, f := range c.followers(leader) {
			fc, _ := dialNode(t, f)
			got, err := fc.Score(context.Background(), req)
			if err != nil {
				t.Fatalf("Score on %s: %v", f.id, err)
			}
			if !proto.Equal(got, want) {
				t.Errorf("Score on %s differs from the leader's:\n%v\nleader %s:\n%v", f.id, got, leader.id, want)
			}
		}
	}
	if matched == 0 {
		t.Error("no prompt matched any block: the Score comparison proves nothing")
	}
	checkClusterDigests(t, live)
	t.Logf("%d replicas at applied index %d: same digest, %d cached (block, tier) pairs checked against the engines, %d prompts scored alike (%d matched blocks)",
		len(live), live[0].srv.backend.AppliedIndex(), compared, len(prompts), matched)
}

// checkClusterDigests asks GET /cluster until every live member reports its
// index digest at one applied index (a member digests at most once a second,
// and late events may still be applied), then checks that the digests agree.
func checkClusterDigests(t *testing.T, live []*clusterNode) {
	t.Helper()
	var body []byte
	deadline := time.Now().Add(20 * time.Second)
	for {
		var code int
		code, body = httpDo(t, "GET", "http://"+live[0].srv.HTTPAddr()+"/cluster", nil)
		var cl clusterJSON
		if err := json.Unmarshal(body, &cl); code != http.StatusOK || err != nil {
			t.Fatalf("GET /cluster = %d %s (%v)", code, body, err)
		}
		digests := map[string]uint64{} // digest -> applied index, of the live members
		reported := 0
		for _, m := range cl.Members {
			if slices.IndexFunc(live, func(cn *clusterNode) bool { return cn.id == m.ID }) >= 0 && m.IndexDigest != "" {
				reported++
				digests[m.IndexDigest] = m.DigestAppliedIndex
			}
		}
		atOneIndex := true
		for _, m := range cl.Members {
			if m.IndexDigest != "" && m.DigestAppliedIndex != cl.DigestAppliedIndex {
				atOneIndex = false
			}
		}
		if reported == len(live) && atOneIndex {
			if len(digests) != 1 {
				t.Errorf("/cluster: members at applied index %d report %d different digests: %s", cl.DigestAppliedIndex, len(digests), body)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("/cluster never showed every live member's digest at one applied index: %s", body)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestClusterOfThree runs three indexers as a raft cluster following fake
// engines registered through a follower: the replicas hold the same index, equal
// to the engines' caches, and score alike; after the leader is killed, a new one
// resumes ingest with no event lost or applied twice, and the killed node,
// restarted from its data dir, catches up.
func TestClusterOfThree(t *testing.T) {
	audit := newSeqAudit()
	c := makeCluster(t, 3, func(cfg *Config) { cfg.onBatch = audit.observer(cfg.NodeID) })
	ctx := context.Background()
	engines := map[string]*fakeengine.Engine{"ea": clusterEngine(t, "ea", 1), "eb": clusterEngine(t, "eb", 2)}
	leader := c.leader(10 * time.Second)
	follower := c.followers(leader)[0]

	// Register through a follower, in the kvindex REST form: the follower forwards
	// to the leader, which has applied the registration when the call returns.
	for name, e := range engines {
		spec := workerFlagFor(t, name, e)
		code, body := httpDo(t, "POST", "http://"+follower.srv.HTTPAddr()+"/register", map[string]any{"worker": map[string]any{
			"id": spec.ID, "model": spec.Model, "block_size": spec.BlockSize, "dp_size": spec.DPSize,
			"events_endpoint": spec.Endpoint, "replay_endpoint": spec.Replay, "http_endpoint": spec.HTTP,
		}})
		if code != http.StatusOK {
			t.Fatalf("POST /register %s on follower %s = %d %s", name, follower.id, code, body)
		}
		for _, cn := range []*clusterNode{leader, follower} {
			if got, ok := cn.srv.node.Worker(name); !ok || !got.Equal(spec) {
				t.Errorf("%s: registry has %v (%v) right after the register call, want %v", cn.id, got, ok, spec)
			}
		}
	}
	// Writes on a follower without the token are refused there, not forwarded.
	req, _ := http.NewRequest("POST", "http://"+follower.srv.HTTPAddr()+"/unregister", bytes.NewReader([]byte(`{"worker_id":"ea"}`)))
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("unregister without the token on a follower: %v %v", resp, err)
	}

	handshake(t, leader, engines)
	base := lastSeqs(t, engines)
	c.caughtUp(c.live(), base, 30*time.Second)

	load := startLoad(engines, 1)
	time.Sleep(1500 * time.Millisecond)
	load.stop(t)
	checkReplicas(t, c, engines, load.prompts[:min(len(load.prompts), 40)])

	// GET /cluster on a follower: three voters, one leader, each member's own
	// applied index (all equal now).
	code, body := httpDo(t, "GET", "http://"+follower.srv.HTTPAddr()+"/cluster", nil)
	var cl clusterJSON
	if err := json.Unmarshal(body, &cl); code != http.StatusOK || err != nil {
		t.Fatalf("GET /cluster = %d %s (%v)", code, body, err)
	}
	leaders := 0
	for _, m := range cl.Members {
		if m.IsLeader {
			leaders++
		}
		if m.Suffrage != "voter" || m.GRPCAddr == "" || m.RaftAddr == "" || m.AppliedIndex != cl.AppliedIndex {
			t.Errorf("GET /cluster member %+v (applied index of the answering node %d)", m, cl.AppliedIndex)
		}
	}
	if len(cl.Members) != 3 || leaders != 1 || cl.Leader != leader.id || cl.Term == 0 || cl.NodeID != follower.id {
		t.Errorf("GET /cluster = %s", body)
	}

	// Linearizable reads go to the leader: a follower names it.
	fidx, _ := dialNode(t, follower)
	_, err := fidx.Score(ctx, &kvindexv1.ScoreRequest{Model: testModel, TokenIds: tokens(0, 8), Consistency: kvindexv1.Consistency_CONSISTENCY_LINEARIZABLE})
	if st := status.Convert(err); st.Code() != codes.Unavailable || !bytes.Contains([]byte(st.Message()), []byte(leader.srv.GRPCAddr())) {
		t.Errorf("linearizable Score on a follower = %v, want not-leader naming %s", err, leader.srv.GRPCAddr())
	}
	lidx, _ := dialNode(t, leader)
	if _, err := lidx.Score(ctx, &kvindexv1.ScoreRequest{Model: testModel, TokenIds: tokens(0, 8), Consistency: kvindexv1.Consistency_CONSISTENCY_LINEARIZABLE}); err != nil {
		t.Errorf("linearizable Score on the leader: %v", err)
	}

	// Kill the leader under load; a survivor takes over and resumes every stream
	// from the replicated cursors, the engines' replay filling the gap. Every
	// survivor applied every seq published since the engines were followed
	// exactly once.
	killed, newLeader, failover, final := killLeaderUnderLoad(t, c, leader, engines, 2)
	published := audit.checkEvery(t, c, base, final)
	dropped := counter(t, newLeader.srv, "kvindex_raft_duplicate_batches_total")
	t.Logf("leader %s killed; %s led and ingested again after %v; %d batches published since, each applied once on every survivor; %d re-proposed batches dropped by the cursors",
		killed.id, newLeader.id, failover.Round(time.Millisecond), published, int(dropped))

	// The killed node, restarted from its data dir, catches up.
	c.start(killed)
	c.caughtUp(c.live(), final, 60*time.Second)
	if killed.srv.Index().Digest() != newLeader.srv.Index().Digest() {
		t.Error("the restarted node's index differs from the leader's")
	}

	// Unregister through a follower: the blocks leave every replica.
	f := c.followers(newLeader)[0]
	if code, body := httpDo(t, "POST", "http://"+f.srv.HTTPAddr()+"/unregister", map[string]string{"worker_id": "eb"}); code != http.StatusOK {
		t.Fatalf("POST /unregister on %s = %d %s", f.id, code, body)
	}
	if hs := f.srv.Index().HolderStats([]string{"eb"}); len(hs) != 0 {
		t.Errorf("%s still holds eb's blocks after the unregister call returned: %v", f.id, hs)
	}
	for _, cn := range c.live() {
		for deadline := time.Now().Add(10 * time.Second); len(cn.srv.Index().HolderStats([]string{"eb"})) != 0; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s still holds eb's blocks", cn.id)
			}
		}
	}

	// A graceful stop (SIGTERM) hands leadership over, then stops cleanly; the
	// two others go on committing.
	old := c.leader(10 * time.Second)
	stopAt := time.Now()
	if err := old.stop(); err != nil {
		t.Errorf("graceful stop of the leader %s: %v", old.id, err)
	}
	old.srv = nil
	next := c.leader(30 * time.Second)
	t.Logf("leader %s stopped gracefully; %s led and ingested after %v", old.id, next.id, time.Since(stopAt).Round(time.Millisecond))
	code, body = httpDo(t, "POST", "http://"+next.srv.HTTPAddr()+"/register", map[string]any{"worker": map[string]any{"id": "late", "model": testModel, "block_size": 4}})
	if code != http.StatusOK {
		t.Errorf("register on the new leader with one member down = %d %s", code, body)
	}
}

// TestClusterOverMutualTLS runs two members with --tls-cert, --tls-key and
// --tls-client-ca: the join, the forwarded write, the cluster progress queries
// and the raft transport all run over mutually authenticated TLS.
func TestClusterOverMutualTLS(t *testing.T) {
	pki := newTestPKI(t)
	c := makeCluster(t, 2, func(cfg *Config) {
		cfg.TLSCert, cfg.TLSKey, cfg.TLSClientCA = pki.peerCert, pki.peerKey, pki.caFile
		cfg.RaftTLSCA, cfg.RaftTLSCert, cfg.RaftTLSKey = pki.raftCAFile, pki.raftCert, pki.raftKey
	})
	leader := c.leader(10 * time.Second)
	follower := c.followers(leader)[0]
	clientTLS := &tls.Config{RootCAs: pki.pool, Certificates: []tls.Certificate{pki.clientCert}, ServerName: "127.0.0.1"}
	cc, err := grpc.NewClient(follower.srv.GRPCAddr(), grpc.WithTransportCredentials(credentials.NewTLS(clientTLS)))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+clusterToken)
	admin := kvindexv1.NewAdminServiceClient(cc)
	spec := &kvindexv1.WorkerSpec{Id: "w-tls", Model: testModel, BlockSize: 4}
	if _, err := admin.RegisterWorker(ctx, &kvindexv1.RegisterWorkerRequest{Worker: spec}); err != nil {
		t.Fatalf("RegisterWorker on the follower: %v", err)
	}
	if _, ok := leader.srv.node.Worker("w-tls"); !ok {
		t.Error("the leader does not hold the worker registered through the follower")
	}
	cl, err := admin.Cluster(ctx, &kvindexv1.ClusterRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range cl.Members {
		if m.AppliedIndex == 0 {
			t.Errorf("member %s reported no applied index over TLS: %v", m.Id, cl)
		}
	}
}

// TestAConflictForwardedByAFollowerKeepsItsCode: a compare-and-set registration
// sent to a follower that loses on the leader answers ABORTED / 409 "conflict"
// (docs/api.md), as on the leader (it used to come back INTERNAL); and the
// compatible /register of dp ranks sent to a follower retries its lost
// compare-and-sets as it does on the leader (it used to fail with 500).
func TestAConflictForwardedByAFollowerKeepsItsCode(t *testing.T) {
	c := makeCluster(t, 2, nil)
	leader := c.leader(30 * time.Second)
	follower := c.followers(leader)[0]
	_, ladmin := dialNode(t, leader)
	_, fadmin := dialNode(t, follower)
	ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+clusterToken)

	spec := &kvindexv1.WorkerSpec{Id: "w", Model: testModel, BlockSize: 4, EventsEndpoint: "tcp://127.0.0.1:1"}
	if _, err := ladmin.RegisterWorker(ctx, &kvindexv1.RegisterWorkerRequest{Worker: spec}); err != nil {
		t.Fatal(err)
	}
	stale := &kvindexv1.WorkerSpec{Id: "w", Model: testModel, BlockSize: 8, EventsEndpoint: "tcp://127.0.0.1:1"}
	next := &kvindexv1.WorkerSpec{Id: "w", Model: testModel, BlockSize: 4, DpSize: 2, EventsEndpoint: "tcp://127.0.0.1:1"}
	req := &kvindexv1.RegisterWorkerRequest{Worker: next, Expected: stale}
	_, lerr := ladmin.RegisterWorker(ctx, req)
	_, ferr := fadmin.RegisterWorker(ctx, req)
	if status.Code(lerr) != codes.Aborted {
		t.Errorf("on the leader: %v, want ABORTED", lerr)
	}
	if status.Code(ferr) != codes.Aborted {
		t.Errorf("on the follower: %v, want ABORTED as on the leader", ferr)
	}

	// The compatible form: dp ranks 1..3 registered at once through the follower.
	base := "http://" + follower.srv.HTTPAddr()
	var wg sync.WaitGroup
	codesGot := make([]int, 4)
	bodies := make([]string, 4)
	for rank := 1; rank <= 3; rank++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, body := httpDo(t, http.MethodPost, base+"/register", map[string]any{"instance_id": "w", "model": testModel,
				"endpoint": fmt.Sprintf("tcp://127.0.0.1:%d", 1+rank), "dp_rank": rank})
			codesGot[rank], bodies[rank] = code, string(body)
		}()
	}
	wg.Wait()
	for rank := 1; rank <= 3; rank++ {
		if codesGot[rank] != http.StatusCreated {
			t.Errorf("dp_rank %d through the follower = %d %s, want 201 (a lost compare-and-set is retried)", rank, codesGot[rank], bodies[rank])
		}
	}
}
