package raftstore

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvindex/kvindex/internal/ingest"
	"github.com/kvindex/kvindex/internal/radix"
	"github.com/kvindex/kvindex/internal/workerspec"
)

// ErrInvalidConfig: a Config value out of range; the message names the field.
var ErrInvalidConfig = errors.New("raftstore: invalid config")

// Config configures a Node. Start from DefaultConfig.
type Config struct {
	// NodeID is this node's raft server id (--node-id), unique in the cluster.
	NodeID string
	// RaftAddr is the host:port the raft transport listens on (--raft-addr).
	RaftAddr string
	// RaftAdvertise is the host:port peers dial to reach this node; empty means
	// RaftAddr, which must then name a specific host (not 0.0.0.0 or ::).
	RaftAdvertise string
	// StreamLayer, when set, replaces the TCP listener on RaftAddr (TLS, tests):
	// the node accepts and dials through it and advertises its Addr().
	StreamLayer raft.StreamLayer
	// GRPCAddr is this node's gRPC address, published to the cluster so that other
	// nodes can forward requests to the leader. Optional.
	GRPCAddr string
	// DataDir holds the raft log and stable store (raft.db) and snapshots.
	DataDir string
	// Bootstrap makes a node with no raft state start a cluster of itself alone
	// (the first node, or a single-node deployment). It is ignored when DataDir
	// already holds state.
	Bootstrap bool

	// Raft timing. Followers start an election after HeartbeatTimeout without
	// contact; a leader steps down after LeaderLeaseTimeout without a quorum.
	HeartbeatTimeout   time.Duration
	ElectionTimeout    time.Duration
	LeaderLeaseTimeout time.Duration
	CommitTimeout      time.Duration

	// MaxAppendEntries is the most entries raft sends in one AppendEntries RPC
	// (1..1024). BatchApplyCh lets raft take up to that many proposals at once.
	MaxAppendEntries int
	BatchApplyCh     bool
	// LogCacheSize is how many recent log entries are kept in memory in front of
	// the bolt store (raft.NewLogCache); 0 disables the cache.
	LogCacheSize int
	// TransportMaxPool is how many idle connections to keep per peer;
	// TransportTimeout bounds one RPC's I/O.
	TransportMaxPool int
	TransportTimeout time.Duration

	// Batching of stream batches into log entries by the leader: an entry is
	// proposed when it holds MaxBatchEvents block events or MaxBatchBytes bytes,
	// or MaxBatchWait after its first batch (0: as soon as a proposal slot is
	// free, so entries grow only while MaxInFlight proposals are pending).
	MaxBatchEvents int
	MaxBatchBytes  int
	MaxBatchWait   time.Duration
	// MaxInFlight is how many proposed entries may wait for commit at once; when
	// all are pending, Submit blocks once the next entry is full (back-pressure).
	// At saturation it sets the commit latency (about MaxInFlight full entries
	// divided by the replicated rate), while full entries reach the rate cap
	// with a few in flight: 16 keeps both (bench/RESULTS.md, the inflight sweep).
	MaxInFlight int

	// Snapshots: raft checks every SnapshotInterval whether SnapshotThreshold
	// entries were committed since the last snapshot and takes one if so, keeping
	// TrailingLogs entries behind it for followers that lag (a follower further
	// behind receives the snapshot). SnapshotRetain snapshots are kept on disk.
	SnapshotThreshold uint64
	SnapshotInterval  time.Duration
	TrailingLogs      uint64
	SnapshotRetain    int

	// Index configures the radix index the node replicates.
	Index radix.Config
	// Logger receives this package's and raft's logs; nil discards them. The
	// caller names the node in it (the server adds node=<id>); NewNode adds nothing.
	Logger *slog.Logger
	// Registerer, when set, receives this node's metrics (kvindex_raft_*). See
	// ExportRaftMetrics for raft's own.
	Registerer prometheus.Registerer
	// OnWorkersChanged is called with the whole registry, sorted by id, each time
	// it changes (register, unregister, snapshot restore) or a worker is declared
	// dead or lives again (Node.DeadWorkers), on every node, from the apply
	// goroutine: it must be quick and must not call back into the Node.
	OnWorkersChanged func([]workerspec.Spec)
	// OnBatch, when set, is told about every committed stream batch (see
	// BatchObserver).
	OnBatch BatchObserver
	// BeforeBatch, when set, is called on the apply goroutine just before a
	// committed stream batch is handed to the Applier (not for batches dropped
	// because their worker was unregistered), so that an observer can read the
	// index as it was before the batch (OnBatch is called after). Same rules as
	// OnBatch.
	BeforeBatch func(index uint64, b *ingest.StreamBatch)
	// OnWorkerRemoved, when set, is called on the apply goroutine after an
	// unregistration removed worker id's blocks, with the entry's log index.
	// Same rules as OnBatch.
	OnWorkerRemoved func(index uint64, id string)
	// OnWorkerDead, when set, is called on the apply goroutine after worker id
	// was declared dead at log index index and its blocks dropped, with the dp
	// ranks whose streams held a position (and were fenced). Same rules as OnBatch.
	OnWorkerDead func(index uint64, id string, ranks []uint32)
	// AfterEntry, when set, is called on the apply goroutine after each
	// command entry was applied, whatever it carried, before the node reports
	// it applied: an observer of the hooks above learns there that every call
	// for the entry at index was made (one entry carries many batches). Same
	// rules as OnBatch.
	AfterEntry func(index uint64)
}

