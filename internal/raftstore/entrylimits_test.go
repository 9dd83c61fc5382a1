package raftstore

import (
	"context"
	"errors"
	"maps"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/workerspec"
)

// Entries beyond the log format's limits (an empty or over-long id, an
// over-long address): versions before EncodeEntry checked them wrote such
// entries, and a replica that stopped on one stopped again at every restart.

// overLimitEntries are entries as the unchecked encoder wrote them, one per
// kind of value it let through.
func overLimitEntries() map[string][]byte {
	long := strings.Repeat("x", maxNameLen+1)
	return map[string][]byte{
		"unregister, over-long id":        rawIDEntry(EntryUnregisterWorker, long),
		"unregister, empty id":            rawIDEntry(EntryUnregisterWorker, ""),
		"member removed, over-long id":    rawIDEntry(EntryMemberRemoved, long),
		"worker dead, over-long id":       rawIDEntry(EntryWorkerDead, long),
		"worker alive, empty id":          rawIDEntry(EntryWorkerAlive, ""),
		"member address, over-long id":    appendString(rawIDEntry(EntryMemberAddr, long), "a:1"),
		"member address, 64 KiB + 1":      appendString(rawIDEntry(EntryMemberAddr, "node-9"), strings.Repeat("a", maxStringLen+1)),
		"stream batch, over-long name":    append(appendString([]byte{entryVersion, byte(EntryStreamBatches), 1}, long), 0),
		"replace, another id in the spec": appendWorker(appendWorker(appendHeader(nil, EntryReplaceWorker), &workerspec.Spec{ID: "w"}), &workerspec.Spec{ID: "v"}),
	}
}

// TestFSMAppliesAnEntryBeyondTheLimitsAsANoOp: such an entry changes nothing,
// fails with ErrInvalidEntry, counts as applied, and the entries after it apply.
func TestFSMAppliesAnEntryBeyondTheLimitsAsANoOp(t *testing.T) {
	for name, data := range overLimitEntries() {
		t.Run(name, func(t *testing.T) {
			f := newTestFSM(t, nil)
			applyEntry(t, f, 1, Entry{Type: EntryRegisterWorker, Worker: workerspec.Spec{ID: "w", Model: "m"}})
			applyEntry(t, f, 2, Entry{Type: EntryMemberAddr, ID: "node-9", GRPCAddr: "a:1"})
			applyEntry(t, f, 3, batchesEntry(stored(ws("w", 0), 0, 1, false, 7)))
			workers, members, digest := f.Workers(), f.memberAddrs(), f.applier.Index().Digest()
			cursors := f.applier.Cursors()

			r := applyData(f, 4, data)
			if !errors.Is(r.Err, ErrInvalidEntry) {
				t.Fatalf("result %+v, want ErrInvalidEntry", r)
			}
			if err := f.err(); err != nil {
				t.Fatalf("the FSM stopped: %v", err)
			}
			if got := f.lastIndex.Load(); got != 4 {
				t.Errorf("applied index %d, want 4: the refused entry counts as applied", got)
			}
			if !reflect.DeepEqual(f.Workers(), workers) || !maps.Equal(f.memberAddrs(), members) ||
				f.applier.Index().Digest() != digest || !maps.Equal(f.applier.Cursors(), cursors) || len(f.Dead()) != 0 {
				t.Error("the refused entry changed the state")
			}
			if r := applyEntry(t, f, 5, batchesEntry(stored(ws("w", 0), 0, 2, false, 8))); r.Applied != 1 {
				t.Errorf("batch after the refused entry: %+v, want applied", r)
			}
		})
	}
}

