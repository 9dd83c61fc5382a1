package server

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync/atomic"
	"testing"
	"time"

	kvindexv1 "github.com/kvindex/kvindex/api/proto/kvindex/v1"
	"github.com/kvindex/kvindex/bench/fakeengine"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// unusedAddr is a loopback address nothing listens on now.
func unusedAddr(t *testing.T) string {
	return fmt.Sprintf("127.0.0.1:%d", freeLoopbackPort(t))
}

// oneCluster waits until every live node of c is a voter of one configuration
// of all live nodes and all of them report the same leader and term: no node
// runs a cluster of its own.
func (c *testCluster) oneCluster(timeout time.Duration) {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		live := c.live()
		views := map[string]bool{}
		agree := true
		for _, cn := range live {
			st, err := cn.srv.node.Cluster()
			if err != nil || st.LeaderID == "" || len(st.Members) != len(live) {
				agree = false
			}
			views[fmt.Sprintf("leader %s term %d members %d", st.LeaderID, st.Term, len(st.Members))] = true
		}
		if agree && len(views) == 1 {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("the %d live nodes never agreed on one cluster; their views: %v", len(live), views)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestBootstrapPeersFirstInstall: node-0 starts with --bootstrap-peers naming
// node-1 and node-2 before they listen, and waits; they start with --join
// through node-0 and answer that they are in no cluster, so node-0 starts one
// and both join it.
func TestBootstrapPeersFirstInstall(t *testing.T) {
	c := newTestCluster(t)
	peers := []string{unusedAddr(t), unusedAddr(t)}
	cfg0 := clusterConfig(t, 0)
	cfg0.BootstrapPeers = peers
	n0 := &clusterNode{id: cfg0.NodeID, cfg: cfg0}
	c.nodes = append(c.nodes, n0)
	c.start(n0)
	for i, addr := range peers {
		cfg := clusterConfig(t, i+1)
		cfg.GRPCAddr = addr
		cfg.Join = n0.srv.GRPCAddr()
		cn := &clusterNode{id: cfg.NodeID, cfg: cfg}
		c.nodes = append(c.nodes, cn)
		c.start(cn)
	}
	c.waitFormed(60 * time.Second)
	c.oneCluster(30 * time.Second)
}

// TestBootstrapPeersRejoinAfterDataLoss: node-0, the member that started the
// cluster, loses its data dir while node-1 and node-2 run on; restarted with
// --bootstrap-peers (and still no --join) it joins their cluster and catches
// up, whether their configuration still names it or it was removed first,
// rather than starting a second cluster.
func TestBootstrapPeersRejoinAfterDataLoss(t *testing.T) {
	for _, removed := range []bool{false, true} {
		t.Run(fmt.Sprintf("removed=%v", removed), func(t *testing.T) {
			c := makeCluster(t, 3, nil)
			n0 := c.nodes[0]
			engines := map[string]*fakeengine.Engine{"ea": clusterEngine(t, "ea", 1)}
			leader := c.leader(10 * time.Second)
			spec := workerFlagFor(t, "ea", engines["ea"])
			if code, body := httpDo(t, "POST", "http://"+leader.srv.HTTPAddr()+"/register", map[string]any{"worker": map[string]any{
				"id": spec.ID, "model": spec.Model, "block_size": spec.BlockSize, "dp_size": spec.DPSize,
				"events_endpoint": spec.Endpoint, "replay_endpoint": spec.Replay,
			}}); code != http.StatusOK {
				t.Fatalf("POST /register = %d %s", code, body)
			}
			handshake(t, leader, engines)

			c.kill(n0)
			if err := os.RemoveAll(n0.cfg.DataDir); err != nil {
				t.Fatal(err)
			}
			leader = c.leader(30 * time.Second)
			if removed {
				if _, err := leader.srv.backend.Leave(context.Background(), n0.id); err != nil {
					t.Fatalf("removing %s: %v", n0.id, err)
				}
			}
			// Blocks written while node-0 is away: it must catch up on them.
			for i := range 20 {
				if _, err := engines["ea"].Generate(context.Background(), fakeengine.Request{Prompt: tokens(i*7, 12), MaxTokens: 2}); err != nil {
					t.Fatal(err)
				}
			}
			last := lastSeqs(t, engines)
			c.caughtUp(c.live(), last, 30*time.Second)

			n0.cfg.BootstrapPeers = []string{c.nodes[1].srv.GRPCAddr(), c.nodes[2].srv.GRPCAddr()}
			c.start(n0)
			c.waitFormed(60 * time.Second)
			c.oneCluster(30 * time.Second)
			c.caughtUp(c.live(), last, 60*time.Second)
			leader = c.leader(10 * time.Second)
			if n0.srv.Index().Digest() != leader.srv.Index().Digest() {
				t.Errorf("%s's index differs from the leader's (%s) after it caught up", n0.id, leader.id)
			}
		})
	}
}

// TestBootstrapPeersWaitForEveryAnswer: while one of node-0's
// --bootstrap-peers does not answer and the other is in no cluster (it waits
// to be added through a --join no one serves), node-0 starts no cluster; once
// the missing peer answers that it is in none either, node-0 starts one.
func TestBootstrapPeersWaitForEveryAnswer(t *testing.T) {
	c := newTestCluster(t)
	nowhere := unusedAddr(t)
	cfgA := clusterConfig(t, 1)
	cfgA.Join = nowhere
	a := &clusterNode{id: cfgA.NodeID, cfg: cfgA}
	c.nodes = append(c.nodes, a)
	c.start(a)

	// What node-0 is told by a node that has no raft configuration yet: no
	// members, no leader.
	_, admin := dialNode(t, a)
	resp, err := admin.Cluster(context.Background(), &kvindexv1.ClusterRequest{WithoutDigest: true})
	if err != nil || len(resp.Members) != 0 || resp.Leader != "" {
		t.Fatalf("Cluster on a node not yet added = %v, %v; want no members and no leader", resp, err)
	}

	missing := unusedAddr(t)
	cfg0 := clusterConfig(t, 0)
	cfg0.BootstrapPeers = []string{a.srv.GRPCAddr(), missing}
	n0 := &clusterNode{id: cfg0.NodeID, cfg: cfg0}
	c.nodes = append(c.nodes, n0)
	c.start(n0)
	// No timing goal: over a window of several election timeouts, node-0
	// must not have started a cluster.
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		st, err := n0.srv.node.Cluster()
		if err != nil || len(st.Members) != 0 || st.LeaderID != "" {
			t.Fatalf("%s started a cluster while a bootstrap peer did not answer: %+v, %v", n0.id, st, err)
		}
	}

	cfgB := clusterConfig(t, 2)
	cfgB.GRPCAddr = missing
	cfgB.Join = nowhere
	b := &clusterNode{id: cfgB.NodeID, cfg: cfgB}
	c.nodes = append(c.nodes, b)
	c.start(b)
	deadline := time.Now().Add(60 * time.Second)
	for !n0.srv.node.IsLeader() {
		if time.Now().After(deadline) {
			st, _ := n0.srv.node.Cluster()
			t.Fatalf("%s never started its cluster once every peer answered: %+v", n0.id, st)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// stuckMember is a peer that says it is in a cluster and knows its leader but
// fails every Join, as a member cut off from its leader does. A real member
// cannot be held in that state for a test's length; the peer only fakes its
// answers, over a real gRPC server on loopback.
type stuckMember struct {
	kvindexv1.UnimplementedAdminServiceServer
	joins atomic.Int64
}

func (m *stuckMember) Cluster(context.Context, *kvindexv1.ClusterRequest) (*kvindexv1.ClusterResponse, error) {
	return &kvindexv1.ClusterResponse{Leader: "elsewhere", NodeId: "stuck",
		Members: []*kvindexv1.ClusterMember{{Id: "elsewhere"}, {Id: "stuck"}}}, nil
}

func (m *stuckMember) Join(context.Context, *kvindexv1.JoinRequest) (*kvindexv1.JoinResponse, error) {
	m.joins.Add(1)
	return nil, status.Error(codes.Unavailable, "the leader does not answer")
}

// TestBootstrapPeersJoinThroughAnotherMember: node-0's data dir is new and
// the first of its --bootstrap-peers says it is in a cluster but fails every
// Join; the second is a member of a running cluster. node-0 joins through the
// second instead of retrying the first for good.
func TestBootstrapPeersJoinThroughAnotherMember(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	stuck := &stuckMember{}
	gs := grpc.NewServer()
	kvindexv1.RegisterAdminServiceServer(gs, stuck)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)

	c := makeCluster(t, 2, func(cfg *Config) { cfg.NodeID = "member-" + cfg.NodeID })
	cfg := clusterConfig(t, 0)
	cfg.BootstrapPeers = []string{lis.Addr().String(), c.nodes[1].srv.GRPCAddr()}
	n0 := &clusterNode{id: cfg.NodeID, cfg: cfg}
	c.nodes = append(c.nodes, n0)
	c.start(n0)
	c.waitFormed(60 * time.Second)
	c.oneCluster(30 * time.Second)
	if stuck.joins.Load() == 0 {
		t.Errorf("node-0 never tried the stuck member first: the test proves nothing")
	}
}
