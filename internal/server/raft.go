package server

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	kvindexv1 "github.com/kvindex/kvindex/api/proto/kvindex/v1"
	"github.com/kvindex/kvindex/internal/ingest"
	"github.com/kvindex/kvindex/internal/radix"
	"github.com/kvindex/kvindex/internal/raftstore"
	"github.com/kvindex/kvindex/internal/retry"
	"github.com/kvindex/kvindex/internal/workerspec"
)

// raftBackend is the Backend of a member of a raft cluster (a single node is a
// cluster of one). Reads come from this replica's index, as of its applied
// index. Writes go through the replicated log on the leader; a follower forwards
// them to the leader over gRPC (onLeader). Ingest runs on the leader only
// (runIngest), and every node mirrors the replicated worker registry into its
// ingest Manager (followRegistry), so whichever node leads next follows the
// same workers, resuming each stream from the replicated cursors.
type raftBackend struct {
	node   *raftstore.Node // set by New before the backend serves
	ingest *ingest.Manager
	health *healthProber // nil when --worker-dead-after is 0
	feed   *ChangeFeed
	peers  *peers
	log    *slog.Logger
	nodeID string

	// index is the node's index for the apply hooks, which may run before New
	// has the node (raft replays while NewNode starts).
	index atomic.Pointer[radix.Index]
	// prepared is what the change feed resolved for the batch being applied,
	// from beforeBatch to afterBatch; apply goroutine only.
	prepared *PreparedBatch

	// onRegistry, once set, is called on the apply goroutine after every registry
	// change (the API drops its registry view); it must not block.
	onRegistry atomic.Pointer[func()]

	regMu      sync.Mutex
	registry   []workerspec.Spec // the replicated registry as last applied; guarded by regMu
	regChanged chan struct{}     // capacity 1: registry changed since followRegistry last looked

	conflicts sync.Map // worker id -> spec string whose registry conflict was logged

	// kube, when --kube-selector is set, registers the engine pods while this
	// node leads (kubeworkers.go).
	kube *kubeWorkers

	digests digests

	// readiness: see readiness.go.
	readyMaxLag    uint64
	contactTimeout time.Duration
	leaderAsks     leaderAsks
}

var _ Backend = (*raftBackend)(nil)

const (
	// leaderWait bounds how long a write waits for a leader to be known (an
	// election) and a forwarded write for this node to apply it too.
	leaderWait = 5 * time.Second
	// publishInterval is how often the leader registers the workers its ingest
	// learnt of outside the registry (configuration, discovery).
	publishInterval = 500 * time.Millisecond
	// progressTimeout bounds the question Cluster asks each member about its
	// applied index.
	progressTimeout = time.Second
)

func (b *raftBackend) Index() *radix.Index  { return b.node.Index() }
func (b *raftBackend) AppliedIndex() uint64 { return b.node.AppliedIndex() }
func (b *raftBackend) Changes() *ChangeFeed { return b.feed }

func (b *raftBackend) IndexCopy() (*radix.Snapshot, uint64) { return b.node.IndexCopy() }
func (b *raftBackend) Digest() (string, uint64)             { return b.digests.get() }

// fromRaft maps raftstore's errors to the API's sentinels.
func fromRaft(err error) error {
	var nl *raftstore.NotLeaderError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &nl):
		return &NotLeaderError{LeaderID: nl.LeaderID, LeaderAddr: nl.LeaderGRPCAddr}
	case errors.Is(err, raftstore.ErrWorkerExists):
		return fmt.Errorf("%w: %w", ErrAlreadyExists, err)
	case errors.Is(err, raftstore.ErrUnknownWorker):
		return fmt.Errorf("%w: %w", ErrNotFound, err)
	case errors.Is(err, raftstore.ErrWorkerChanged):
		return fmt.Errorf("%w: %w", ErrConflict, err)
	case errors.Is(err, raftstore.ErrInvalidWorker), errors.Is(err, raftstore.ErrInvalidConfig):
		return fmt.Errorf("%w: %w", ErrInvalidArgument, err)
	case errors.Is(err, raftstore.ErrShutdown), errors.Is(err, raftstore.ErrFSMStopped):
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return err
}

