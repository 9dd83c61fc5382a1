package server

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	kvindexv1 "github.com/kvindex/kvindex/api/proto/kvindex/v1"
	"github.com/kvindex/kvindex/bench/fakeengine"
	"github.com/kvindex/kvindex/bench/fakeengine/fakeenginetest"
	"github.com/kvindex/kvindex/internal/ingest"
	"github.com/kvindex/kvindex/internal/raftstore"
)

// seqAudit records, per node, the sequence number of every stream batch the
// node applied, to audit loss and double application seq by seq.
type seqAudit struct {
	mu      sync.Mutex
	applied map[string]map[ingest.Stream][]uint64 // guarded by mu
}

func newSeqAudit() *seqAudit {
	return &seqAudit{applied: map[string]map[ingest.Stream][]uint64{}}
}

func (a *seqAudit) observer(node string) raftstore.BatchObserver {
	return func(_ uint64, b *ingest.StreamBatch, o raftstore.BatchOutcome, _ ingest.ApplyResult) {
		if o != raftstore.BatchApplied {
			return
		}
		a.mu.Lock()
		defer a.mu.Unlock()
		if a.applied[node] == nil {
			a.applied[node] = map[ingest.Stream][]uint64{}
		}
		a.applied[node][b.Stream] = append(a.applied[node][b.Stream], b.Seq)
	}
}

// check returns, for node's stream s, the seqs in (after, upTo] it never
// applied and those it applied more than once.
func (a *seqAudit) check(node string, s ingest.Stream, after, upTo uint64) (lost, twice []uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	times := map[uint64]int{}
	for _, q := range a.applied[node][s] {
		times[q]++
	}
	for q := after + 1; q <= upTo; q++ {
		switch n := times[q]; {
		case n == 0:
			lost = append(lost, q)
		case n > 1:
			twice = append(twice, q)
		}
	}
	return lost, twice
}

// checkEvery checks that every live node applied every seq in (base, final]
// exactly once and returns how many batches that was per node; it fails the
// test when too few were published for the audit to prove anything.
func (a *seqAudit) checkEvery(t *testing.T, c *testCluster, base, final map[ingest.Stream]uint64) (published int) {
	t.Helper()
	for _, cn := range c.live() {
		for s, last := range final {
			lost, twice := a.check(cn.id, s, base[s], last)
			if len(lost) > 0 || len(twice) > 0 {
				t.Errorf("%s, stream %v, seqs %d..%d: lost %v, applied twice %v", cn.id, s, base[s]+1, last, lost, twice)
			}
		}
	}
	for s, last := range final {
		published += int(last - base[s])
	}
	if published < 50 {
		t.Errorf("only %d batches published under load: the audit proves little", published)
	}
	return published
}

// killLeaderUnderLoad kills leader abruptly while a load (of the given seed)
// runs on the engines, waits for a successor, lets the load go on, then stops it and checks
// every survivor against the engines' caches. It returns the killed node, its
// successor, the time from the kill to the successor's election, and every
// stream's last published seq.
func killLeaderUnderLoad(t *testing.T, c *testCluster, leader *clusterNode, engines map[string]*fakeengine.Engine, seed uint64) (killed, next *clusterNode, failover time.Duration, final map[ingest.Stream]uint64) {
	t.Helper()
	load := startLoad(engines, seed)
	time.Sleep(700 * time.Millisecond)
	killedAt := time.Now()
	c.kill(leader)
	next = c.leader(30 * time.Second)
	failover = time.Since(killedAt)
	time.Sleep(1500 * time.Millisecond)
	load.stop(t)
	checkReplicas(t, c, engines, load.prompts[:min(len(load.prompts), 40)])
	return leader, next, failover, lastSeqs(t, engines)
}

