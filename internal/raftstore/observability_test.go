package raftstore

import (
	"bytes"
	"context"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
)

func TestHCLogAdapter(t *testing.T) {
	var buf bytes.Buffer
	base := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	l := newHCLogger(base, "raft")
	l.Trace("below debug: dropped by the handler")
	l.Debug("debug line", "k", 1)
	l.Named("net").With("peer", "n2").Warn("warn line", "err", "boom")
	servers := []struct{ ID string }{{"n1"}}
	l.Info("formatted", "servers", hclog.Fmt("%+v", servers))
	l.SetLevel(hclog.Error)
	l.Info("dropped by SetLevel")
	l.Error("error line")
	l.StandardLogger(&hclog.StandardLoggerOptions{ForceLevel: hclog.Error}).Print("from the standard logger")
	out := buf.String()
	for _, want := range []string{
		`level=DEBUG msg="debug line" component=raft k=1`,
		`level=WARN msg="warn line" peer=n2 component=raft.net err=boom`,
		`level=ERROR msg="error line" component=raft`,
		`level=INFO msg=formatted component=raft servers=[{ID:n1}]`, // hclog.Fmt rendered, not "[%+v ...]"
		`level=ERROR msg="from the standard logger" component=raft`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	for _, unwanted := range []string{"below debug", "dropped by SetLevel"} {
		if strings.Contains(out, unwanted) {
			t.Errorf("output has %q:\n%s", unwanted, out)
		}
	}
	if l.IsDebug() || !l.IsError() || l.Name() != "raft" || l.GetLevel() != hclog.Error {
		t.Error("level or name accessors disagree with the settings")
	}
}

// TestMetricsAreExported runs a node with its own registry and raft's metrics
// exported to a second one, and checks that both see the work done. Flush
// returns once the entries it waited for are counted, and IsLeader once the
// session is, so the counts read after them are exact.
func TestMetricsAreExported(t *testing.T) {
	raftReg := prometheus.NewRegistry()
	if err := ExportRaftMetrics(raftReg, time.Minute); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	cfg := testConfig()
	cfg.NodeID, cfg.DataDir, cfg.RaftAddr, cfg.Bootstrap, cfg.Registerer = "solo", t.TempDir(), "127.0.0.1:0", true, reg
	n, err := NewNode(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Shutdown(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	waitFor(t, 20*time.Second, n.IsLeader)
	for _, b := range genBatches(testStreams(2), 40, 4) {
		if err := n.Submit(ctx, b); err != nil {
			t.Fatal(err)
		}
	}
	if err := n.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := NewNode(cfg); err == nil {
		t.Error("a second node registering the same metrics on one registry was accepted")
	}
	values := gather(t, reg)
	if values["kvindex_raft_applied_batches_total"] != 40 || values["kvindex_raft_proposed_batches_total"] != 40 ||
		values["kvindex_raft_leader_sessions_total"] != 1 || values["kvindex_raft_commit_seconds"] == 0 {
		t.Errorf("node metrics %v", values)
	}
	// The state gauges of a leader of one, quiet after Flush: its applied index
	// is the node's, and nothing it has not committed is applied.
	if values["kvindex_raft_is_leader"] != 1 || values["kvindex_raft_term"] < 1 || values["kvindex_raft_last_contact_seconds"] != 0 ||
		values["kvindex_raft_applied_index"] != float64(n.AppliedIndex()) || values["kvindex_raft_commit_index"] < values["kvindex_raft_applied_index"] {
		t.Errorf("state gauges %v, node applied index %d", values, n.AppliedIndex())
	}
	if v, ok := values["kvindex_raft_members{nonvoter}"]; values["kvindex_raft_members{voter}"] != 1 || !ok || v != 0 {
		t.Errorf("members by suffrage %v, want 1 voter, 0 nonvoters", values)
	}
	raftValues := gather(t, raftReg)
	if raftValues["kvindex_raft_apply"] == 0 || raftValues["kvindex_raft_commitTime"] == 0 {
		t.Errorf("raft's apply and commit metrics were not exported: %v", raftValues)
	}
	// main exports both to one registry: a name in both would break its /metrics.
	for name := range values {
		if _, ok := raftValues[name]; ok {
			t.Errorf("%s is both a node metric and one of raft's", name)
		}
	}
	t.Logf("raft metric families exported: %v", slices.Sorted(maps.Keys(raftValues)))
}

// gather returns each metric family's first sample: counter or gauge value,
// or histogram/summary sample count; and each gauge series with one label
// under name{value}.
func gather(t *testing.T, g prometheus.Gatherer) map[string]float64 {
	t.Helper()
	fams, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			if l := m.GetLabel(); len(l) == 1 && m.Gauge != nil {
				out[f.GetName()+"{"+l[0].GetValue()+"}"] = m.Gauge.GetValue()
			}
		}
		m := f.GetMetric()[0]
		switch {
		case m.Counter != nil:
			out[f.GetName()] = m.Counter.GetValue()
		case m.Gauge != nil:
			out[f.GetName()] = m.Gauge.GetValue()
		case m.Histogram != nil:
			out[f.GetName()] = float64(m.Histogram.GetSampleCount())
		case m.Summary != nil:
			out[f.GetName()] = float64(m.Summary.GetSampleCount())
		}
	}
	return out
}

// TestLinearizableBarrierFailsOnAnIsolatedLeader: a leader cut off from the
// majority must not confirm a read.
func TestLinearizableBarrierFailsOnAnIsolatedLeader(t *testing.T) {
	c := makeCluster(t, 3, nil)
	old := c.leaderNode(10 * time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := old.get().LinearizableBarrier(ctx); err != nil {
		t.Fatalf("barrier on a healthy leader: %v", err)
	}
	c.net.partition(old.id)
	// hashicorp/raft counts a heartbeat that was already on the wire when the cut
	// came as a vote for a VerifyLeader issued just after it, so the first barrier
	// may still pass; the next one needs heartbeats sent after the cut, and must fail.
	var err error
	for range 2 {
		if err = old.get().LinearizableBarrier(ctx); err != nil {
			break
		}
	}
	if err == nil {
		t.Error("an isolated leader confirmed two linearizable reads after the partition")
	} else if ctx.Err() != nil {
		t.Errorf("barrier on an isolated leader waited until the deadline (%v) instead of failing", err)
	}
	c.net.heal()
}
