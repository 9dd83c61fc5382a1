package server

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	kvindexv1 "github.com/kvindex/kvindex/api/proto/kvindex/v1"
	"github.com/kvindex/kvindex/internal/ingest"
	"github.com/kvindex/kvindex/internal/radix"
)

// Backend is everything the API handlers need from the node they run on. The
// single-node server implements it with localBackend; a replicated node
// implements it over raft. Every method is safe for concurrent use. Errors are
// wrapped sentinels of errors.go (ErrNotLeader via *NotLeaderError,
// ErrUnavailable, ErrNotFound, ErrAlreadyExists, ErrNotSupported), so that the
// error table maps them.
type Backend interface {
	// Index is this replica's index. Reads are served from it directly.
	Index() *radix.Index
	// AppliedIndex is the position of the last write whose application to
	// Index() has completed; a read that starts afterwards sees at least that
	// state. It only grows.
	AppliedIndex() uint64
	// Linearizable returns once a read of Index() started afterwards reflects
	// every write committed before the call (raft: leader check and barrier).
	Linearizable(ctx context.Context) error
	// Ready returns nil when the node can serve fresh reads (has a leader and
	// has caught up with it), else an error wrapping ErrUnavailable that says why.
	Ready() error

	// Workers lists the registered workers, ordered by id, with what this node
	// knows of their event streams.
	Workers(ctx context.Context) ([]WorkerStatus, error)
	// RegisterWorker adds spec to the registry; an identical spec already there
	// succeeds, another spec with the same id fails with ErrAlreadyExists. It
	// returns the applied index at which the registration is visible.
	RegisterWorker(ctx context.Context, spec ingest.WorkerSpec) (uint64, error)
	// UnregisterWorker removes a worker and, before it returns, every block it
	// holds; an unknown id fails with ErrNotFound.
	UnregisterWorker(ctx context.Context, id string) (uint64, error)

	// Cluster describes the raft cluster as this node sees it.
	Cluster(ctx context.Context) (ClusterStatus, error)
	// Join adds a node to the cluster; Leave removes one. Both return the
	// applied index of the configuration change.
	Join(ctx context.Context, m JoinRequest) (uint64, error)
	Leave(ctx context.Context, nodeID string) (uint64, error)
	// Snapshot takes a snapshot of this node's state now.
	Snapshot(ctx context.Context) (SnapshotInfo, error)

	// Changes is the feed of index changes that Watch streams. The node's apply
	// path must publish every applied batch to it (see ChangeFeed).
	Changes() *ChangeFeed
}

// WorkerStatus is a registered worker and its event streams as one node sees them.
type WorkerStatus struct {
	Spec  ingest.WorkerSpec
	State kvindexv1.WorkerState
	// Ranks are the dp ranks this node has a position for, ordered by rank.
	Ranks []RankStatus
}

// RankStatus is the applied position of one dp rank's event stream.
type RankStatus struct {
	DPRank  uint32
	LastSeq uint64
}

// ClusterStatus is the raft cluster as one node sees it.
type ClusterStatus struct {
	NodeID       string
	LeaderID     string // empty when no leader is known
	Term         uint64
	CommitIndex  uint64
	AppliedIndex uint64
	Members      []Member // ordered by id
}

// Member is one node of the raft configuration.
type Member struct {
	ID           string
	RaftAddr     string
	GRPCAddr     string
	Voter        bool
	IsLeader     bool
	AppliedIndex uint64 // 0 when unknown
}

// JoinRequest names a node to add to the cluster.
type JoinRequest struct {
	NodeID, RaftAddr, GRPCAddr string
	Voter                      bool
}

// SnapshotInfo describes a snapshot taken.
type SnapshotInfo struct {
	Index     uint64
	SizeBytes uint64
}

// localBackend is the Backend of a single node: the ingest Manager is the
// registry, the feed applier counts the applied index, and there is no raft.
type localBackend struct {
	nodeID   string
	grpcAddr string
	index    *radix.Index
	applier  *ingest.Applier
	fa       *feedApplier
	sink     *ingest.LocalSink
	ingest   *ingest.Manager
	running  *atomic.Bool // the apply loop runs
	// registry serialises RegisterWorker and UnregisterWorker, which check the
	// registry and then change it.
	registry sync.Mutex
}

