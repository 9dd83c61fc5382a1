package server

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	kvindexv1 "github.com/kvindex/kvindex/api/proto/kvindex/v1"
)

// Readiness. A node is ready when a read it answers is not older than the
// cluster's state by more than the allowed lag (--ready-max-lag log entries).
// The leader knows the commit index itself. A follower only knows what the
// leader told it, and right after a restart it knows nothing: raft starts it
// with commit index 0 and the index of its last snapshot (or an empty one),
// and comparing that with itself would say "caught up". Nor is its own commit
// index enough later on: raft sets it to min(leader's, last log index), and
// under load it trails the leader's by whatever replication has not brought
// yet. So a follower is ready only when
//   - it has heard from the current leader within the heartbeat timeout, and
//     its own commit index has come from that leader (it is not 0);
//   - the leader, asked for its commit index after the readiness question
//     arrived (over gRPC, in this term), answered;
//   - it has applied to within the lag of that answer.
// Concurrent questions share the leader's answers: a question waits for an
// answer asked after it arrived (see leaderCommit), so a flood of /readyz
// costs the leader at most one question per round trip.

const (
	// DefaultReadyMaxLag is --ready-max-lag's default: ingest commits entries
	// all the time, so a follower is rarely at zero.
	DefaultReadyMaxLag = 256
	// readyAskTimeout bounds the question to the leader.
	readyAskTimeout = time.Second
)

// leaderProgress is what the leader last said about its commit index.
type leaderProgress struct {
	leader      string
	term        uint64
	commitIndex uint64
	at          time.Time
}

// Ready returns nil when a read here is at most the allowed lag behind the
// cluster, else an ErrUnavailable saying why (see above).
func (b *raftBackend) Ready() error {
	if err := b.node.Err(); err != nil {
		return fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	st, err := b.node.Cluster()
	if err != nil {
		return fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	commit := st.CommitIndex
	switch {
	case st.LeaderID == "":
		return fmt.Errorf("%w: no leader known (an election, or this node is not a member yet)", ErrUnavailable)
	case st.LeaderID == b.nodeID && !b.node.IsLeader():
		return fmt.Errorf("%w: elected leader, catching up with the log", ErrUnavailable)
	case st.LeaderID == b.nodeID && !b.ingest.Running():
		return fmt.Errorf("%w: ingest is starting or stopping", ErrUnavailable)
	case st.LeaderID != b.nodeID:
		if since := time.Since(st.LastContact); st.LastContact.IsZero() || since > b.contactTimeout {
			return fmt.Errorf("%w: no contact with leader %s for %v", ErrUnavailable, st.LeaderID, since.Round(time.Millisecond))
		}
		if st.CommitIndex == 0 {
			return fmt.Errorf("%w: the commit index has not come from leader %s yet", ErrUnavailable, st.LeaderID)
		}
		p, err := b.leaderCommit(time.Now())
		switch {
		case err != nil:
			return fmt.Errorf("%w: asking leader %s for its commit index: %v", ErrUnavailable, st.LeaderID, err)
		case p.leader != st.LeaderID || p.term != st.Term:
			return fmt.Errorf("%w: leader %s answered for term %d as %s; this node is in term %d", ErrUnavailable, st.LeaderID, p.term, p.leader, st.Term)
		}
		commit = max(commit, p.commitIndex)
	}
	if commit > st.AppliedIndex+b.readyMaxLag {
		return fmt.Errorf("%w: catching up: applied index %d of %d committed (--ready-max-lag %d)", ErrUnavailable, st.AppliedIndex, commit, b.readyMaxLag)
	}
	return nil
}

// leaderAsks serialises the followers' questions to the leader and keeps the
// last answer with the time its question was sent.
type leaderAsks struct {
	mu   sync.Mutex
	last *leaderProgress // guarded by mu
	err  error           // of the last question; guarded by mu
}

// leaderCommit returns the leader's commit index as the leader answered a
// question sent at or after arrived: the last answer if its question was,
// else a new question's.
func (b *raftBackend) leaderCommit(arrived time.Time) (*leaderProgress, error) {
	q := &b.leaderAsks
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.last != nil && !q.last.at.Before(arrived) {
		return q.last, q.err
	}
	ctx, cancel := context.WithTimeout(context.Background(), readyAskTimeout)
	defer cancel()
	at := time.Now()
	p, err := b.askLeaderProgress(ctx)
	if p == nil && err == nil {
		err = errors.New("no leader to ask")
	}
	if p == nil {
		p = &leaderProgress{at: at}
	}
	q.last, q.err = p, err
	return p, err
}

// askLeaderProgress asks the leader, over its gRPC API, for its commit index;
// nil, nil when this node leads or knows no leader.
func (b *raftBackend) askLeaderProgress(ctx context.Context) (*leaderProgress, error) {
	st, err := b.node.Cluster()
	if err != nil || st.LeaderID == "" || st.LeaderID == b.nodeID {
		return nil, nil
	}
	addr := ""
	for _, m := range st.Members {
		if m.ID == st.LeaderID {
			addr = m.GRPCAddr
		}
	}
	if addr == "" {
		return nil, fmt.Errorf("leader %s has published no gRPC address", st.LeaderID)
	}
	at := time.Now()
	actx, c, err := b.peers.admin(ctx, addr, true)
	if err != nil {
		return nil, err
	}
	resp, err := c.Cluster(actx, &kvindexv1.ClusterRequest{WithoutDigest: true})
	switch {
	case err != nil:
		return nil, fromRemote(addr, err)
	case resp.NodeId != st.LeaderID || resp.Leader != st.LeaderID:
		return nil, fmt.Errorf("%s at %s answered as %s, leader %q", st.LeaderID, addr, resp.NodeId, resp.Leader)
	}
	return &leaderProgress{leader: resp.NodeId, term: resp.Term, commitIndex: resp.CommitIndex, at: at}, nil
}
