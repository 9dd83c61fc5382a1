package raftstore

import (
	"reflect"
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests when a goroutine they started outlives
// them: every goroutine of the package must end when what started it stops.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestAnswerOnStopReachesRaftsApplyFuture checks that answerOnStop finds the
// ShutdownCh of the futures this version of hashicorp/raft returns from Apply
// (a renamed field would silently bring back the waiter that outlives its node),
// and that such a future still answers normally.
func TestAnswerOnStopReachesRaftsApplyFuture(t *testing.T) {
	n := startPlainCluster(t, 1, nil)[0]
	stopped := make(chan struct{})
	f := n.raft.Apply(nil, 0) // an entry the FSM stops on is fine: only the future matters
	answerOnStop(f, stopped)
	got := reflect.ValueOf(f).Elem().FieldByName("ShutdownCh")
	if !got.IsValid() || got.Interface() != any(stopped) {
		t.Fatalf("raft's ApplyFuture (%T) ShutdownCh = %v, want the stop channel", f, got)
	}
	_ = f.Error()
}