// freeLoopbackPort returns a TCP port free on every interface now.
func freeLoopbackPort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// TestBindModeOnFollowersSurvivesLeaderKill runs a 3-node cluster in bind mode
// with two engines that publish only to the followers' --zmq-bind sockets (as
// engines behind a Kubernetes Service reach any member): "ea" is discovered
// from its llm-d topic with its replay endpoint from --bind-replay-pattern,
// "eb" is registered with its replay endpoint through the API. The followers
// forward to the leader; the leader is killed under load, a follower takes
// over, ingests its own bind socket and what the other follower forwards to it
// now. In the end every survivor's index equals the engines' caches, and each
// survivor applied every sequence number published since the engines were
// followed exactly once.
func TestBindModeOnFollowersSurvivesLeaderKill(t *testing.T) {
	audit := newSeqAudit()
	replayPort := freeLoopbackPort(t)
	c := makeCluster(t, 3, func(cfg *Config) {
		cfg.Ingest.ZMQBind = "tcp://127.0.0.1:*"
		cfg.Ingest.BindReplayPattern = fmt.Sprintf("tcp://{pod}:%d", replayPort)
		cfg.Ingest.ReplayAllow = []string{"tcp://127.0.0.1:*"}
		cfg.onBatch = audit.observer(cfg.NodeID)
	})
	leader := c.leader(10 * time.Second)
	fs := c.followers(leader)
	for _, cn := range c.live() {
		if cn.srv.Ingest().BindEndpoint() == "" {
			t.Fatalf("%s does not bind", cn.id)
		}
	}

	// A member that does not lead refuses a stream of forwarded frames, naming
	// the leader.
	cc, err := grpc.NewClient(fs[0].srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	st, err := kvindexv1.NewMemberServiceClient(cc).ForwardEvents(
		metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+clusterToken))
	if err == nil {
		_, err = st.CloseAndRecv()
	}
	if s := status.Convert(err); s.Code() != codes.Unavailable || !strings.Contains(s.Message(), leader.srv.GRPCAddr()) {
		t.Errorf("ForwardEvents on follower %s = %v, want UNAVAILABLE naming the leader at %s", fs[0].id, err, leader.srv.GRPCAddr())
	}

	// ea: pod "127.0.0.1", replay on the pattern's port, publishing to fs[0].
	eaCfg := engineConfigFor(engineSpec{name: "ea", dp: 1, gpuBlocks: 48, cpuBlocks: 24})
	eaCfg.KVEventsTopic = "kv@127.0.0.1@" + testModel
	eaCfg.KVEventsEndpoint = fs[0].srv.Ingest().BindEndpoint()
	eaCfg.KVEventsReplayEndpoint = fmt.Sprintf("tcp://*:%d", replayPort)
	// eb: registered by hand, publishing to fs[1].
	ebCfg := engineConfigFor(engineSpec{name: "eb", dp: 1, gpuBlocks: 48, cpuBlocks: 24})
	ebCfg.KVEventsTopic = "kv@eb@" + testModel
	ebCfg.KVEventsEndpoint = fs[1].srv.Ingest().BindEndpoint()
	engines := map[string]*fakeengine.Engine{"127.0.0.1": fakeenginetest.Start(t, eaCfg), "eb": fakeenginetest.Start(t, ebCfg)}
	ebReplay := engines["eb"].ReplayEndpoints()[0]
	code, body := httpDo(t, "POST", "http://"+fs[1].srv.HTTPAddr()+"/register", map[string]any{"worker": map[string]any{
		"id": "eb", "model": testModel, "block_size": 4, "replay_endpoint": ebReplay,
	}})
	if code != http.StatusOK {
		t.Fatalf("POST /register eb on %s = %d %s", fs[1].id, code, body)
	}

	handshake(t, leader, engines)
	deadline := time.Now().Add(30 * time.Second)
	base := lastSeqs(t, engines)
	c.caughtUp(c.live(), base, 30*time.Second)
	// The leader registers what it discovered (every publishInterval): every
	// replica, and so the next leader, knows ea's replay endpoint.
	wantReplay := fmt.Sprintf("tcp://127.0.0.1:%d", replayPort)
	for _, cn := range c.live() {
		for {
			spec, ok := cn.srv.node.Worker("127.0.0.1")
			if ok && spec.Replay == wantReplay {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: the discovered worker is registered as %v (%v), want replay %s", cn.id, spec, ok, wantReplay)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}

	killed, newLeader, failover, final := killLeaderUnderLoad(t, c, leader, engines, 5)
	published := audit.checkEvery(t, c, base, final)
	other := slices.DeleteFunc(c.live(), func(cn *clusterNode) bool { return cn == newLeader })[0]
	if n := labeled(t, other.srv, "kvindex_ingest_forward_frames_total", "result", "sent"); n == 0 {
		t.Errorf("%s, a follower after the kill, forwarded nothing to the new leader %s", other.id, newLeader.id)
	}
	if n := labeled(t, newLeader.srv, "kvindex_ingest_bind_frames_total", "route", "ingested"); n == 0 {
		t.Errorf("the new leader %s ingested nothing from its own bind socket", newLeader.id)
	}
	gaps, replayed := 0.0, 0.0
	for w := range engines {
		gaps += labeled(t, newLeader.srv, "kvindex_ingest_gaps_total", "worker", w)
		replayed += labeled(t, newLeader.srv, "kvindex_ingest_replayed_batches_total", "worker", w)
		if r := labeled(t, newLeader.srv, "kvindex_ingest_resets_total", "worker", w); r != 0 {
			t.Errorf("the new leader reset %s %v times: a loss replay should have recovered", w, r)
		}
	}
	t.Logf("leader %s killed; %s led after %v; %d batches published since the engines were followed, each applied once on every survivor; new leader: %v gaps, %v batches replayed",
		killed.id, newLeader.id, failover.Round(time.Millisecond), published, gaps, replayed)
}