// Linearizable proves this node still leads (a heartbeat round with a quorum)
// and waits until every batch it proposed before is applied here; a follower
// answers with a NotLeaderError naming the leader, where the read must go.
func (b *raftBackend) Linearizable(ctx context.Context) error {
	if err := b.node.LinearizableBarrier(ctx); err != nil {
		return fromRaft(err)
	}
	return fromRaft(b.node.Flush(ctx))
}

// Workers lists the replicated registry with each stream's replicated cursor.
// Only the leader follows the engines, so only the leader reports their
// connection state; followers leave it unspecified, except for dead workers,
// which every replica knows (the state is replicated).
func (b *raftBackend) Workers(context.Context) ([]WorkerStatus, error) {
	specs := b.node.Workers()
	dead := b.node.DeadWorkers()
	ranks := map[string][]RankStatus{}
	for s, c := range b.node.Applier().Cursors() {
		ranks[s.Worker] = append(ranks[s.Worker], RankStatus{DPRank: s.DPRank, LastSeq: c.Seq})
	}
	var streams map[string][]ingest.StreamStatus
	leading := b.node.IsLeader() && b.ingest.Running()
	if leading {
		streams = map[string][]ingest.StreamStatus{}
		for _, ws := range b.ingest.Workers() {
			streams[ws.Spec.ID] = ws.Streams
		}
	}
	out := make([]WorkerStatus, len(specs))
	for i, spec := range specs {
		out[i] = WorkerStatus{Spec: spec, Ranks: ranks[spec.ID]}
		slices.SortFunc(out[i].Ranks, func(x, y RankStatus) int { return cmp.Compare(x.DPRank, y.DPRank) })
		if leading {
			out[i].State = workerState(true, streams[spec.ID])
			out[i].Streams = streams[spec.ID]
		}
		if _, ok := dead[spec.ID]; ok {
			out[i].State = kvindexv1.WorkerState_WORKER_STATE_DEAD
		}
	}
	return out, nil
}

func (b *raftBackend) RegisterWorker(ctx context.Context, spec workerspec.Spec) (uint64, error) {
	return b.onLeader(ctx, func() (uint64, error) {
		index, err := b.node.RegisterWorker(ctx, spec)
		if errors.Is(err, raftstore.ErrWorkerExists) {
			if old, ok := b.node.Worker(spec.ID); ok {
				return 0, fmt.Errorf("%w: worker %q is registered as %s", ErrAlreadyExists, spec.ID, old.String())
			}
		}
		return index, err
	}, func(ctx context.Context, c kvindexv1.AdminServiceClient) (uint64, error) {
		resp, err := c.RegisterWorker(ctx, &kvindexv1.RegisterWorkerRequest{Worker: specProto(spec)})
		return resp.GetAppliedIndex(), err
	})
}

// ReplaceWorker swaps a worker's spec through the log if it is still expected.
func (b *raftBackend) ReplaceWorker(ctx context.Context, expected, spec workerspec.Spec) (uint64, error) {
	return b.onLeader(ctx, func() (uint64, error) {
		return b.node.ReplaceWorker(ctx, expected, spec)
	}, func(ctx context.Context, c kvindexv1.AdminServiceClient) (uint64, error) {
		resp, err := c.RegisterWorker(ctx, &kvindexv1.RegisterWorkerRequest{Worker: specProto(spec), Expected: specProto(expected)})
		return resp.GetAppliedIndex(), err
	})
}

// UnregisterWorker removes a worker through the log; every replica drops its
// blocks when the entry applies. A worker this node's configuration declares
// cannot be: the leader would register it again at once.
func (b *raftBackend) UnregisterWorker(ctx context.Context, id string) (uint64, error) {
	for _, ws := range b.ingest.Workers() {
		if ws.Spec.ID == id && (ws.Source == ingest.SourceFlag || ws.Source == ingest.SourceFile) {
			return 0, fmt.Errorf("%w: worker %q is given by the configuration of node %s (%s): remove it from every node's configuration, then unregister it",
				ErrFailedPrecondition, id, b.nodeID, ws.Source)
		}
	}
	if cur, ok := b.node.Worker(id); ok && b.kube != nil && isKubeWorker(cur) {
		return 0, fmt.Errorf("%w: worker %q: %w", ErrFailedPrecondition, id, errKubeWorker)
	}
	return b.onLeader(ctx, func() (uint64, error) {
		return b.node.UnregisterWorker(ctx, id)
	}, func(ctx context.Context, c kvindexv1.AdminServiceClient) (uint64, error) {
		resp, err := c.UnregisterWorker(ctx, &kvindexv1.UnregisterWorkerRequest{WorkerId: id})
		return resp.GetAppliedIndex(), err
	})
}

