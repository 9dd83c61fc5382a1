package router

import (
	"sync"
	"time"

	kvindexv1 "github.com/kvindex/kvindex/api/proto/kvindex/v1"
)

// OtherRouters remembers the other routers' recent decisions (reached through
// the shared ledger) per deciding router, to count the prefix a request shares
// with their load on a target once per router, as each router's reported load
// counts it. The router's ledger client fills it from the leader's pushes; the
// route bench's offline simulator fills it at its simulated pushes, so both
// count shared prefixes with this code. Safe for concurrent use.
type OtherRouters struct {
	// o holds each decision under Target.Worker "<worker>\x00<router id>".
	o      *overlay
	maxTTL time.Duration

	mu sync.Mutex
	// routers are the routers seen deciding, each until its latest decision
	// expires (a restarted router comes back under a new id; the old one goes
	// with its decisions); guarded by mu; at most kvindexv1.LedgerMaxQueued.
	routers map[string]time.Time
}

// NewOtherRouters returns an empty store bounded to maxMarks marks, which keeps
// a decision for the TTL its router sent, at most maxTTL (the router's
// --approx-ttl, as its predicted overlay keeps the same decisions).
func NewOtherRouters(maxTTL time.Duration, maxMarks int) *OtherRouters {
	return &OtherRouters{o: newOverlay(maxTTL, maxTTL, maxMarks), maxTTL: maxTTL, routers: map[string]time.Time{}}
}

// Record notes that router sent the prompt's chained keys to t at now, for ttl
// (the deciding router's predicted TTL).
func (x *OtherRouters) Record(router string, keys []uint64, t Target, now time.Time, ttl time.Duration) {
	x.o.RecordFor(keys, x.target(t, router), now, ttl)
	until := now.Add(min(ttl, x.maxTTL))
	x.mu.Lock()
	last, known := x.routers[router]
	if known && until.After(last) || !known && len(x.routers) < kvindexv1.LedgerMaxQueued {
		x.routers[router] = until
	}
	x.mu.Unlock()
}

func (x *OtherRouters) target(t Target, router string) Target {
	return Target{Worker: t.Worker + "\x00" + router, Rank: t.Rank}
}

// Shared is how many of keys' leading blocks the other routers' recent
// decisions sent to t, summed over the routers.
func (x *OtherRouters) Shared(keys []uint64, t Target, now time.Time) int {
	if len(keys) == 0 {
		return 0
	}
	x.mu.Lock()
	ids := make([]Target, 0, len(x.routers))
	for id, until := range x.routers {
		if until.Before(now) {
			delete(x.routers, id) // every decision of it has expired
			continue
		}
		ids = append(ids, x.target(t, id))
	}
	x.mu.Unlock()
	matched := make([]int, len(ids))
	x.o.Match(keys, ids, now, matched, nil)
	n := 0
	for _, m := range matched {
		n += m
	}
	return n
}

// ShareRemote adds to the candidate what its request shares with the other
// routers' load on it (remote): the prefix their recent decisions sent there
// (others, counted once per deciding router), at most what they hold, so that a
// burst split over routers co-locates as it does through one. Other routers'
// load carries no block keys, so this applies only when recent decisions sent
// the request's prefix to the target (predicted > 0); others is called only then.
func (c *Candidate) ShareRemote(remote Load, predicted int, others func() int, blockSize int) {
	if remote == (Load{}) || predicted <= 0 {
		return
	}
	n := others()
	c.SharedActive += min(n, remote.DecodeBlocks)
	c.SharedPrefill += min(n, remote.PrefillTokens/blockSize)
}