// TestAdminCallsBeyondTheLogLimitsFailCleanly: ids and addresses the log
// cannot carry are refused before they are proposed, with a sentinel the
// server maps to INVALID_ARGUMENT; no replica stops and the cluster goes on.
func TestAdminCallsBeyondTheLogLimitsFailCleanly(t *testing.T) {
	c := makeCluster(t, 3, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	long := strings.Repeat("x", maxNameLen+1)
	tests := []struct {
		name string
		call func(n *Node) error
		want error
	}{
		{"unregister an over-long id", func(n *Node) error { _, err := n.UnregisterWorker(ctx, long); return err }, ErrInvalidEntry},
		{"unregister an empty id", func(n *Node) error { _, err := n.UnregisterWorker(ctx, ""); return err }, ErrInvalidEntry},
		{"declare an over-long id dead", func(n *Node) error { _, err := n.MarkWorkerDead(ctx, long); return err }, ErrInvalidEntry},
		{"declare an empty id alive", func(n *Node) error { _, err := n.MarkWorkerAlive(ctx, ""); return err }, ErrInvalidEntry},
		{"join with a gRPC address over 64 KiB", func(n *Node) error {
			_, err := n.Join(ctx, "node-9", "127.0.0.1:1", strings.Repeat("a", maxStringLen+1), false)
			return err
		}, ErrInvalidConfig},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			leader := c.leader(20 * time.Second)
			term, last := leader.raft.CurrentTerm(), leader.raft.LastIndex()
			if err := tc.call(leader); !errors.Is(err, tc.want) {
				t.Fatalf("error %v, want %v", err, tc.want)
			}
			// Leadership may move meanwhile (a new term appends a barrier);
			// in the same term, nothing may have reached the log.
			if leader.raft.CurrentTerm() == term && leader.raft.LastIndex() != last {
				t.Errorf("log grew from %d to %d: the call was proposed", last, leader.raft.LastIndex())
			}
		})
	}
	leader := c.leader(20 * time.Second)
	if _, err := leader.RegisterWorker(ctx, workerspec.Spec{ID: "w", Model: "m"}); err != nil {
		t.Fatalf("a registration after the refused calls: %v", err)
	}
	c.waitConverged(30 * time.Second)
	for _, tn := range c.nodes {
		n := tn.get()
		if err := n.Err(); err != nil {
			t.Errorf("%s stopped: %v", tn.id, err)
		}
		if ws := n.Workers(); len(ws) != 1 || ws[0].ID != "w" {
			t.Errorf("%s: registry %v, want w", tn.id, ws)
		}
	}
}

// TestCommittedEntryBeyondTheLimitsDoesNotStopTheCluster writes, with the raw
// raft API, entries as the unchecked encoder did: every replica applies each as
// a failed no-op, goes on applying, and does so again when the whole cluster
// restarts and replays its log.
func TestCommittedEntryBeyondTheLimitsDoesNotStopTheCluster(t *testing.T) {
	c := makeCluster(t, 3, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	leader := c.leader(20 * time.Second)
	if _, err := leader.RegisterWorker(ctx, workerspec.Spec{ID: "w", Model: "m"}); err != nil {
		t.Fatal(err)
	}
	entries := overLimitEntries()
	for _, name := range []string{"unregister, over-long id", "member address, 64 KiB + 1", "worker dead, over-long id"} {
		f := leader.raft.Apply(entries[name], 10*time.Second)
		if err := f.Error(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if r, _ := f.Response().(ApplyResult); !errors.Is(r.Err, ErrInvalidEntry) {
			t.Fatalf("%s: result %+v, want ErrInvalidEntry", name, r)
		}
	}
	last, err := leader.RegisterWorker(ctx, workerspec.Spec{ID: "v", Model: "m"})
	if err != nil {
		t.Fatalf("a registration after the refused entries: %v", err)
	}
	check := func(when string) {
		t.Helper()
		waitFor(t, 60*time.Second, func() bool {
			for _, tn := range c.nodes {
				n := tn.get()
				if err := n.Err(); err != nil {
					t.Fatalf("%s, %s stopped: %v", when, tn.id, err)
				}
				if n.AppliedIndex() < last {
					return false
				}
			}
			return true
		})
		for _, tn := range c.nodes {
			n := tn.get()
			if ws := n.Workers(); len(ws) != 2 || ws[0].ID != "v" || ws[1].ID != "w" {
				t.Errorf("%s, %s: registry %v, want v and w", when, tn.id, ws)
			}
			if addr, ok := n.fsm.memberAddrs()["node-9"]; ok {
				t.Errorf("%s, %s: the refused member address (%d bytes) was recorded", when, tn.id, len(addr))
			}
		}
	}
	check("before the restart")
	for _, tn := range c.nodes {
		c.kill(tn)
	}
	for _, tn := range c.nodes {
		c.restart(tn)
	}
	check("after the restart")
	if _, err := c.leader(30*time.Second).RegisterWorker(ctx, workerspec.Spec{ID: "u", Model: "m"}); err != nil {
		t.Errorf("a registration after the restart: %v", err)
	}
}
