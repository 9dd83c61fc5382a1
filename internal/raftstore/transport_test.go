package raftstore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/ingest"
	"github.com/kvindex/kvindex/internal/radix"
)

func TestAdvertiseAddr(t *testing.T) {
	cases := []struct {
		in, want string
		ok       bool
	}{
		{"10.1.2.3:7090", "10.1.2.3:7090", true},
		{"[fd00::1]:7090", "[fd00::1]:7090", true},
		{"indexer-0.indexer-headless.ns.svc:7090", "indexer-0.indexer-headless.ns.svc:7090", true},
		{"localhost:7090", "localhost:7090", true},
		{"0.0.0.0:7090", "", false},
		{"[::]:7090", "", false},
		{"indexer-0:http", "", false},
		{"indexer-0:70900", "", false},
		{":7090", "", false},
		{"indexer-0", "", false},
	}
	for _, c := range cases {
		got, err := advertiseAddr(c.in)
		switch {
		case c.ok && err != nil:
			t.Errorf("%q: %v", c.in, err)
		case c.ok && got.String() != c.want:
			t.Errorf("%q advertised as %q, want %q", c.in, got, c.want)
		case !c.ok && !errors.Is(err, ErrInvalidConfig):
			t.Errorf("%q: error %v, want ErrInvalidConfig", c.in, err)
		}
	}
}

// TestClusterOverDNSNames: members that advertise DNS names (as a StatefulSet's
// pods do, pod-N.service-headless) are stored in the raft configuration by name,
// replicate over real TCP, and a member restarted on its name catches up.
func TestClusterOverDNSNames(t *testing.T) {
	type member struct {
		cfg  Config
		name string
		node *Node
	}
	start := func(m *member) {
		t.Helper()
		_, port, _ := net.SplitHostPort(m.name)
		layer, err := NewTCPStreamLayer("127.0.0.1:"+port, m.name)
		if err != nil {
			t.Fatal(err)
		}
		cfg := m.cfg
		cfg.StreamLayer = layer
		if m.node, err = NewNode(cfg); err != nil {
			layer.Close()
			t.Fatal(err)
		}
	}
	var members []*member
	for i := range 3 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		m := &member{cfg: testConfig(), name: fmt.Sprintf("localhost:%d", port)}
		m.cfg.NodeID = fmt.Sprintf("node-%d", i)
		m.cfg.DataDir = filepath.Join(t.TempDir(), m.cfg.NodeID)
		m.cfg.GRPCAddr = "grpc-of-" + m.cfg.NodeID + ":7070"
		m.cfg.Bootstrap = i == 0
		start(m)
		members = append(members, m)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	defer func() {
		for _, m := range members {
			if m.node != nil {
				m.node.Shutdown(ctx)
			}
		}
	}()
	leader := func() *Node {
		t.Helper()
		for ctx.Err() == nil {
			for _, m := range members {
				if m.node != nil && m.node.IsLeader() {
					return m.node
				}
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Fatal("no leader")
		return nil
	}
	for _, m := range members[1:] {
		if _, err := leader().Join(ctx, m.cfg.NodeID, m.name, m.cfg.GRPCAddr, true); err != nil {
			t.Fatalf("join %s: %v", m.cfg.NodeID, err)
		}
	}
	st, err := leader().Cluster()
	if err != nil {
		t.Fatal(err)
	}
	byID := map[string]string{}
	for _, mb := range st.Members {
		byID[mb.ID] = mb.RaftAddr
	}
	for _, m := range members {
		if byID[m.cfg.NodeID] != m.name {
			t.Errorf("%s is in the configuration at %q, want its name %q", m.cfg.NodeID, byID[m.cfg.NodeID], m.name)
		}
	}
	ref := ingest.NewApplier(radix.New(radix.Config{}))
	streams := testStreams(2)
	submit := func(count int) {
		t.Helper()
		for _, b := range genBatches(streams, count, 4) {
			if err := leader().Submit(ctx, b); err != nil {
				t.Fatal(err)
			}
			ref.Apply(b)
		}
	}
	converged := func() {
		t.Helper()
		for ctx.Err() == nil {
			same := true
			for _, m := range members {
				same = same && m.node.Index().Digest() == ref.Index().Digest()
			}
			if same {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Fatal("the members' indexes did not converge on what was submitted")
	}
	submit(50)
	converged()
	// A follower stops and comes back on its name: it is reached by name again.
	var follower *member
	for _, m := range members {
		if !m.node.IsLeader() {
			follower = m
		}
	}
	if err := follower.node.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	follower.node = nil
	follower.cfg.Bootstrap = false
	submit(50)
	start(follower)
	converged()
}
