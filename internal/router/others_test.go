package router

import (
	"fmt"
	"testing"
	"time"

	kvindexv1 "github.com/kvindex/kvindex/api/proto/kvindex/v1"
)

// TestOtherRoutersCountsEachRouterUntilItsDecisionsExpire: a shared prefix is
// counted once per deciding router, for the TTL that router sent (at most the
// store's), and a router whose decisions all expired is forgotten, so routers
// that restarted under new ids do not pile up; a full store takes no new router.
func TestOtherRoutersCountsEachRouterUntilItsDecisionsExpire(t *testing.T) {
	start := time.Unix(1000, 0)
	x := NewOtherRouters(time.Minute, 1<<16)
	w := Target{Worker: "w"}
	keys := []uint64{1, 2, 3}
	x.Record("r1", keys, w, start, 10*time.Second)
	x.Record("r2", keys[:2], w, start, time.Hour) // kept for the store's minute
	for _, c := range []struct {
		at     time.Duration
		shared int
		known  int
	}{
		{0, 3 + 2, 2},
		{20 * time.Second, 2, 1}, // r1's decision expired
		{2 * time.Minute, 0, 0},  // r2's too, capped at a minute
	} {
		if got := x.Shared(keys, w, start.Add(c.at)); got != c.shared {
			t.Errorf("at +%v: shared %d blocks, want %d", c.at, got, c.shared)
		}
		x.mu.Lock()
		known := len(x.routers)
		x.mu.Unlock()
		if known != c.known {
			t.Errorf("at +%v: %d routers remembered, want %d", c.at, known, c.known)
		}
	}

	for i := range kvindexv1.LedgerMaxQueued + 10 {
		x.Record(fmt.Sprint("r", i), keys, w, start, time.Second)
	}
	if len(x.routers) != kvindexv1.LedgerMaxQueued {
		t.Errorf("%d routers remembered, bound %d", len(x.routers), kvindexv1.LedgerMaxQueued)
	}
}