func (b *raftBackend) Join(ctx context.Context, m JoinRequest) (uint64, error) {
	return b.onLeader(ctx, func() (uint64, error) {
		return b.node.Join(ctx, m.NodeID, m.RaftAddr, m.GRPCAddr, m.Voter)
	}, func(ctx context.Context, c kvindexv1.AdminServiceClient) (uint64, error) {
		suffrage := kvindexv1.Suffrage_SUFFRAGE_VOTER
		if !m.Voter {
			suffrage = kvindexv1.Suffrage_SUFFRAGE_NONVOTER
		}
		resp, err := c.Join(ctx, &kvindexv1.JoinRequest{NodeId: m.NodeID, RaftAddr: m.RaftAddr, GrpcAddr: m.GRPCAddr, Suffrage: suffrage})
		return resp.GetAppliedIndex(), err
	})
}

// Leave removes a member; asked of the leader about itself, the leader hands
// leadership over first and the request follows it to the new leader.
func (b *raftBackend) Leave(ctx context.Context, nodeID string) (uint64, error) {
	return b.onLeader(ctx, func() (uint64, error) {
		return b.node.Leave(ctx, nodeID)
	}, func(ctx context.Context, c kvindexv1.AdminServiceClient) (uint64, error) {
		resp, err := c.Leave(ctx, &kvindexv1.LeaveRequest{NodeId: nodeID})
		return resp.GetAppliedIndex(), err
	})
}

