package raftstore

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// testCluster is an in-process cluster on loopback: real TCP (through faultNet),
// real bolt stores and snapshot directories in t.TempDir().
type testCluster struct {
	t     testing.TB
	net   *faultNet
	addrs map[string]string // raft address -> node id
	nodes []*testNode
}

type testNode struct {
	id, addr, dir string
	cfg           Config
	mu            sync.Mutex
	node          *Node // nil while down
}

func (tn *testNode) get() *Node {
	tn.mu.Lock()
	defer tn.mu.Unlock()
	return tn.node
}

// testLogger discards logs unless KVINDEX_TEST_LOG is set (raft logs after a test
// ends, which testing.T does not allow).
func testLogger() *slog.Logger {
	if os.Getenv("KVINDEX_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// testConfig is DefaultConfig with timeouts short enough for tests.
func testConfig() Config {
	c := DefaultConfig()
	// Sized for -race on two cores shared with other builds (load 15 seen): at
	// 300 ms a starved leader lost its lease mid-test and failed a Submit.
	c.HeartbeatTimeout = time.Second
	c.ElectionTimeout = time.Second
	c.LeaderLeaseTimeout = 500 * time.Millisecond
	c.CommitTimeout = 20 * time.Millisecond
	c.TransportTimeout = 2 * time.Second
	c.SnapshotInterval = time.Hour
	c.SnapshotThreshold = 1 << 40
	c.Logger = testLogger()
	return c
}

// makeCluster starts n nodes: the first bootstraps, the others join through the
// leader. configure, when set, adjusts each node's Config.
func makeCluster(t testing.TB, n int, configure func(id string, c *Config)) *testCluster {
	t.Helper()
	c := &testCluster{t: t, net: newFaultNet(), addrs: map[string]string{}}
	for i := range n {
		tn := &testNode{id: fmt.Sprintf("node-%d", i), dir: filepath.Join(t.TempDir(), fmt.Sprintf("node-%d", i))}
		tn.cfg = testConfig()
		tn.cfg.NodeID = tn.id
		tn.cfg.DataDir = tn.dir
		tn.cfg.GRPCAddr = fmt.Sprintf("grpc-of-%s:7070", tn.id)
		tn.cfg.Bootstrap = i == 0
		if configure != nil {
			configure(tn.id, &tn.cfg)
		}
		tn.addr = "127.0.0.1:0"
		c.nodes = append(c.nodes, tn)
	}
	t.Cleanup(c.shutdown)
	for _, tn := range c.nodes {
		c.start(tn)
	}
	leader := c.leader(10 * time.Second)
	for _, tn := range c.nodes[1:] {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := leader.Join(ctx, tn.id, tn.addr, tn.cfg.GRPCAddr, true)
		cancel()
		if err != nil {
			t.Fatalf("join %s: %v", tn.id, err)
		}
	}
	c.waitMembers(n, 10*time.Second)
	return c
}

// start starts (or restarts, from its data dir) a node on its raft address.
func (c *testCluster) start(tn *testNode) {
	c.t.Helper()
	layer, err := c.net.listen(tn.id, tn.addr, c.addrs)
	if err != nil {
		c.t.Fatalf("listen for %s: %v", tn.id, err)
	}
	tn.addr = layer.Addr().String()
	c.net.mu.Lock()
	c.addrs[tn.addr] = tn.id
	c.net.mu.Unlock()
	cfg := tn.cfg
	cfg.StreamLayer = layer
	n, err := NewNode(cfg)
	if err != nil {
		layer.Close()
		c.t.Fatalf("start %s: %v", tn.id, err)
	}
	tn.mu.Lock()
	tn.node = n
	tn.mu.Unlock()
}

// restart starts a stopped node again from its data dir, with its cfg as it is now.
func (c *testCluster) restart(tn *testNode) *Node {
	c.t.Helper()
	c.start(tn)
	return tn.get()
}

// kill stops tn abruptly: its connections drop, raft stops without handing
// leadership over; its data dir stays for a restart.
func (c *testCluster) kill(tn *testNode) {
	tn.mu.Lock()
	n := tn.node
	tn.node = nil
	tn.mu.Unlock()
	if n == nil {
		return
	}
	c.net.closeAll(tn.id)
	n.stop(true)
	c.net.closeAll(tn.id)
}

// killLeader waits for a leader, kills it abruptly and returns it (its Node is
// the one it ran).
func (c *testCluster) killLeader() (*testNode, *Node) {
	c.t.Helper()
	tn := c.leaderNode(20 * time.Second)
	n := tn.get()
	c.kill(tn)
	return tn, n
}

func (c *testCluster) shutdown() {
	var wg sync.WaitGroup
	for _, tn := range c.nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.kill(tn)
		}()
	}
	wg.Wait()
}

// live returns the running nodes.
func (c *testCluster) live() []*testNode {
	var out []*testNode
	for _, tn := range c.nodes {
		if tn.get() != nil {
			out = append(out, tn)
		}
	}
	return out
}

func (c *testCluster) byID(id string) *testNode {
	for _, tn := range c.nodes {
		if tn.id == id {
			return tn
		}
	}
	c.t.Fatalf("no node %q", id)
	return nil
}

// leader waits until one running node leads and accepts batches, and returns it.
func (c *testCluster) leader(timeout time.Duration) *Node {
	c.t.Helper()
	tn := c.leaderNode(timeout)
	return tn.get()
}

func (c *testCluster) leaderNode(timeout time.Duration) *testNode {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		for _, tn := range c.live() {
			if n := tn.get(); n != nil && n.IsLeader() {
				return tn
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	c.t.Fatalf("no leader within %v", timeout)
	return nil
}

// leaderAmong returns a node of tns that leads, or nil.
func leaderAmong(tns []*testNode) *Node {
	for _, tn := range tns {
		if n := tn.get(); n != nil && n.IsLeader() {
			return n
		}
	}
	return nil
}

func (c *testCluster) waitMembers(n int, timeout time.Duration) {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if st, err := c.leader(timeout).Cluster(); err == nil && len(st.Members) == n {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	c.t.Fatalf("cluster did not reach %d members within %v", n, timeout)
}

// waitConverged waits until every running node has applied the same last index as
// the leader and holds the same index digest; it returns that digest.
func (c *testCluster) waitConverged(timeout time.Duration) [32]byte {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	var last string
	for time.Now().Before(deadline) {
		leader := c.leader(time.Until(deadline))
		target := leader.raft.LastIndex()
		ok := true
		var digest [32]byte
		for i, tn := range c.live() {
			n := tn.get()
			if n == nil || n.AppliedIndex() < target {
				ok = false
				last = fmt.Sprintf("%s applied %d of %d", tn.id, n.AppliedIndex(), target)
				break
			}
			d := n.Index().Digest()
			if i > 0 && d != digest {
				ok = false
				last = fmt.Sprintf("%s digest differs", tn.id)
				break
			}
			digest = d
		}
		if ok {
			return digest
		}
		time.Sleep(20 * time.Millisecond)
	}
	c.t.Fatalf("replicas did not converge within %v: %s", timeout, last)
	return [32]byte{}
}
