package server

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	kvindexv1 "github.com/kvindex/kvindex/api/proto/kvindex/v1"
	"github.com/kvindex/kvindex/bench/fakeengine"
)

// TestRestartedFollowerIsNotReadyWhileBehind kills a follower under load,
// lets the cluster commit many entries without it, restarts it and samples
// /readyz every few ms: whenever it answers 200, a Score on it must report an
// applied index within the allowed lag of what the leader had committed before
// the /readyz request. It must also have been seen not ready, and then ready.
func TestRestartedFollowerIsNotReadyWhileBehind(t *testing.T) {
	const lag = 32
	e := clusterEngine(t, "ea", 1)
	engines := map[string]*fakeengine.Engine{"ea": e}
	c := makeCluster(t, 3, func(cfg *Config) {
		cfg.ReadyMaxLag = lag
		cfg.Ingest.Workers = append(cfg.Ingest.Workers, workerFlagFor(t, "ea", e))
	})
	leader := c.leader(10 * time.Second)
	follower := c.followers(leader)[0]
	commitIndex := func() uint64 {
		st, err := leader.srv.node.Cluster()
		if err != nil {
			t.Fatal(err)
		}
		return st.CommitIndex
	}
	load := startLoad(engines, 3)
	defer load.stop(t)

	c.kill(follower)
	from := commitIndex()
	deadline := time.Now().Add(60 * time.Second)
	for commitIndex() < from+20*lag { // far behind, by many times the lag
		if time.Now().After(deadline) {
			t.Fatalf("the cluster committed only %d entries in 60 s without %s", commitIndex()-from, follower.id)
		}
		time.Sleep(10 * time.Millisecond)
	}
	c.start(follower)
	fc, _ := dialNode(t, follower)
	client := &http.Client{Timeout: 5 * time.Second}
	notReady, ready := 0, 0
	var firstWhy string
	deadline = time.Now().Add(60 * time.Second)
	for ready < 100 {
		if time.Now().After(deadline) {
			t.Fatalf("the restarted follower was ready in %d samples of %d within 60 s (first reason: %s)", ready, ready+notReady, firstWhy)
		}
		before := commitIndex()
		resp, err := client.Get("http://" + follower.srv.HTTPAddr() + "/readyz")
		if err != nil {
			time.Sleep(2 * time.Millisecond)
			continue
		}
		body := make([]byte, 512)
		n, _ := resp.Body.Read(body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			if notReady++; firstWhy == "" {
				firstWhy = strings.TrimSpace(string(body[:n]))
			}
			time.Sleep(2 * time.Millisecond)
			continue
		}
		ready++
		sc, err := fc.Score(context.Background(), &kvindexv1.ScoreRequest{Model: testModel, TokenIds: tokens(0, 12)})
		if err != nil {
			t.Fatalf("Score on the ready follower: %v", err)
		}
		if sc.AppliedIndex+lag < before {
			t.Errorf("ready while behind: Score after /readyz 200 saw applied index %d, the leader had committed %d before (lag %d allowed)", sc.AppliedIndex, before, lag)
		}
		time.Sleep(2 * time.Millisecond)
	}
	if notReady == 0 {
		t.Error("the follower, restarted far behind, was never seen not ready")
	}
	t.Logf("restarted follower: %d samples not ready (first: %q), then %d ready ones, each within %d entries of the leader", notReady, firstWhy, ready, lag)
}

// TestForwardedWriteNotAppliedHereIsNotReportedDone stalls a follower's apply
// loop: a write forwarded through it is committed by the leader, but the
// follower answers UNAVAILABLE saying so, not success.
func TestForwardedWriteNotAppliedHereIsNotReportedDone(t *testing.T) {
	c := makeCluster(t, 2, nil)
	leader := c.leader(10 * time.Second)
	follower := c.followers(leader)[0]
	stall := make(chan struct{})
	stalled := func() { <-stall } // runs on the follower's apply goroutine at each registry change
	follower.srv.backend.onRegistry.Store(&stalled)
	_, admin := dialNode(t, follower)
	ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+clusterToken)
	_, err := admin.RegisterWorker(ctx, &kvindexv1.RegisterWorkerRequest{Worker: &kvindexv1.WorkerSpec{Id: "w-slow", Model: testModel, BlockSize: 4}})
	close(stall)
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "committed the write") {
		t.Errorf("a forwarded write the follower could not apply = %v, want UNAVAILABLE saying it is committed but not applied here", err)
	}
	if _, ok := leader.srv.node.Worker("w-slow"); !ok {
		t.Error("the leader does not hold the write")
	}
	if _, err := admin.RegisterWorker(ctx, &kvindexv1.RegisterWorkerRequest{Worker: &kvindexv1.WorkerSpec{Id: "w-slow", Model: testModel, BlockSize: 4}}); err != nil {
		t.Errorf("the same write again, once the follower applies: %v", err)
	}
}
