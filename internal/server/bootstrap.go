package server

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	kvindexv1 "github.com/kvindex/kvindex/api/proto/kvindex/v1"
	"github.com/kvindex/kvindex/internal/raftstore"
)

// bootstrapAskTimeout bounds one question to one --bootstrap-peers member.
const bootstrapAskTimeout = 2 * time.Second

// errNoAnswer: a --bootstrap-peers member did not answer, so this node cannot
// tell whether it is in a cluster.
var errNoAnswer = errors.New("a bootstrap peer did not answer")

// bootstrapOrJoin decides, for a node started with --bootstrap-peers and
// without --join, whether it starts a cluster or joins one. A node that
// resumed from its data dir (or that a leader has reached since it started)
// has a configuration and decides nothing. Otherwise it asks every peer
// whether it is in a cluster (has members or knows a leader): if one is, this
// node joins through one of those that are (each in turn, asking again when
// none took the join) and never bootstraps; if every peer answered that it
// is in none, this is a first install and the node bootstraps; if some did not
// answer, it waits and asks again until ctx ends. So a member whose data dir
// was lost while the others run joins them instead of starting a second
// cluster beside theirs.
//
// raft runs meanwhile without a configuration: it takes a leader's
// AppendEntries, and Node.Bootstrap refuses once it has, so a leader that
// reaches this node first (its old configuration still names it) wins.
func (s *Server) bootstrapOrJoin(ctx context.Context) {
	for attempt := 1; ; attempt++ {
		if st, err := s.node.Cluster(); err == nil && len(st.Members) > 0 {
			if attempt == 1 {
				s.log.Info("raft state found: not asking --bootstrap-peers", "members", len(st.Members))
			} else {
				s.log.Info("a leader added this node while it asked --bootstrap-peers", "leader", st.LeaderID)
			}
			return
		}
		vias, err := s.askBootstrapPeers(ctx)
		if ctx.Err() != nil {
			return
		}
		switch {
		case len(vias) > 0:
			// Any member of the cluster forwards a join: try each that said
			// it is in one, then ask again (one may have died since).
			for _, via := range vias {
				resp, jerr := s.joinOnce(ctx, via)
				if jerr == nil {
					s.log.Info("joined the cluster of the --bootstrap-peers members", "via", via, "applied_index", resp.AppliedIndex, "attempts", attempt)
					return
				}
				err = errors.Join(err, fmt.Errorf("joining through %s: %w", via, jerr))
			}
			if ctx.Err() != nil {
				return
			}
		case err == nil:
			err = s.node.Bootstrap(ctx)
			switch {
			case err == nil:
				s.log.Info("no --bootstrap-peers member is in a cluster: started a new one", "peers", s.cfg.BootstrapPeers)
				return
			case errors.Is(err, raftstore.ErrHasState):
				// A leader reached this node between the question and the
				// bootstrap: the next round sees its configuration.
			case ctx.Err() != nil, errors.Is(err, raftstore.ErrShutdown):
				return
			}
		}
		s.log.Log(ctx, retryLogLevel(attempt), "not starting a cluster yet: waiting for every --bootstrap-peers member to answer",
			"attempt", attempt, "err", err)
		if joinBackoff.Wait(ctx, attempt-1) != nil {
			return
		}
	}
}

// askBootstrapPeers asks each --bootstrap-peers member, at once, whether it
// is in a cluster. It returns the addresses of those that are (first those
// that know their leader, which forward a join without waiting for an
// election); else nil when every member answered, else why some did not.
func (s *Server) askBootstrapPeers(ctx context.Context) (vias []string, err error) {
	type answer struct {
		inCluster, hasLeader bool
		err                  error
	}
	answers := make([]answer, len(s.cfg.BootstrapPeers))
	var wg sync.WaitGroup
	for i, addr := range s.cfg.BootstrapPeers {
		wg.Go(func() {
			actx, cancel := context.WithTimeout(ctx, bootstrapAskTimeout)
			defer cancel()
			// As a peer: the member answers from its own state, without
			// asking its members for their progress.
			actx, c, err := s.peers.admin(actx, addr, true)
			var resp *kvindexv1.ClusterResponse
			if err == nil {
				resp, err = c.Cluster(actx, &kvindexv1.ClusterRequest{WithoutDigest: true})
			}
			if err != nil {
				answers[i].err = fmt.Errorf("%w: %s: %w", errNoAnswer, addr, fromRemote(addr, err))
				return
			}
			// A node that has no raft configuration yet (one started with
			// --join that no leader has added) answers no members and no leader.
			answers[i] = answer{inCluster: len(resp.Members) > 0 || resp.Leader != "", hasLeader: resp.Leader != ""}
		})
	}
	wg.Wait()
	var withLeader, withoutLeader []string
	var errs []error
	for i, a := range answers {
		switch {
		case a.hasLeader:
			withLeader = append(withLeader, s.cfg.BootstrapPeers[i])
		case a.inCluster:
			withoutLeader = append(withoutLeader, s.cfg.BootstrapPeers[i])
		case a.err != nil:
			errs = append(errs, a.err)
		}
	}
	if vias = append(withLeader, withoutLeader...); len(vias) > 0 {
		return vias, nil
	}
	return nil, errors.Join(errs...)
}
