package server

import (
	"context"

	kvindexv1 "github.com/kvindex/kvindex/api/proto/kvindex/v1"
	"github.com/kvindex/kvindex/internal/ingest"
	"github.com/kvindex/kvindex/internal/radix"
	"github.com/kvindex/kvindex/internal/workerspec"
)

// Backend is everything the API handlers need from the node they run on; the
// server implements it over raft (raftBackend). Every method is safe for
// concurrent use. Errors are wrapped sentinels of errors.go (ErrNotLeader via
// *NotLeaderError, ErrUnavailable, ErrNotFound, ErrAlreadyExists,
// ErrFailedPrecondition), so that the error table maps them.
type Backend interface {
	// Index is this replica's index. Reads are served from it directly.
	Index() *radix.Index
	// AppliedIndex is the position of the last write whose application to
	// Index() has completed; a read that starts afterwards sees at least that
	// state. It only grows.
	AppliedIndex() uint64
	// IndexCopy copies Index() between two applied writes and returns the copy
	// with the applied index it is the state of; Digest is the copy's digest
	// (hex SHA-256, radix.Snapshot.Digest) with that applied index.
	IndexCopy() (*radix.Snapshot, uint64)
	Digest() (string, uint64)
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
	RegisterWorker(ctx context.Context, spec workerspec.Spec) (uint64, error)
	// ReplaceWorker replaces the registered spec of spec.ID with spec if it is
	// still expected (a compare-and-set), keeping the worker's blocks; another
	// spec registered fails with ErrConflict, none with ErrNotFound.
	ReplaceWorker(ctx context.Context, expected, spec workerspec.Spec) (uint64, error)
	// UnregisterWorker removes a worker and, before it returns, every block it
	// holds; an unknown id fails with ErrNotFound.
	UnregisterWorker(ctx context.Context, id string) (uint64, error)

	// Leader is the leader as this node knows it, asking no other member: its
	// id and gRPC address (empty when unknown), and whether it is this node.
	Leader() (id, grpcAddr string, self bool)
	// Cluster describes the raft cluster as this node sees it, with each
	// member's applied index and, when withDigest, index digest (asked of
	// the members).
	Cluster(ctx context.Context, withDigest bool) (ClusterStatus, error)
	// Join adds a node to the cluster; Leave removes one. Both return the
	// applied index of the configuration change.
	Join(ctx context.Context, m JoinRequest) (uint64, error)
	Leave(ctx context.Context, nodeID string) (uint64, error)
	// Snapshot takes a snapshot of this node's state now.
	Snapshot(ctx context.Context) (SnapshotInfo, error)

	// FrameInput is where bind-mode frames that followers forward go: this
	// node's ingest, while it leads and ingests (ingest.ErrNotRunning otherwise).
	FrameInput() (*ingest.FrameInput, error)

	// Changes is the feed of index changes that Watch streams. The node's apply
	// path must publish every applied batch to it (see ChangeFeed).
	Changes() *ChangeFeed
}

// WorkerStatus is a registered worker and its event streams as one node sees them.
type WorkerStatus struct {
	Spec  workerspec.Spec
	State kvindexv1.WorkerState
	// Ranks are the dp ranks this node has a position for, ordered by rank.
	Ranks []RankStatus
	// Streams are the worker's event streams as this node's ingest follows
	// them (gaps, replays, resets, lag), ordered by rank; empty unless this
	// node leads and ingests.
	Streams []ingest.StreamStatus
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
	// Digest and DigestApplied: this node's index digest and the applied index
	// it was taken at (empty, 0 without withDigest).
	Digest        string
	DigestApplied uint64
	Members       []Member // ordered by id
}

// Member is one node of the raft configuration.
type Member struct {
	ID           string
	RaftAddr     string
	GRPCAddr     string
	Voter        bool
	IsLeader     bool
	AppliedIndex uint64 // 0 when unknown
	// Digest and DigestApplied as the member reports them ("" and 0 when
	// unknown).
	Digest        string
	DigestApplied uint64
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
