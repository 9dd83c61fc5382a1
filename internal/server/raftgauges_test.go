package server

import (
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"
)

// raftGauges is one member's kvindex_raft_* state gauges, as its /metrics
// registry reports them.
type raftGauges struct {
	isLeader, term, applied, commit, contact, voters float64
}

func readRaftGauges(t *testing.T, cn *clusterNode) raftGauges {
	t.Helper()
	return raftGauges{
		isLeader: labeled(t, cn.srv, "kvindex_raft_is_leader"),
		term:     labeled(t, cn.srv, "kvindex_raft_term"),
		applied:  labeled(t, cn.srv, "kvindex_raft_applied_index"),
		commit:   labeled(t, cn.srv, "kvindex_raft_commit_index"),
		contact:  labeled(t, cn.srv, "kvindex_raft_last_contact_seconds"),
		voters:   labeled(t, cn.srv, "kvindex_raft_members", "suffrage", "voter"),
	}
}

// oneLeader waits until exactly one live member reports kvindex_raft_is_leader 1
// and every live member reports the same term above minTerm, and returns that
// member and the term. A failure names what each member reported.
func oneLeader(t *testing.T, c *testCluster, minTerm float64) (*clusterNode, float64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var leaders []*clusterNode
		terms := map[float64]bool{}
		term := 0.0
		report := ""
		for _, cn := range c.live() {
			g := readRaftGauges(t, cn)
			if g.isLeader == 1 {
				leaders = append(leaders, cn)
			}
			terms[g.term], term = true, g.term
			report += fmt.Sprintf(" %s:%+v", cn.id, g)
		}
		if len(leaders) == 1 && len(terms) == 1 && term > minTerm {
			return leaders[0], term
		}
		if time.Now().After(deadline) {
			t.Fatalf("no single leader in one term above %v within 30s:%s", minTerm, report)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// checkMember checks the gauges of one member that no write is reaching:
// kvindex_raft_applied_index is its backend's AppliedIndex (read while that
// holds still), the commit index is not behind it, all three voters are
// known, and kvindex_raft_last_contact_seconds is 0 on the leader and, on a
// follower, the time since raft's own LastContact, bracketed by clock reads and
// LastContact reads around the scrape (heartbeats move LastContact on; under a
// loaded CPU a scrape can outlast the heartbeat interval every time).
func checkMember(t *testing.T, cn *clusterNode, leader bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		before := cn.srv.backend.AppliedIndex()
		st, err := cn.srv.node.Cluster()
		if err != nil {
			t.Fatal(err)
		}
		from := time.Now()
		g := readRaftGauges(t, cn)
		to := time.Now()
		st2, err := cn.srv.node.Cluster()
		if err != nil {
			t.Fatal(err)
		}
		if before != cn.srv.backend.AppliedIndex() {
			// an entry was applied during the scrape: again
			if time.Now().After(deadline) {
				t.Fatalf("%s: applied index never held still for a scrape", cn.id)
			}
			time.Sleep(time.Millisecond)
			continue
		}
		if g.applied != float64(before) || g.commit < g.applied || g.voters != 3 {
			t.Errorf("%s: gauges %+v, backend applied index %d", cn.id, g, before)
		}
		if leader {
			if g.contact != 0 {
				t.Errorf("%s: the leader reports %vs since it last heard from a leader, want 0", cn.id, g.contact)
			}
			return
		}
		if st.LastContact.IsZero() {
			t.Fatalf("%s: a follower of a working cluster never heard from the leader", cn.id)
		}
		// The scrape read LastContact somewhere between the two Cluster calls and
		// the clock somewhere between from and to.
		if lo, hi := from.Sub(st2.LastContact).Seconds(), to.Sub(st.LastContact).Seconds(); g.contact < lo || g.contact > hi {
			t.Errorf("%s: last contact %vs, want within [%v, %v] (raft's LastContact %v, then %v)", cn.id, g.contact, lo, hi, st.LastContact, st2.LastContact)
		}
		return
	}
}

// TestRaftStateGauges: in a real three-member cluster exactly one member
// reports itself leader, all report the same term, each reports the applied
// index its reads see; when the leader dies, another takes over in a higher
// term and says so.
func TestRaftStateGauges(t *testing.T) {
	c := makeCluster(t, 3, nil)
	leader, term := oneLeader(t, c, 0)

	// A write: register a worker through the leader; it has applied it when
	// the call returns, and the followers apply it soon after.
	spec := workerFlagFor(t, "ga", clusterEngine(t, "ga", 1))
	code, body := httpDo(t, "POST", "http://"+leader.srv.HTTPAddr()+"/register", map[string]any{"worker": map[string]any{
		"id": spec.ID, "model": spec.Model, "block_size": spec.BlockSize, "dp_size": spec.DPSize,
		"events_endpoint": spec.Endpoint, "replay_endpoint": spec.Replay, "http_endpoint": spec.HTTP,
	}})
	if code != http.StatusOK {
		t.Fatalf("POST /register = %d %s", code, body)
	}
	written := leader.srv.backend.AppliedIndex()
	deadline := time.Now().Add(30 * time.Second)
	for _, cn := range c.live() {
		for cn.srv.backend.AppliedIndex() < written {
			if time.Now().After(deadline) {
				t.Fatalf("%s never applied index %d (at %d)", cn.id, written, cn.srv.backend.AppliedIndex())
			}
			time.Sleep(10 * time.Millisecond)
		}
		if g := readRaftGauges(t, cn); g.applied < float64(written) {
			t.Errorf("%s: applied index gauge %v after applying %d", cn.id, g.applied, written)
		}
	}
	for _, cn := range c.live() {
		checkMember(t, cn, cn == leader)
	}

	// The console's leadership timeline follows raft from start, not only while
	// a page watches: nobody has read the console, yet each follower's timeline
	// ends with this leader and term (it samples every uiInterval).
	was := uiLeadership{Term: uint64(term), Leader: leader.id}
	for _, cn := range c.followers(leader) {
		waitForCond(t, 10*time.Second, cn.id+"'s timeline to note "+leader.id, func() bool {
			last, ok := cn.srv.api.ui.timeline.Last()
			last.At = 0
			return ok && last == was
		})
	}

	c.kill(leader)
	next, nextTerm := oneLeader(t, c, term)
	t.Logf("term %v -> %v after the leader was killed", term, nextTerm)
	for _, cn := range c.live() {
		checkMember(t, cn, cn == next)
	}
	// The console then shows both leaderships, the new one last.
	for _, cn := range c.live() {
		code, body := httpDo(t, "GET", "http://"+cn.srv.HTTPAddr()+"/ui/api/state", nil)
		var st uiState
		if code != http.StatusOK || json.Unmarshal([]byte(body), &st) != nil {
			t.Fatalf("%s: GET /ui/api/state = %d %s", cn.id, code, body)
		}
		sawOld := false
		for _, e := range st.Timeline {
			sawOld = sawOld || (e.Term == was.Term && e.Leader == was.Leader)
		}
		if last := st.Timeline[len(st.Timeline)-1]; !sawOld || last.Term != uint64(nextTerm) || last.Leader != next.id {
			t.Errorf("%s: timeline %+v, want term %v led by %s, and last term %v led by %s", cn.id, st.Timeline, term, leader.id, nextTerm, next.id)
		}
	}
}
