package raftstore

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/kvindex/kvindex/internal/ingest"
	"github.com/kvindex/kvindex/internal/radix"
	"github.com/kvindex/kvindex/internal/workerspec"
)

func TestConfigValidateNamesTheBadField(t *testing.T) {
	valid := DefaultConfig()
	valid.NodeID, valid.DataDir = "n1", "/tmp/x"
	if err := valid.Validate(); err != nil {
		t.Fatalf("valid config: %v", err)
	}
	tests := []struct {
		field string
		set   func(c *Config)
		value string // the bad value as the error must name it, when checked
	}{
		{"NodeID", func(c *Config) { c.NodeID = "" }, ""},
		{"GRPCAddr", func(c *Config) { c.GRPCAddr = strings.Repeat("a", maxStringLen+1) }, ""},
		{"RaftAddr", func(c *Config) { c.RaftAddr = "" }, ""},
		{"DataDir", func(c *Config) { c.DataDir = "" }, ""},
		{"MaxBatchEvents", func(c *Config) { c.MaxBatchEvents = 0 }, ""},
		{"MaxBatchBytes", func(c *Config) { c.MaxBatchBytes = 10 }, ""},
		{"MaxBatchWait", func(c *Config) { c.MaxBatchWait = -time.Millisecond }, ""},
		{"MaxInFlight", func(c *Config) { c.MaxInFlight = 0 }, ""},
		{"LogCacheSize", func(c *Config) { c.LogCacheSize = -1 }, ""},
		{"TransportMaxPool", func(c *Config) { c.TransportMaxPool = 0 }, ""},
		{"TransportTimeout", func(c *Config) { c.TransportTimeout = 0 }, ""},
		{"SnapshotRetain", func(c *Config) { c.SnapshotRetain = 0 }, ""},
		{"SnapshotThreshold", func(c *Config) { c.SnapshotThreshold = 0 }, ""},
		{"LeaderLeaseTimeout", func(c *Config) { c.LeaderLeaseTimeout = 2 * c.HeartbeatTimeout }, ""},
		{"ElectionTimeout", func(c *Config) { c.ElectionTimeout = c.HeartbeatTimeout / 2 }, ""},
		{"MaxAppendEntries", func(c *Config) { c.MaxAppendEntries = 4096 }, "4096"},
		{"HeartbeatTimeout", func(c *Config) { c.HeartbeatTimeout = time.Millisecond }, "1ms"},
		{"CommitTimeout", func(c *Config) { c.CommitTimeout = 0 }, "0s"},
	}
	for _, tc := range tests {
		t.Run(tc.field, func(t *testing.T) {
			c := valid
			tc.set(&c)
			err := c.Validate()
			if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.field) {
				t.Errorf("error %v, want ErrInvalidConfig naming %s", err, tc.field)
			}
			if tc.value != "" && !strings.Contains(err.Error(), "= "+tc.value) {
				t.Errorf("error %v does not name the value %s", err, tc.value)
			}
		})
	}
}

func TestTCPStreamLayerRefusesAnUndialableAddress(t *testing.T) {
	if _, err := NewTCPStreamLayer("0.0.0.0:0", ""); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("listening on 0.0.0.0 without an advertise address: %v, want ErrInvalidConfig", err)
	}
	l, err := NewTCPStreamLayer("0.0.0.0:0", "127.0.0.1:7999")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if got := l.Addr().String(); got != "127.0.0.1:7999" {
		t.Errorf("advertised %s, want 127.0.0.1:7999", got)
	}
}

