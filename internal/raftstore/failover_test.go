package raftstore

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"
)

// TestLeaderKillSoak kills the leader abruptly, again and again, while engines
// publish and the leader's ingest proposes; every replica must end with the index
// a reference Applier builds from every published batch applied once in order,
// and each replica's FSM must have applied every batch exactly once. With
// KVINDEX_LONG=1 (make test-long) it kills the leader every 10 s for 2 minutes.
func TestLeaderKillSoak(t *testing.T) {
	kills, every := 3, 1500*time.Millisecond
	if os.Getenv("KVINDEX_LONG") != "" {
		kills, every = 12, 10*time.Second
	}
	runLeaderKills(t, kills, every)
}

func runLeaderKills(t *testing.T, kills int, every time.Duration) {
	var logsMu sync.Mutex
	type incarnation struct {
		log    *applyLog
		killed bool
	}
	incarnations := map[string][]*incarnation{}
	newLog := func(id string) BatchObserver {
		inc := &incarnation{log: newApplyLog()}
		logsMu.Lock()
		incarnations[id] = append(incarnations[id], inc)
		logsMu.Unlock()
		return inc.log.observe
	}
	c := makeCluster(t, 3, func(id string, cfg *Config) { cfg.OnBatch = newLog(id) })

	fleet := newSynthFleet(6, 12)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ie := &ingestEverywhere{ctx: ctx, fleet: fleet}
	for _, tn := range c.nodes {
		ie.attach(tn.get())
	}
	pubCtx, stopPublishing := context.WithCancel(ctx)
	pubDone := make(chan struct{})
	go func() {
		defer close(pubDone)
		fleet.publishEvery(pubCtx, 3*time.Millisecond)
	}()

	var failovers []time.Duration
	for range kills {
		time.Sleep(every)
		start := time.Now()
		old, _ := c.killLeader()
		logsMu.Lock()
		incs := incarnations[old.id]
		incs[len(incs)-1].killed = true
		logsMu.Unlock()
		var others []*testNode
		for _, tn := range c.live() {
			others = append(others, tn)
		}
		for leaderAmong(others) == nil {
			if time.Since(start) > 20*time.Second {
				t.Fatalf("no new leader 20 s after killing %s", old.id)
			}
			time.Sleep(5 * time.Millisecond)
		}
		failovers = append(failovers, time.Since(start))
		old.cfg.OnBatch = newLog(old.id)
		ie.attach(c.restart(old))
	}
	time.Sleep(every / 2)
	stopPublishing()
	<-pubDone
	last := fleet.lastSeqs()
	waitCaughtUp(t, c, last, 60*time.Second)
	ie.stop()

	ref := fleet.reference()
	want := ref.Index().Digest()
	for _, tn := range c.live() {
		if got := tn.get().Index().Digest(); got != want {
			t.Errorf("%s: index digest differs from the reference built from every published batch", tn.id)
		}
	}
	published := fleet.published()
	var lost, dup, reproposed int
	logsMu.Lock()
	for id, incs := range incarnations {
		for i, inc := range incs {
			var l, d, applied int
			if inc.killed {
				l, d, applied = inc.log.audit(nil)
			} else {
				l, d, applied = inc.log.audit(last)
				if applied != published {
					t.Errorf("%s (incarnation %d): applied %d batches, %d were published", id, i, applied, published)
				}
			}
			if l != 0 || d != 0 {
				t.Errorf("%s (incarnation %d, killed %v): %d batches lost, %d applied twice", id, i, inc.killed, l, d)
			}
			lost += l
			dup += d
			reproposed = max(reproposed, inc.log.duplicates)
		}
	}
	logsMu.Unlock()
	t.Logf("leader kills: %d; batches published: %d (%d block events each); lost: %d; applied twice: %d; "+
		"re-proposed batches dropped by the cursors (max over replicas): %d; time to new leader: %v",
		kills, published, fleet.blocks, lost, dup, reproposed, failovers)
}
