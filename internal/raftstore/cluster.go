package raftstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/hashicorp/raft"
)

// Suffrage values of Member.Suffrage.
const (
	SuffrageVoter    = "voter"
	SuffrageNonvoter = "nonvoter"
	SuffrageStaging  = "staging"
)

// Member is one server of the raft configuration.
type Member struct {
	ID       string
	RaftAddr string
	GRPCAddr string // empty when the member never published it
	Suffrage string // SuffrageVoter, SuffrageNonvoter or SuffrageStaging
	IsLeader bool
	// AppliedIndex is known only for the node that answers (0 for the others: raft
	// does not report followers' progress; ask them).
	AppliedIndex uint64
}

// ClusterStatus is the cluster as one node sees it.
type ClusterStatus struct {
	NodeID       string
	State        string // Leader, Follower, Candidate, Shutdown
	LeaderID     string // empty when no leader is known
	LeaderAddr   string
	Term         uint64
	CommitIndex  uint64
	AppliedIndex uint64
	LastIndex    uint64 // last log index stored here
	// LastContact is when this node last heard from a leader (AppendEntries,
	// heartbeat or snapshot); zero on the leader and before any contact since
	// the node started.
	LastContact time.Time
	Members     []Member
}

// Cluster reports the raft configuration, leadership and progress as this node
// knows them. It works on every node.
func (n *Node) Cluster() (ClusterStatus, error) {
	f := n.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return ClusterStatus{}, fmt.Errorf("raftstore: reading configuration: %w", err)
	}
	st := ClusterStatus{
		NodeID:       n.cfg.NodeID,
		State:        n.raft.State().String(),
		Term:         n.raft.CurrentTerm(),
		CommitIndex:  n.raft.CommitIndex(),
		AppliedIndex: n.AppliedIndex(),
		LastIndex:    n.raft.LastIndex(),
		LastContact:  n.raft.LastContact(),
	}
	st.LeaderID, st.LeaderAddr = n.Leader()
	addrs := n.fsm.memberAddrs()
	for _, s := range f.Configuration().Servers {
		m := Member{
			ID: string(s.ID), RaftAddr: string(s.Address), GRPCAddr: addrs[string(s.ID)],
			Suffrage: suffrageName(s.Suffrage), IsLeader: string(s.ID) == st.LeaderID,
		}
		if m.ID == n.cfg.NodeID {
			m.AppliedIndex = st.AppliedIndex
		}
		st.Members = append(st.Members, m)
	}
	slices.SortFunc(st.Members, func(a, b Member) int { return cmp.Compare(a.ID, b.ID) })
	return st, nil
}

func suffrageName(s raft.ServerSuffrage) string {
	switch s {
	case raft.Voter:
		return SuffrageVoter
	case raft.Nonvoter:
		return SuffrageNonvoter
	}
	return SuffrageStaging
}

// ErrHasState: Bootstrap found raft state (a log, a term or a snapshot) here,
// restored from the data dir or received from a leader since the node started.
var ErrHasState = errors.New("raftstore: the node has raft state")

// Bootstrap starts a cluster of this node alone, as Config.Bootstrap does at
// start, for a node started without it that has decided since (after asking
// the other would-be members). It fails with ErrHasState when the node has any
// raft state: raft checks this on its own goroutine, the one that also takes a
// leader's AppendEntries, so a node a leader reached first is never
// bootstrapped into a second cluster.
func (n *Node) Bootstrap(ctx context.Context) error {
	boot := raft.Configuration{Servers: []raft.Server{{
		Suffrage: raft.Voter, ID: raft.ServerID(n.cfg.NodeID), Address: n.transport.LocalAddr(),
	}}}
	err := n.await(ctx, n.raft.BootstrapCluster(boot))
	switch {
	case errors.Is(err, raft.ErrCantBootstrap):
		return fmt.Errorf("%w: %w", ErrHasState, err)
	case err != nil:
		return fmt.Errorf("raftstore: bootstrap: %w", err)
	}
	return nil
}