// TestSingleNodeBootstrapsItself runs the real TCP stream layer (no fault layer).
func TestSingleNodeBootstrapsItself(t *testing.T) {
	cfg := testConfig()
	cfg.NodeID, cfg.DataDir, cfg.RaftAddr, cfg.Bootstrap = "solo", t.TempDir(), "127.0.0.1:0", true
	cfg.GRPCAddr = "127.0.0.1:7070"
	var workers []workerspec.Spec
	var mu sync.Mutex
	cfg.OnWorkersChanged = func(w []workerspec.Spec) { mu.Lock(); workers = w; mu.Unlock() }
	n, err := NewNode(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Shutdown(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for !n.IsLeader() {
		if ctx.Err() != nil {
			t.Fatal("a bootstrapped single node did not become leader")
		}
		time.Sleep(5 * time.Millisecond)
	}
	ref := ingest.NewApplier(radix.New(radix.Config{}))
	for _, b := range genBatches(testStreams(3), 300, 6) {
		if err := n.Submit(ctx, b); err != nil {
			t.Fatalf("submit: %v", err)
		}
		ref.Apply(b)
	}
	if err := n.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := n.RegisterWorker(ctx, sampleWorker()); err != nil {
		t.Fatal(err)
	}
	if n.Index().Digest() != ref.Index().Digest() {
		t.Error("index differs from the batches applied directly")
	}
	mu.Lock()
	if len(workers) != 1 || workers[0].ID != "vllm-0" {
		t.Errorf("OnWorkersChanged saw %v, want [vllm-0]", workers)
	}
	mu.Unlock()
	st, err := n.Cluster()
	if err != nil {
		t.Fatal(err)
	}
	want := []Member{{ID: "solo", RaftAddr: n.RaftAddr(), GRPCAddr: "127.0.0.1:7070", Suffrage: SuffrageVoter, IsLeader: true, AppliedIndex: st.AppliedIndex}}
	if st.LeaderID != "solo" || st.State != "Leader" || st.Term == 0 || !reflect.DeepEqual(st.Members, want) {
		t.Errorf("cluster status %+v, want leader solo and members %+v", st, want)
	}
	if err := n.LinearizableBarrier(ctx); err != nil {
		t.Errorf("linearizable barrier on the leader: %v", err)
	}
}

func TestRegistryOnlyOnTheLeaderAndReplicated(t *testing.T) {
	c := makeCluster(t, 3, nil)
	leader := c.leader(10 * time.Second)
	c.waitConverged(10 * time.Second) // followers know the leader's gRPC address
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var follower *Node
	for _, tn := range c.nodes {
		if n := tn.get(); n != leader {
			follower = n
		}
	}
	_, err := follower.RegisterWorker(ctx, sampleWorker())
	var nle *NotLeaderError
	if !errors.As(err, &nle) || !errors.Is(err, ErrNotLeader) {
		t.Fatalf("register on a follower: %v, want a NotLeaderError", err)
	}
	if nle.LeaderID != leader.ID() || nle.LeaderAddr != leader.RaftAddr() || nle.LeaderGRPCAddr != "grpc-of-"+leader.ID()+":7070" {
		t.Errorf("NotLeaderError names %+v, want the leader %s", nle, leader.ID())
	}
	if err := follower.Submit(ctx, ingest.StreamBatch{Stream: ws("w", 0)}); !errors.Is(err, ErrNotLeader) {
		t.Errorf("submit on a follower: %v, want ErrNotLeader", err)
	}
	if err := follower.LinearizableBarrier(ctx); !errors.Is(err, ErrNotLeader) {
		t.Errorf("linearizable barrier on a follower: %v, want ErrNotLeader", err)
	}

	idx, err := leader.RegisterWorker(ctx, sampleWorker())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := leader.RegisterWorker(ctx, sampleWorker()); err != nil {
		t.Errorf("registering the same spec again: %v", err)
	}
	changed := sampleWorker()
	changed.Model = "other"
	if _, err := leader.RegisterWorker(ctx, changed); !errors.Is(err, ErrWorkerExists) {
		t.Errorf("registering another spec under the same id: %v, want ErrWorkerExists", err)
	}
	if _, err := leader.RegisterWorker(ctx, workerspec.Spec{ID: "has space", Model: "m"}); !errors.Is(err, workerspec.ErrInvalid) {
		t.Errorf("registering an invalid spec: %v, want workerspec.ErrInvalid", err)
	}
	if _, err := leader.UnregisterWorker(ctx, "nobody"); !errors.Is(err, ErrUnknownWorker) {
		t.Errorf("unregistering an unknown id: %v, want ErrUnknownWorker", err)
	}
	if err := follower.WaitApplied(ctx, idx); err != nil {
		t.Fatal(err)
	}
	want := sampleWorker()
	if got, ok := follower.Worker("vllm-0"); !ok || !sameWorker(&got, &want) {
		t.Errorf("follower's registry has %+v, %v; want the registered spec", got, ok)
	}
}

// TestPartitionedLeaderCannotCommit isolates the leader: it cannot commit what it
// is given, the majority elects a leader and commits, and after Heal every replica
// holds the majority's index and nothing of what the isolated leader was given.
func TestPartitionedLeaderCannotCommit(t *testing.T) {
	c := makeCluster(t, 3, nil)
	oldTN := c.leaderNode(10 * time.Second)
	old := oldTN.get()
	streams := testStreams(3)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ref := ingest.NewApplier(radix.New(radix.Config{}))
	for _, b := range genBatches(streams, 60, 4) {
		if err := old.Submit(ctx, b); err != nil {
			t.Fatal(err)
		}
		ref.Apply(b)
	}
	if err := old.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	c.waitConverged(20 * time.Second)
	applied := old.AppliedIndex()
	before := old.Index().Digest()

	c.net.partition(oldTN.id)
	// The isolated leader takes these (it does not know yet) but cannot commit them.
	minority := genBatches(streams, 30, 4)
	for _, b := range minority {
		if err := old.Submit(ctx, b); err != nil {
			break // it noticed and stepped down
		}
	}
	if _, err := old.RegisterWorker(ctx, sampleWorker()); err == nil {
		t.Error("the isolated leader committed a registration")
	}
	var majority []*testNode
	for _, tn := range c.nodes {
		if tn != oldTN {
			majority = append(majority, tn)
		}
	}
	var newLeader *Node
	for newLeader = leaderAmong(majority); newLeader == nil; newLeader = leaderAmong(majority) {
		if ctx.Err() != nil {
			t.Fatal("the majority elected no leader")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The majority commits other batches of the same streams: it resumes from its
	// cursors, which do not include the minority's batches.
	fresh := testStreams(3)
	genBatches(fresh, 60, 4) // the same prefix as above
	for _, b := range genBatches(fresh, 45, 4) {
		if err := newLeader.Submit(ctx, b); err != nil {
			t.Fatal(err)
		}
		ref.Apply(b)
	}
	if err := newLeader.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if old.AppliedIndex() != applied || old.Index().Digest() != before {
		t.Error("the isolated old leader applied entries while cut off")
	}
	if old.IsLeader() {
		t.Error("the isolated old leader still accepts batches after the majority elected another")
	}
	c.net.heal()
	digest := c.waitConverged(20 * time.Second)
	if digest != ref.Index().Digest() {
		t.Error("after Heal the replicas hold something else than what the majority committed")
	}
}

// TestFollowerCatchesUpBySnapshot stops a follower, lets the leader move past its
// TrailingLogs and compact, and restarts it: it must install a snapshot.
func TestFollowerCatchesUpBySnapshot(t *testing.T) {
	c := makeCluster(t, 3, func(id string, cfg *Config) {
		cfg.SnapshotThreshold = 64
		cfg.TrailingLogs = 16
		cfg.SnapshotInterval = 50 * time.Millisecond
		cfg.MaxBatchEvents = 64 // many entries
	})
	leader := c.leader(10 * time.Second)
	var lagger *testNode
	for _, tn := range c.nodes {
		if tn.get() != leader {
			lagger = tn
		}
	}
	streams := testStreams(4)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// Any leader will do: on a starved machine leadership may move mid-test
	// (the batches of a lost session may or may not commit; the replicas are
	// compared with each other, not with what was submitted).
	retrying := func(op func(*Node) error) {
		t.Helper()
		for {
			err := op(leader)
			var nl *NotLeaderError
			if err == nil || !errors.As(err, &nl) {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			leader = c.leader(20 * time.Second)
		}
	}
	submit := func(n int) {
		for _, b := range genBatches(streams, n, 16) {
			retrying(func(l *Node) error { return l.Submit(ctx, b) })
		}
		retrying(func(l *Node) error { return l.Flush(ctx) })
	}
	submit(50)
	c.waitConverged(20 * time.Second)
	lagIndex := lagger.get().AppliedIndex()
	c.kill(lagger)
	submit(2000)
	for {
		metas, err := leader.snapshots.List()
		if err != nil {
			t.Fatal(err)
		}
		if len(metas) > 0 && metas[0].Index > lagIndex+lagger.cfg.TrailingLogs {
			first, _ := leader.store.FirstIndex()
			if first > lagIndex+1 {
				break // the log the lagger needs is gone from the leader
			}
		}
		if ctx.Err() != nil {
			t.Fatal("the leader did not snapshot and compact its log")
		}
		time.Sleep(20 * time.Millisecond)
	}
	n := c.restart(lagger)
	want := c.waitConverged(30 * time.Second)
	if n.Index().Digest() != want {
		t.Error("the restarted follower's index differs")
	}
	metas, err := n.snapshots.List()
	if err != nil || len(metas) == 0 || metas[0].Index <= lagIndex {
		t.Errorf("the follower holds snapshots %+v (err %v); want one installed from the leader past index %d", metas, err, lagIndex)
	}
	if !reflect.DeepEqual(n.Applier().Cursors(), leader.Applier().Cursors()) {
		t.Error("the follower's cursors differ from the leader's")
	}
}

// TestRestartAllNodes shuts every node down and starts them again from their data
// dirs: the index, cursors and registry come back, and ingest can go on.
func TestRestartAllNodes(t *testing.T) {
	c := makeCluster(t, 3, func(id string, cfg *Config) { cfg.SnapshotThreshold = 1 << 40 })
	leader := c.leader(10 * time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	streams := testStreams(4)
	ref := ingest.NewApplier(radix.New(radix.Config{}))
	submit := func(n *Node, count int) {
		for _, b := range genBatches(streams, count, 8) {
			if err := n.Submit(ctx, b); err != nil {
				t.Fatal(err)
			}
			ref.Apply(b)
		}
		if err := n.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
	submit(leader, 300)
	if _, err := leader.RegisterWorker(ctx, sampleWorker()); err != nil {
		t.Fatal(err)
	}
	// One node restores from a snapshot plus the log after it, the others from the log.
	if _, _, err := leader.Snapshot(ctx); err != nil {
		t.Fatal(err)
	}
	submit(leader, 100)
	digest := c.waitConverged(20 * time.Second)
	cursors := leader.Applier().Cursors()
	for _, tn := range c.nodes {
		if err := tn.get().Shutdown(ctx); err != nil {
			t.Fatalf("shutdown %s: %v", tn.id, err)
		}
		tn.mu.Lock()
		tn.node = nil
		tn.mu.Unlock()
	}
	for _, tn := range c.nodes {
		c.restart(tn)
	}
	if got := c.waitConverged(30 * time.Second); got != digest || got != ref.Index().Digest() {
		t.Fatal("the restarted cluster's index differs from before")
	}
	leader = c.leader(10 * time.Second)
	if !reflect.DeepEqual(leader.Applier().Cursors(), cursors) {
		t.Error("cursors differ after the restart")
	}
	for _, tn := range c.nodes {
		if ws := tn.get().Workers(); len(ws) != 1 || ws[0].ID != "vllm-0" {
			t.Errorf("%s: registry %v after the restart", tn.id, ws)
		}
	}
	submit(leader, 50)
	if c.waitConverged(20*time.Second) != ref.Index().Digest() {
		t.Error("batches after the restart were not applied as expected")
	}
}

func TestMembershipJoinAndLeave(t *testing.T) {
	c := makeCluster(t, 3, nil)
	leaderTN := c.leaderNode(10 * time.Second)
	leader := leaderTN.get()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := leader.Cluster()
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Members) != 3 {
		t.Fatalf("members %+v, want 3", st.Members)
	}
	for _, m := range st.Members {
		if m.GRPCAddr != "grpc-of-"+m.ID+":7070" || m.Suffrage != SuffrageVoter || m.IsLeader != (m.ID == leader.ID()) {
			t.Errorf("member %+v", m)
		}
	}
	var victim *testNode
	for _, tn := range c.nodes {
		if tn != leaderTN {
			victim = tn
		}
	}
	if _, err := victim.get().Leave(ctx, victim.id); !errors.Is(err, ErrNotLeader) {
		t.Errorf("leave on a follower: %v, want ErrNotLeader", err)
	}
	if _, err := leader.Leave(ctx, victim.id); err != nil {
		t.Fatal(err)
	}
	st, _ = leader.Cluster()
	if len(st.Members) != 2 {
		t.Errorf("after Leave: members %+v, want 2", st.Members)
	}
	if _, ok := leader.fsm.memberAddrs()[victim.id]; ok {
		t.Error("the removed member's gRPC address is still recorded")
	}
	// The removed node shut itself down (ShutdownOnRemove); it comes back and joins.
	c.kill(victim)
	c.restart(victim)
	if _, err := leader.Join(ctx, victim.id, victim.addr, "new-grpc:1", true); err != nil {
		t.Fatal(err)
	}
	if _, err := leader.Join(ctx, victim.id, victim.addr, "new-grpc:1", true); err != nil {
		t.Errorf("joining again: %v", err)
	}
	st, _ = leader.Cluster()
	if len(st.Members) != 3 || leader.fsm.memberAddrs()[victim.id] != "new-grpc:1" {
		t.Errorf("after Join: members %+v", st.Members)
	}
	c.waitConverged(20 * time.Second)

	// The leader asked to remove itself hands leadership over first.
	_, err = leader.Leave(ctx, leader.ID())
	var nle *NotLeaderError
	if !errors.As(err, &nle) || nle.LeaderID == leader.ID() {
		t.Fatalf("leader leaving itself: %v, want a NotLeaderError naming another leader", err)
	}
	next := c.leader(10 * time.Second)
	if next == leader {
		t.Fatal("leadership did not move")
	}
	if _, err := next.Leave(ctx, leader.ID()); err != nil {
		t.Fatal(err)
	}
	st, _ = next.Cluster()
	if len(st.Members) != 2 {
		t.Errorf("after the old leader left: members %+v", st.Members)
	}
}

// TestGracefulShutdownHandsLeadershipOver: the remaining nodes go on with the index.
func TestGracefulShutdownHandsLeadershipOver(t *testing.T) {
	c := makeCluster(t, 3, nil)
	oldTN := c.leaderNode(10 * time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	streams := testStreams(2)
	for _, b := range genBatches(streams, 50, 4) {
		if err := oldTN.get().Submit(ctx, b); err != nil {
			t.Fatal(err)
		}
	}
	if err := oldTN.get().Flush(ctx); err != nil {
		t.Fatal(err)
	}
	digest := c.waitConverged(20 * time.Second)
	start := time.Now()
	if err := oldTN.get().Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	oldTN.mu.Lock()
	oldTN.node = nil
	oldTN.mu.Unlock()
	next := c.leader(10 * time.Second)
	t.Logf("new leader %s accepting batches %v after Shutdown started", next.ID(), time.Since(start))
	if next.Index().Digest() != digest {
		t.Error("the new leader's index differs")
	}
	if err := next.Submit(ctx, genBatches(streams, 1, 4)[0]); err != nil {
		t.Errorf("submit to the new leader: %v", err)
	}
}

// TestNodeStopsOnAnEntryItCannotApply commits an entry of an unknown type through
// raft: each node that applies it stops and says why. The leader applies it
// first and stops; the two others elect one of them, which commits and applies it
// and stops too. The last may never learn that the entry committed (no one is
// left to tell it), but it cannot have applied anything after it.
func TestNodeStopsOnAnEntryItCannotApply(t *testing.T) {
	c := makeCluster(t, 3, nil)
	leader := c.leader(10 * time.Second)
	f := leader.raft.Apply([]byte{entryVersion, 0x42, 0}, 0)
	if err := f.Error(); err != nil {
		t.Fatal(err)
	}
	if r, _ := f.Response().(ApplyResult); !errors.Is(r.Err, ErrFSMStopped) {
		t.Errorf("apply result %+v, want ErrFSMStopped", r)
	}
	bad := f.Index()
	waitFor(t, 20*time.Second, func() bool {
		stopped := 0
		for _, tn := range c.nodes {
			select {
			case <-tn.get().Done():
				stopped++
			default:
			}
		}
		return stopped >= 2
	})
	// Err is set when the FSM stops, before the node has shut down (Done): the
	// last node may be stopping right now.
	for _, tn := range c.nodes {
		n := tn.get()
		if err := n.Err(); err != nil {
			if !errors.Is(err, ErrFSMStopped) || !errors.Is(err, ErrUnknownEntryType) {
				t.Errorf("%s: Err() = %v, want ErrFSMStopped wrapping ErrUnknownEntryType", tn.id, err)
			}
		} else if n.fsm.lastIndex.Load() >= bad {
			t.Errorf("%s runs on and applied up to %d (bad entry %d)", tn.id, n.fsm.lastIndex.Load(), bad)
		}
	}
}

// TestSubmitBlocksWhenThePipelineIsFull holds the apply loop so that nothing
// commits: once MaxInFlight entries wait and the next is full, Submit waits and
// gives up with its context.
func TestSubmitBlocksWhenThePipelineIsFull(t *testing.T) {
	release := make(chan struct{})
	var once sync.Once
	cfg := testConfig()
	cfg.NodeID, cfg.DataDir, cfg.RaftAddr, cfg.Bootstrap = "solo", t.TempDir(), "127.0.0.1:0", true
	cfg.MaxInFlight, cfg.MaxBatchEvents, cfg.MaxBatchWait = 2, 4, time.Millisecond
	hold := make(chan struct{})
	cfg.OnBatch = func(uint64, *ingest.StreamBatch, BatchOutcome, ingest.ApplyResult) {
		once.Do(func() { close(hold) })
		<-release
	}
	n, err := NewNode(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Shutdown(context.Background())
	defer close(release)
	waitFor(t, 20*time.Second, n.IsLeader)
	streams := testStreams(1)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var err2 error
	submitted := 0
	for _, b := range genBatches(streams, 100, 1) {
		if err2 = n.Submit(ctx, b); err2 != nil {
			break
		}
		submitted++
	}
	if !errors.Is(err2, context.DeadlineExceeded) {
		t.Fatalf("submit into a stuck pipeline: %v after %d batches, want DeadlineExceeded", err2, submitted)
	}
	<-hold
	// 2 entries in flight (the first stuck in apply) + 1 full entry waiting, of 4 events each.
	if submitted > 3*4 {
		t.Errorf("%d batches accepted by a pipeline with room for 12", submitted)
	}
}

// TestEntriesCarryManyBatches checks that batching groups batches into entries
// and keeps each entry within MaxBatchEvents (plus the batch that filled it).
func TestEntriesCarryManyBatches(t *testing.T) {
	var mu sync.Mutex
	perEntry := map[uint64]int{}
	batches := 0
	cfg := testConfig()
	cfg.NodeID, cfg.DataDir, cfg.RaftAddr, cfg.Bootstrap = "solo", t.TempDir(), "127.0.0.1:0", true
	cfg.MaxBatchEvents, cfg.MaxBatchWait, cfg.MaxInFlight = 200, 50*time.Millisecond, 1
	cfg.OnBatch = func(index uint64, b *ingest.StreamBatch, _ BatchOutcome, _ ingest.ApplyResult) {
		mu.Lock()
		perEntry[index] += batchEvents(b)
		batches++
		mu.Unlock()
	}
	n, err := NewNode(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Shutdown(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	waitFor(t, 20*time.Second, n.IsLeader)
	const count, size = 1000, 10
	for _, b := range genBatches(testStreams(4), count, size) {
		if err := n.Submit(ctx, b); err != nil {
			t.Fatal(err)
		}
	}
	if err := n.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if batches != count {
		t.Fatalf("%d batches applied, want %d", batches, count)
	}
	if len(perEntry) >= count/2 {
		t.Errorf("%d entries for %d batches: batching did not group them", len(perEntry), count)
	}
	for index, events := range perEntry {
		if events >= cfg.MaxBatchEvents+size {
			t.Errorf("entry %d holds %d events, over MaxBatchEvents %d plus one batch", index, events, cfg.MaxBatchEvents)
		}
	}
	t.Logf("%d batches in %d entries", count, len(perEntry))
}

// TestRunWhileLeaderFollowsLeadership: fn runs on the leader only, its context ends
// when the node is killed, and it runs on the next leader.
func TestRunWhileLeaderFollowsLeadership(t *testing.T) {
	c := makeCluster(t, 3, nil)
	var mu sync.Mutex
	running := map[string]int{}
	starts := map[string]int{}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	for _, tn := range c.nodes {
		n := tn.get()
		wg.Add(1)
		go func() {
			defer wg.Done()
			n.RunWhileLeader(ctx, func(lctx context.Context) {
				mu.Lock()
				running[n.ID()]++
				starts[n.ID()]++
				mu.Unlock()
				if sessionOf(lctx) == nil {
					t.Error("leader context carries no session")
				}
				<-lctx.Done()
				mu.Lock()
				running[n.ID()]--
				mu.Unlock()
			})
		}()
	}
	first := c.leaderNode(10 * time.Second)
	waitFor(t, 10*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return running[first.id] == 1 })
	c.kill(first)
	mu.Lock()
	if running[first.id] != 0 {
		t.Errorf("fn still running on the killed node")
	}
	mu.Unlock()
	second := c.leaderNode(10 * time.Second)
	waitFor(t, 10*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return running[second.id] == 1 })
	cancel()
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	for id, r := range running {
		if r != 0 {
			t.Errorf("%s: fn still running after RunWhileLeader returned", id)
		}
	}
	for _, tn := range c.nodes {
		if tn != first && tn != second && starts[tn.id] != 0 {
			t.Errorf("fn ran on %s, which never led", tn.id)
		}
	}
}

func waitFor(t *testing.T, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %v", timeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

var _ raft.StreamLayer = (*tcpStreamLayer)(nil)

// TestSecondNodeOnADataDirInUseFails checks that a node opened on a data dir
// another node holds fails with ErrDataDirInUse naming the dir, instead of
// waiting for bolt's file lock forever.
func TestSecondNodeOnADataDirInUseFails(t *testing.T) {
	cfg := testConfig()
	cfg.NodeID, cfg.DataDir, cfg.RaftAddr, cfg.Bootstrap = "first", t.TempDir(), "127.0.0.1:0", true
	first, err := NewNode(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Shutdown(context.Background())
	cfg.NodeID = "second"
	done := make(chan error, 1)
	go func() {
		second, err := NewNode(cfg)
		if err == nil {
			second.Shutdown(context.Background())
		}
		done <- err
	}()
	select {
	case err = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("NewNode on a data dir in use did not return")
	}
	if !errors.Is(err, ErrDataDirInUse) || !strings.Contains(err.Error(), cfg.DataDir) {
		t.Errorf("NewNode on a data dir in use: %v, want ErrDataDirInUse naming %s", err, cfg.DataDir)
	}
}

// TestAppliedIndexWaitsForTheFSM holds the FSM inside the apply of a committed
// entry: raft already counts the entry applied (it has queued it for the FSM),
// but AppliedIndex, WaitApplied and LinearizableBarrier must not report it
// before Apply has returned, since Index() does not hold it yet.
func TestAppliedIndexWaitsForTheFSM(t *testing.T) {
	entered := make(chan uint64, 1)
	release := make(chan struct{})
	var releaseOnce sync.Once
	cfg := testConfig()
	cfg.NodeID, cfg.DataDir, cfg.RaftAddr, cfg.Bootstrap = "solo", t.TempDir(), "127.0.0.1:0", true
	cfg.BeforeBatch = func(index uint64, _ *ingest.StreamBatch) {
		select {
		case entered <- index:
			<-release
		default:
		}
	}
	n, err := NewNode(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Shutdown(context.Background())
	defer releaseOnce.Do(func() { close(release) })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for !n.IsLeader() {
		if ctx.Err() != nil {
			t.Fatal("a bootstrapped single node did not become leader")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if _, err := n.RegisterWorker(ctx, sampleWorker()); err != nil {
		t.Fatal(err)
	}
	before := n.AppliedIndex()
	ref := ingest.NewApplier(radix.New(radix.Config{}))
	for _, b := range genBatches(testStreams(2), 40, 4) {
		if err := n.Submit(ctx, b); err != nil {
			t.Fatal(err)
		}
		ref.Apply(b)
	}
	var held uint64
	select {
	case held = <-entered:
	case <-ctx.Done():
		t.Fatal("no stream batch reached the FSM")
	}
	for n.raft.AppliedIndex() < held {
		if ctx.Err() != nil {
			t.Fatal("raft did not count the held entry applied")
		}
		time.Sleep(time.Millisecond)
	}
	if got := n.AppliedIndex(); got >= held || got < before {
		t.Errorf("AppliedIndex %d while the FSM is held in entry %d (raft says %d), want %d..%d",
			got, held, n.raft.AppliedIndex(), before, held-1)
	}
	short, cancelShort := context.WithTimeout(ctx, 50*time.Millisecond)
	if err := n.WaitApplied(short, held); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("WaitApplied(%d) while the FSM is held in it: %v, want it to wait", held, err)
	}
	cancelShort()
	short, cancelShort = context.WithTimeout(ctx, 50*time.Millisecond)
	if err := n.LinearizableBarrier(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("LinearizableBarrier while the FSM is held in entry %d: %v, want it to wait", held, err)
	}
	cancelShort()

	releaseOnce.Do(func() { close(release) })
	if err := n.WaitApplied(ctx, held); err != nil {
		t.Fatal(err)
	}
	if err := n.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if err := n.LinearizableBarrier(ctx); err != nil {
		t.Fatal(err)
	}
	if n.Index().Digest() != ref.Index().Digest() {
		t.Error("index differs from the batches applied directly")
	}
	if got, last := n.AppliedIndex(), n.raft.LastIndex(); got != last {
		t.Errorf("AppliedIndex %d after the barrier, want the last log index %d", got, last)
	}
}
