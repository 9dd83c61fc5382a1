package raftstore

import (
	"context"
	"errors"
	"testing"
	"time"
)

// memberSuffrage returns id's suffrage as n sees the configuration ("" when
// id is not a member).
func memberSuffrage(t *testing.T, n *Node, id string) string {
	t.Helper()
	st, err := n.Cluster()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range st.Members {
		if m.ID == id {
			return m.Suffrage
		}
	}
	return ""
}

// TestJoinChangesTheSuffrageOfAMember: joining a voter again as a non-voter
// demotes it (raft's AddNonvoter alone leaves a voter as it is), joining it
// again as a voter promotes it back, and the leader asked to demote itself
// hands leadership over first, naming the new leader.
func TestJoinChangesTheSuffrageOfAMember(t *testing.T) {
	c := makeCluster(t, 3, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	leaderTN := c.leaderNode(20 * time.Second)
	leader := leaderTN.get()
	var follower *testNode
	for _, tn := range c.nodes {
		if tn != leaderTN {
			follower = tn
			break
		}
	}
	if _, err := leader.Join(ctx, follower.id, follower.addr, follower.cfg.GRPCAddr, false); err != nil {
		t.Fatalf("join %s as a non-voter: %v", follower.id, err)
	}
	if got := memberSuffrage(t, leader, follower.id); got != SuffrageNonvoter {
		t.Fatalf("after joining as a non-voter, %s is a %s", follower.id, got)
	}
	if _, err := leader.Join(ctx, follower.id, follower.addr, follower.cfg.GRPCAddr, true); err != nil {
		t.Fatalf("join %s as a voter: %v", follower.id, err)
	}
	if got := memberSuffrage(t, leader, follower.id); got != SuffrageVoter {
		t.Fatalf("after joining as a voter again, %s is a %s", follower.id, got)
	}

	_, err := leader.Join(ctx, leader.ID(), leaderTN.addr, leaderTN.cfg.GRPCAddr, false)
	var nle *NotLeaderError
	if !errors.As(err, &nle) || nle.LeaderID == leader.ID() {
		t.Fatalf("the leader demoting itself: %v, want a NotLeaderError naming another leader", err)
	}
	next := c.leader(20 * time.Second)
	if _, err := next.Join(ctx, leaderTN.id, leaderTN.addr, leaderTN.cfg.GRPCAddr, false); err != nil {
		t.Fatalf("the new leader demoting %s: %v", leaderTN.id, err)
	}
	if got := memberSuffrage(t, next, leaderTN.id); got != SuffrageNonvoter {
		t.Errorf("after the demotion, %s is a %s", leaderTN.id, got)
	}
}

// TestJoinReplacingAMemberAtItsAddressForgetsItsGRPCAddr: a node back under a
// new id at a member's raft address replaces that member, and the member's
// gRPC address leaves the replicated member table with it.
func TestJoinReplacingAMemberAtItsAddressForgetsItsGRPCAddr(t *testing.T) {
	c := makeCluster(t, 3, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	leaderTN := c.leaderNode(20 * time.Second)
	var old *testNode
	for _, tn := range c.nodes {
		if tn != leaderTN {
			old = tn
			break
		}
	}
	c.kill(old)
	leader := c.leader(20 * time.Second)
	if _, err := leader.Join(ctx, old.id+"-new", old.addr, "grpc-of-new:7070", true); err != nil {
		t.Fatalf("join at %s's address: %v", old.id, err)
	}
	if got := memberSuffrage(t, leader, old.id); got != "" {
		t.Fatalf("%s is still a %s", old.id, got)
	}
	addrs := leader.fsm.memberAddrs()
	if addr, ok := addrs[old.id]; ok {
		t.Errorf("the replaced member's gRPC address %q stays in the member table", addr)
	}
	if addrs[old.id+"-new"] != "grpc-of-new:7070" {
		t.Errorf("member table %v, want the new member's gRPC address", addrs)
	}
}