// DefaultConfig returns a configuration for a LAN cluster with the batching the
// throughput measurements in docs/design.md favour; set NodeID, RaftAddr and DataDir.
func DefaultConfig() Config {
	return Config{
		RaftAddr:           "127.0.0.1:7090",
		HeartbeatTimeout:   1000 * time.Millisecond,
		ElectionTimeout:    1000 * time.Millisecond,
		LeaderLeaseTimeout: 500 * time.Millisecond,
		CommitTimeout:      50 * time.Millisecond,
		MaxAppendEntries:   512,
		BatchApplyCh:       true,
		LogCacheSize:       1024,
		TransportMaxPool:   3,
		TransportTimeout:   10 * time.Second,
		MaxBatchEvents:     4096,
		MaxBatchBytes:      256 << 10,
		MaxBatchWait:       2 * time.Millisecond,
		MaxInFlight:        16,
		SnapshotThreshold:  4096,
		SnapshotInterval:   30 * time.Second,
		TrailingLogs:       2048,
		SnapshotRetain:     2,
	}
}

// Bounds hashicorp/raft's ValidateConfig enforces (its maxAppendEntries and
// its minimum for the heartbeat, election and lease timeouts).
const (
	raftMaxAppendEntries = 1024
	raftMinTimeout       = 5 * time.Millisecond
)

// Validate checks every field; the error names the first bad one and its value.
func (c *Config) Validate() error {
	bad := func(field string, v any, want string) error {
		return fmt.Errorf("%w: %s = %v, want %s", ErrInvalidConfig, field, v, want)
	}
	switch {
	case c.NodeID == "" || len(c.NodeID) > maxNameLen:
		return bad("NodeID", fmt.Sprintf("%q", c.NodeID), fmt.Sprintf("1..%d bytes", maxNameLen))
	case len(c.GRPCAddr) > maxStringLen:
		return bad("GRPCAddr", fmt.Sprintf("%.64q...", c.GRPCAddr), fmt.Sprintf("at most %d bytes", maxStringLen))
	case c.StreamLayer == nil && c.RaftAddr == "":
		return bad("RaftAddr", `""`, "host:port (or a StreamLayer)")
	case c.DataDir == "":
		return bad("DataDir", `""`, "a directory")
	case c.MaxBatchEvents < 1:
		return bad("MaxBatchEvents", c.MaxBatchEvents, ">= 1")
	case c.MaxBatchBytes < 1024:
		return bad("MaxBatchBytes", c.MaxBatchBytes, ">= 1024")
	case c.MaxBatchWait < 0:
		return bad("MaxBatchWait", c.MaxBatchWait, ">= 0")
	case c.MaxInFlight < 1:
		return bad("MaxInFlight", c.MaxInFlight, ">= 1")
	case c.LogCacheSize < 0:
		return bad("LogCacheSize", c.LogCacheSize, ">= 0")
	case c.TransportMaxPool < 1:
		return bad("TransportMaxPool", c.TransportMaxPool, ">= 1")
	case c.TransportTimeout <= 0:
		return bad("TransportTimeout", c.TransportTimeout, "> 0")
	case c.SnapshotRetain < 1:
		return bad("SnapshotRetain", c.SnapshotRetain, ">= 1")
	case c.SnapshotThreshold < 1:
		return bad("SnapshotThreshold", c.SnapshotThreshold, ">= 1")
	// hashicorp/raft's own checks (raft.ValidateConfig below), made here so
	// that the error names the value: raft's says only "is too large".
	case c.MaxAppendEntries < 1 || c.MaxAppendEntries > raftMaxAppendEntries:
		return bad("MaxAppendEntries", c.MaxAppendEntries, fmt.Sprintf("1..%d", raftMaxAppendEntries))
	case c.HeartbeatTimeout < raftMinTimeout:
		return bad("HeartbeatTimeout", c.HeartbeatTimeout, ">= "+raftMinTimeout.String())
	case c.ElectionTimeout < raftMinTimeout:
		return bad("ElectionTimeout", c.ElectionTimeout, ">= "+raftMinTimeout.String())
	case c.LeaderLeaseTimeout < raftMinTimeout:
		return bad("LeaderLeaseTimeout", c.LeaderLeaseTimeout, ">= "+raftMinTimeout.String())
	case c.CommitTimeout < time.Millisecond:
		return bad("CommitTimeout", c.CommitTimeout, ">= 1ms")
	}
	if err := raft.ValidateConfig(c.raftConfig()); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return nil
}

func (c *Config) raftConfig() *raft.Config {
	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(c.NodeID)
	rc.HeartbeatTimeout = c.HeartbeatTimeout
	rc.ElectionTimeout = c.ElectionTimeout
	rc.LeaderLeaseTimeout = c.LeaderLeaseTimeout
	rc.CommitTimeout = c.CommitTimeout
	rc.MaxAppendEntries = c.MaxAppendEntries
	rc.BatchApplyCh = c.BatchApplyCh
	rc.SnapshotThreshold = c.SnapshotThreshold
	rc.SnapshotInterval = c.SnapshotInterval
	rc.TrailingLogs = c.TrailingLogs
	return rc
}