func (b *raftBackend) Snapshot(ctx context.Context) (SnapshotInfo, error) {
	index, size, err := b.node.Snapshot(ctx)
	switch {
	case err == nil:
	case ctx.Err() != nil, errors.Is(err, raftstore.ErrNotLeader), errors.Is(err, raftstore.ErrShutdown):
		return SnapshotInfo{}, fromRaft(err)
	default: // raft refuses a snapshot while, e.g., a configuration change applies: try again
		return SnapshotInfo{}, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return SnapshotInfo{Index: index, SizeBytes: uint64(size)}, nil
}

// Leader is the leader in this node's own view of the configuration.
func (b *raftBackend) Leader() (id, grpcAddr string, self bool) {
	st, err := b.node.Cluster() // this node's view only
	if err != nil || st.LeaderID == "" {
		return "", "", false
	}
	for _, m := range st.Members {
		if m.ID == st.LeaderID {
			grpcAddr = m.GRPCAddr
		}
	}
	return st.LeaderID, grpcAddr, st.LeaderID == st.NodeID
}

// Cluster reports the raft configuration as this node sees it, with each
// member's applied index as the member itself reports it (0 for members that
// do not answer within progressTimeout). A member asking another answers from
// its own state only.
func (b *raftBackend) Cluster(ctx context.Context, withDigest bool) (ClusterStatus, error) {
	st, err := b.node.Cluster()
	if err != nil {
		return ClusterStatus{}, fromRaft(err)
	}
	cs := ClusterStatus{
		NodeID: st.NodeID, LeaderID: st.LeaderID, Term: st.Term, CommitIndex: st.CommitIndex, AppliedIndex: st.AppliedIndex,
		Members: make([]Member, len(st.Members)),
	}
	if withDigest {
		cs.Digest, cs.DigestApplied = b.Digest()
	}
	for i, m := range st.Members {
		cs.Members[i] = Member{
			ID: m.ID, RaftAddr: m.RaftAddr, GRPCAddr: m.GRPCAddr, Voter: m.Suffrage == raftstore.SuffrageVoter,
			IsLeader: m.IsLeader, AppliedIndex: m.AppliedIndex,
		}
		if m.ID == b.nodeID {
			cs.Members[i].Digest, cs.Members[i].DigestApplied = cs.Digest, cs.DigestApplied
		}
	}
	if fromPeer(ctx) {
		return cs, nil
	}
	var wg sync.WaitGroup
	for i := range cs.Members {
		m := &cs.Members[i]
		if m.ID == b.nodeID || m.GRPCAddr == "" {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			actx, cancel := context.WithTimeout(ctx, progressTimeout)
			defer cancel()
			actx, c, err := b.peers.admin(actx, m.GRPCAddr, true)
			if err != nil {
				return
			}
			if resp, err := c.Cluster(actx, &kvindexv1.ClusterRequest{WithoutDigest: !withDigest}); err == nil && resp.NodeId == m.ID {
				m.AppliedIndex, m.Digest, m.DigestApplied = resp.AppliedIndex, resp.IndexDigest, resp.DigestAppliedIndex
			}
		}()
	}
	wg.Wait()
	return cs, nil
}

// onLeader runs a write here when this node leads (local) and otherwise on the
// leader through its gRPC API (remote), then waits (up to leaderWait) until this
// node has applied the write too, so that a read here that follows sees it
// (failing with ErrUnavailable when it has not: see waitForwarded). A
// request from another member is never forwarded again. While no leader is
// known, or the leader moved, it tries again for up to leaderWait.
func (b *raftBackend) onLeader(ctx context.Context, local func() (uint64, error),
	remote func(context.Context, kvindexv1.AdminServiceClient) (uint64, error)) (uint64, error) {
	deadline := time.Now().Add(leaderWait)
	for attempt := 0; ; attempt++ {
		index, err := local()
		var nl *raftstore.NotLeaderError
		if !errors.As(err, &nl) || fromPeer(ctx) {
			return index, fromRaft(err)
		}
		err = fromRaft(err)
		if nl.LeaderGRPCAddr != "" && nl.LeaderID != b.nodeID {
			if index, err = b.forward(ctx, nl.LeaderGRPCAddr, remote); !errors.Is(err, ErrNotLeader) {
				if err == nil {
					err = b.waitForwarded(ctx, index)
				}
				return index, err
			}
		}
		if time.Now().After(deadline) {
			return 0, err
		}
		if werr := retry.Default.Wait(ctx, attempt); werr != nil {
			return 0, cmp.Or(ctx.Err(), err)
		}
	}
}

// waitForwarded waits (up to leaderWait) until this node has applied the
// forwarded write the leader committed at index. A write that is committed but
// not applied here is not reported as done: the caller's next read here could
// miss it. The error says it is committed, so a retry is known to be safe.
func (b *raftBackend) waitForwarded(ctx context.Context, index uint64) error {
	wctx, cancel := context.WithTimeout(ctx, leaderWait)
	defer cancel()
	err := b.node.WaitApplied(wctx, index)
	if err == nil {
		return nil
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return fmt.Errorf("%w: the leader committed the write at index %d, but this node (%s) has not applied it within %v (applied index %d): reads here may not show it yet; ask again, or read from the leader",
		ErrUnavailable, index, b.nodeID, leaderWait, b.node.AppliedIndex())
}

func (b *raftBackend) forward(ctx context.Context, addr string, remote func(context.Context, kvindexv1.AdminServiceClient) (uint64, error)) (uint64, error) {
	pctx, c, err := b.peers.admin(ctx, addr, true)
	if err != nil {
		return 0, err
	}
	index, err := remote(pctx, c)
	return index, fromRemote(addr, err)
}

// FrameInput is this node's ingest input for forwarded bind-mode frames, while
// it leads and its ingest runs.
func (b *raftBackend) FrameInput() (*ingest.FrameInput, error) {
	if !b.node.IsLeader() {
		return nil, ingest.ErrNotRunning
	}
	return b.ingest.NewFrameInput(ingest.SourceForwarded)
}

// The apply hooks (raftstore.Config) feed the change feed and the registry
// mirror. They run on raft's apply goroutine and never block.

func (b *raftBackend) beforeBatch(index uint64, batch *ingest.StreamBatch) {
	if ix := b.index.Load(); ix != nil {
		b.prepared = b.feed.Prepare(ix, batch, index)
	}
}

func (b *raftBackend) afterBatch(index uint64, _ *ingest.StreamBatch, outcome raftstore.BatchOutcome, _ ingest.ApplyResult) {
	p := b.prepared
	b.prepared = nil
	if ix := b.index.Load(); ix != nil {
		b.feed.Commit(p, ix, index, outcome == raftstore.BatchApplied)
	}
}

func (b *raftBackend) workerRemoved(index uint64, id string) { b.feed.WorkerRemoved(id, index) }

func (b *raftBackend) workerDead(index uint64, id string, ranks []uint32) {
	b.feed.WorkerDead(id, ranks, index)
}

func (b *raftBackend) workersChanged(list []workerspec.Spec) {
	b.feed.WorkersChanged(list)
	if f := b.onRegistry.Load(); f != nil {
		(*f)()
	}
	b.regMu.Lock()
	b.registry = list
	b.regMu.Unlock()
	select {
	case b.regChanged <- struct{}{}:
	default:
	}
}

// followRegistry mirrors the replicated registry into this node's ingest
// Manager until ctx ends: registered workers are added (and, on the leader,
// dialled at once), unregistered ones removed. Workers the Manager has from
// this node's configuration are left alone; discovered ones are removed when
// the registry drops them after having held them.
func (b *raftBackend) followRegistry(ctx context.Context) {
	held := map[string]bool{} // ids in the registry as last mirrored
	for {
		select {
		case <-b.regChanged:
		case <-ctx.Done():
			return
		}
		b.regMu.Lock()
		list := b.registry
		b.regMu.Unlock()
		want := make(map[string]bool, len(list))
		have := map[string]ingest.WorkerStatus{}
		for _, ws := range b.ingest.Workers() {
			have[ws.Spec.ID] = ws
		}
		for _, spec := range list {
			want[spec.ID] = true
			if h, ok := have[spec.ID]; ok && h.Spec.Equal(spec) {
				continue
			}
			if err := b.ingest.AddWorker(spec); err != nil {
				b.logConflict(spec, err)
			}
		}
		for id, h := range have {
			if want[id] {
				continue
			}
			if h.Source == ingest.SourceRegistry || (h.Source == ingest.SourceDiscover && held[id]) {
				b.ingest.RemoveWorker(id)
			}
		}
		held = want
	}
}

// logConflict logs, once per worker spec, that the registry and this node's
// configuration disagree about a worker.
func (b *raftBackend) logConflict(spec workerspec.Spec, err error) {
	if prev, seen := b.conflicts.Swap(spec.ID, spec.String()); !seen || prev != spec.String() {
		b.log.Warn("the replicated registry and this node's configuration disagree about a worker; the configuration wins here",
			"worker", spec.ID, "registry", spec.String(), "err", err)
	}
}

// publishWorkers registers the workers this node's ingest knows from its
// configuration (--worker, --workers-file) or found on the bind socket or NATS,
// so that every replica scores them and the next leader follows them. Leader
// only; a worker the registry holds with another spec is left as it is (logged).
func (b *raftBackend) publishWorkers(ctx context.Context) {
	for _, ws := range b.ingest.Workers() {
		if ws.Source == ingest.SourceRegistry {
			continue
		}
		cur, registered := b.node.Worker(ws.Spec.ID)
		switch {
		case registered && cur.Equal(ws.Spec):
		case registered && ws.Source != ingest.SourceDiscover:
			b.logConflict(cur, fmt.Errorf("configured here as %s", ws.Spec.String()))
		case !registered:
			if _, err := b.node.RegisterWorker(ctx, ws.Spec); err != nil && ctx.Err() == nil {
				b.log.Warn("registering a worker in the replicated registry", "worker", ws.Spec.ID, "source", ws.Source, "err", err)
			}
		}
	}
}

// runIngest runs the ingest Manager while this node leads, until ctx ends:
// with the node as its Sink and the replicated cursors as where each stream
// resumes. fail is told when ingest stops for another reason than the end of
// the leadership.
func (b *raftBackend) runIngest(ctx context.Context, fail func(string, error)) {
	b.node.RunWhileLeader(ctx, func(lctx context.Context) {
		b.publishWorkers(lctx)
		var wg sync.WaitGroup
		if b.health != nil {
			wg.Add(1)
			go func() {
				defer wg.Done()
				b.health.run(lctx)
			}()
		}
		if b.kube != nil {
			wg.Go(func() { b.kube.run(lctx) })
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := time.NewTicker(publishInterval)
			defer t.Stop()
			for {
				select {
				case <-lctx.Done():
					return
				case <-t.C:
					b.publishWorkers(lctx)
				}
			}
		}()
		err := b.ingest.Run(lctx, b.node, b.node.Applier())
		wg.Wait()
		if err != nil && lctx.Err() == nil {
			fail("ingest", err)
		}
	})
}