// Join adds node id at raftAddr to the cluster as a voter (or a non-voter) and
// records its gRPC address (optional). Leader only: elsewhere it fails with a
// *NotLeaderError naming the leader. Joining again as it is is a no-op; joining
// again with another suffrage changes it (a voter joining as a non-voter is
// demoted: it keeps its log and stops voting; the leader asked to demote itself
// hands leadership over first, as Leave does). Another node already at raftAddr
// under a different id is removed first, with its gRPC address (a node that came
// back with a new id). It returns the log index of the change.
func (n *Node) Join(ctx context.Context, id, raftAddr, grpcAddr string, voter bool) (uint64, error) {
	if id == "" || len(id) > maxNameLen || raftAddr == "" || len(grpcAddr) > maxStringLen {
		return 0, fmt.Errorf("%w: join needs a node id of 1..%d bytes, a raft address and a gRPC address of at most %d bytes (got %.64q, %.64q, %d bytes)",
			ErrInvalidConfig, maxNameLen, maxStringLen, id, raftAddr, len(grpcAddr))
	}
	if n.raft.State() != raft.Leader {
		return 0, n.notLeader(nil)
	}
	cf := n.raft.GetConfiguration()
	if err := n.await(ctx, cf); err != nil {
		return 0, err
	}
	present, demote := false, false
	var replaced []string // other members at raftAddr
	for _, s := range cf.Configuration().Servers {
		switch {
		case string(s.ID) == id:
			present = string(s.Address) == raftAddr && (s.Suffrage == raft.Voter) == voter
			demote = s.Suffrage == raft.Voter && !voter
		case string(s.Address) == raftAddr:
			if string(s.ID) == n.cfg.NodeID {
				return 0, fmt.Errorf("%w: %s cannot join at %s, the leader's own raft address", ErrInvalidConfig, id, raftAddr)
			}
			replaced = append(replaced, string(s.ID))
		}
	}
	if demote && id == n.cfg.NodeID {
		return 0, n.handOver(ctx, fmt.Errorf("leadership handed over so that %s can be demoted", id))
	}
	var index uint64
	for _, old := range replaced {
		i, err := n.removeMember(ctx, old)
		if err != nil {
			return 0, fmt.Errorf("raftstore: removing %s, which had address %s: %w", old, raftAddr, err)
		}
		index = i
	}
	if !present {
		var f raft.IndexFuture
		switch {
		case voter:
			// Adds, promotes a non-voter, or moves a voter to raftAddr.
			f = n.raft.AddVoter(raft.ServerID(id), raft.ServerAddress(raftAddr), 0, 0)
		case demote:
			// AddNonvoter of a voter only moves it to raftAddr (which it
			// already has when only the suffrage changes): DemoteVoter demotes.
			if err := n.await(ctx, n.raft.AddNonvoter(raft.ServerID(id), raft.ServerAddress(raftAddr), 0, 0)); err != nil {
				return 0, fmt.Errorf("raftstore: moving %s to %s: %w", id, raftAddr, err)
			}
			f = n.raft.DemoteVoter(raft.ServerID(id), 0, 0)
		default:
			f = n.raft.AddNonvoter(raft.ServerID(id), raft.ServerAddress(raftAddr), 0, 0)
		}
		if err := n.await(ctx, f); err != nil {
			return 0, fmt.Errorf("raftstore: adding %s at %s: %w", id, raftAddr, err)
		}
		index = f.Index()
		n.log.Info("member joined", "id", id, "raft_addr", raftAddr, "voter", voter, "demoted", demote)
	}
	if grpcAddr != "" && n.fsm.memberAddrs()[id] != grpcAddr {
		_, i, err := n.proposeEntry(ctx, &Entry{Type: EntryMemberAddr, ID: id, GRPCAddr: grpcAddr})
		if err != nil {
			return 0, fmt.Errorf("raftstore: recording %s's gRPC address: %w", id, err)
		}
		index = i
	}
	if index == 0 {
		index = n.AppliedIndex()
	}
	return index, nil
}

// removeMember removes member id from the raft configuration and its gRPC
// address from the member table; it returns the log index of the last change.
func (n *Node) removeMember(ctx context.Context, id string) (uint64, error) {
	f := n.raft.RemoveServer(raft.ServerID(id), 0, 0)
	if err := n.await(ctx, f); err != nil {
		return 0, err
	}
	index := f.Index()
	if _, ok := n.fsm.memberAddrs()[id]; ok {
		_, i, err := n.proposeEntry(ctx, &Entry{Type: EntryMemberRemoved, ID: id})
		if err != nil {
			return 0, fmt.Errorf("forgetting %s's gRPC address: %w", id, err)
		}
		index = i
	}
	return index, nil
}

// handOver transfers leadership to another voter and returns a
// *NotLeaderError (with cause) naming the new leader when it shows up soon, so
// that the caller can send its request there at once.
func (n *Node) handOver(ctx context.Context, cause error) error {
	if err := n.await(ctx, n.raft.LeadershipTransfer()); err != nil {
		return fmt.Errorf("raftstore: handing leadership over: %w", err)
	}
	for deadline := time.Now().Add(2 * n.cfg.ElectionTimeout); time.Now().Before(deadline); {
		if lid, _ := n.Leader(); lid != "" && lid != n.cfg.NodeID {
			break
		}
		select {
		case <-time.After(10 * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return n.notLeader(cause)
}

// Leave removes node id from the cluster (leader only). Asked to remove itself,
// the leader first hands leadership over and returns a *NotLeaderError naming
// the new leader, to which the caller sends the request again. Removing an id that
// is not a member is a no-op.
func (n *Node) Leave(ctx context.Context, id string) (uint64, error) {
	if n.raft.State() != raft.Leader {
		return 0, n.notLeader(nil)
	}
	if id == n.cfg.NodeID {
		return 0, n.handOver(ctx, fmt.Errorf("leadership handed over so that %s can be removed", id))
	}
	index, err := n.removeMember(ctx, id)
	if err != nil {
		return 0, fmt.Errorf("raftstore: removing %s: %w", id, err)
	}
	n.log.Info("member left", "id", id)
	return index, nil
}
