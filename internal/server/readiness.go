package server

import (
	"context"
	"fmt"
	"time"

	kvindexv1 "github.com/kvindex/kvindex/api/proto/kvindex/v1"
)

// Readiness. A node is ready when a read it answers is not older than the
// cluster's state by more than the allowed lag (--ready-max-lag log entries).
// The leader knows the commit index itself. A follower only knows what the
// leader told it, and right after a restart it knows nothing: raft starts it
// with commit index 0 and the index of its last snapshot (or an empty one),
// and comparing that with itself would say "caught up". So a follower is ready
// only when
//   - it has heard from the current leader within the heartbeat timeout;
//   - its own commit index has come from that leader (it is not 0), and it
//     has asked the leader for the leader's commit index in this term, less
//     than leaderProgressMaxAge ago (its own can be behind while its log is:
//     raft sets it to min(leader's, last log index));
//   - it has applied to within the lag of the larger of the two.

const (
	// DefaultReadyMaxLag is --ready-max-lag's default: ingest commits entries
	// all the time, so a follower is rarely at zero.
	DefaultReadyMaxLag = 256
	// leaderProgressPoll is how often a follower asks the leader for its commit
	// index; leaderProgressMaxAge is how old an answer may be and still count.
	leaderProgressPoll   = 100 * time.Millisecond
	leaderProgressMaxAge = time.Second
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
		p := b.leaderProgress.Load()
		if p == nil || p.leader != st.LeaderID || p.term != st.Term || time.Since(p.at) > leaderProgressMaxAge {
			return fmt.Errorf("%w: leader %s has not said its commit index in term %d yet", ErrUnavailable, st.LeaderID, st.Term)
		}
		commit = max(commit, p.commitIndex)
	}
	if commit > st.AppliedIndex+b.readyMaxLag {
		return fmt.Errorf("%w: catching up: applied index %d of %d committed (--ready-max-lag %d)", ErrUnavailable, st.AppliedIndex, commit, b.readyMaxLag)
	}
	return nil
}

// followLeaderProgress asks the leader for its commit index every
// leaderProgressPoll while this node follows, until ctx ends.
func (b *raftBackend) followLeaderProgress(ctx context.Context) {
	t := time.NewTicker(leaderProgressPoll)
	defer t.Stop()
	failures := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		p, err := b.askLeaderProgress(ctx)
		switch {
		case err != nil:
			if failures++; failures%50 == 1 && ctx.Err() == nil {
				b.log.Warn("asking the leader for its commit index failed; this node is not ready until it answers", "err", err, "failures", failures)
			}
		case p != nil:
			failures = 0
			b.leaderProgress.Store(p)
		}
	}
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
	actx, cancel := context.WithTimeout(ctx, progressTimeout)
	defer cancel()
	actx, c, err := b.peers.admin(actx, addr, true)
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