var _ Backend = (*localBackend)(nil)

func (b *localBackend) Index() *radix.Index  { return b.index }
func (b *localBackend) AppliedIndex() uint64 { return b.fa.Applied() }
func (b *localBackend) Changes() *ChangeFeed { return b.fa.feed }
func (b *localBackend) Linearizable(ctx context.Context) error {
	// One node is its own quorum: what it applied is all that was committed.
	return ctx.Err()
}

func (b *localBackend) Ready() error {
	if !b.ingest.Running() || !b.running.Load() {
		return fmt.Errorf("%w: ingest is starting or stopping", ErrUnavailable)
	}
	return nil
}

func (b *localBackend) Workers(context.Context) ([]WorkerStatus, error) {
	running := b.ingest.Running()
	list := b.ingest.Workers()
	out := make([]WorkerStatus, 0, len(list))
	for _, ws := range list {
		st := WorkerStatus{Spec: ws.Spec, State: workerState(running, ws.Streams)}
		for _, s := range ws.Streams {
			r := RankStatus{DPRank: s.DPRank}
			if c, ok := b.applier.Cursor(ingest.Stream{Worker: ws.Spec.ID, DPRank: s.DPRank}); ok {
				r.LastSeq = c.Seq
			}
			st.Ranks = append(st.Ranks, r)
		}
		out = append(out, st)
	}
	return out, nil
}

func (b *localBackend) lookup(id string) (ingest.WorkerSpec, bool) {
	for _, ws := range b.ingest.Workers() {
		if ws.Spec.ID == id {
			return ws.Spec, true
		}
	}
	return ingest.WorkerSpec{}, false
}

func (b *localBackend) RegisterWorker(_ context.Context, spec ingest.WorkerSpec) (uint64, error) {
	b.registry.Lock()
	defer b.registry.Unlock()
	if old, ok := b.lookup(spec.ID); ok {
		if !old.Equal(spec) {
			return 0, fmt.Errorf("%w: worker %q is registered as %s", ErrAlreadyExists, spec.ID, old.String())
		}
		return b.AppliedIndex(), nil
	}
	if err := b.ingest.AddWorker(spec); err != nil {
		return 0, err
	}
	return b.AppliedIndex(), nil
}

func (b *localBackend) UnregisterWorker(ctx context.Context, id string) (uint64, error) {
	b.registry.Lock()
	defer b.registry.Unlock()
	if _, ok := b.lookup(id); !ok {
		return 0, fmt.Errorf("%w: no worker %q", ErrNotFound, id)
	}
	if !b.running.Load() {
		return 0, fmt.Errorf("%w: the apply loop is not running, so blocks cannot be removed", ErrUnavailable)
	}
	// The Manager queues the removal of the worker's blocks behind the batches
	// already submitted; Flush waits until it is applied.
	b.ingest.RemoveWorker(id)
	if err := b.sink.Flush(ctx); err != nil {
		return 0, fmt.Errorf("%w: removing the blocks of %q: %w", ErrUnavailable, id, err)
	}
	return b.AppliedIndex(), nil
}

func (b *localBackend) Cluster(context.Context) (ClusterStatus, error) {
	applied := b.AppliedIndex()
	return ClusterStatus{
		NodeID: b.nodeID, LeaderID: b.nodeID, Term: 1, CommitIndex: applied, AppliedIndex: applied,
		Members: []Member{{ID: b.nodeID, GRPCAddr: b.grpcAddr, Voter: true, IsLeader: true, AppliedIndex: applied}},
	}, nil
}

func (b *localBackend) Join(context.Context, JoinRequest) (uint64, error) {
	return 0, fmt.Errorf("%w: Join is not available in single-node mode", ErrNotSupported)
}

func (b *localBackend) Leave(context.Context, string) (uint64, error) {
	return 0, fmt.Errorf("%w: Leave is not available in single-node mode", ErrNotSupported)
}

func (b *localBackend) Snapshot(context.Context) (SnapshotInfo, error) {
	return SnapshotInfo{}, fmt.Errorf("%w: Snapshot is not available in single-node mode (the index lives in memory)", ErrNotSupported)
}
