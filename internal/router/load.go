package router

import (
	"sync"
	"time"
)

// Target is one routable unit: a worker's data-parallel rank.
type Target struct {
	Worker string
	Rank   uint32
}

// Load is what the router has in flight on a target. Prompt blocks are counted
// once however many in-flight requests share them (the engine's prefix cache
// stores and computes a shared block once), as Dynamo counts active blocks.
type Load struct {
	// InFlight counts requests dispatched and not yet finished.
	InFlight int
	// PrefillTokens are uncached prompt tokens of requests whose first response
	// byte has not arrived yet (distinct blocks × block size, plus partial tails).
	PrefillTokens int
	// DecodeBlocks are the KV blocks of requests in flight: distinct prompt
	// blocks plus each request's partial tail and expected output blocks.
	DecodeBlocks int
}

// Ledger holds the router's load per target as reservations: every dispatched leg
// takes one and exactly one owner (the leg's defer) releases it, on success, error,
// retry and cancel alike. A sweep drops reservations older than the TTL, so a leak
// can never pin load forever. Safe for concurrent use.
type Ledger struct {
	ttl time.Duration
	now func() time.Time

	mu sync.Mutex
	// targets keeps idle targets too: their key maps keep their capacity, so a
	// steady stream of requests does not regrow them (one entry per target ever
	// routed to).
	targets map[Target]*targetLoad    // guarded by mu
	live    map[*Reservation]struct{} // guarded by mu
	// changed is closed and replaced whenever load goes down (this router's, or
	// the other routers' as the shared ledger reports it: wake), waking queued
	// requests.
	changed chan struct{} // guarded by mu

	onDelta  func(worker string, inflight, prefillTokens, decodeBlocks int) // metrics hook; called under mu
	onExpire func()                                                         // metrics hook
}

// targetLoad is one target's load with the block keys behind it.
type targetLoad struct {
	Load
	active     map[uint64]int32 // prompt block key -> in-flight requests holding it
	prefilling map[uint64]int32 // prompt block key -> in-flight requests still prefilling it
}

func newLedger(ttl time.Duration, now func() time.Time) *Ledger {
	return &Ledger{ttl: ttl, now: now, targets: map[Target]*targetLoad{}, live: map[*Reservation]struct{}{},
		changed: make(chan struct{})}
}

// Reservation is the load one upstream leg holds on one target.
type Reservation struct {
	l       *Ledger
	t       Target
	created time.Time
	bs      int
	// What is still held; guarded by l.mu.
	keys        []uint64 // prompt block keys, held in active
	prefillKeys []uint64 // uncached prompt block keys, held in prefilling until the first byte
	extraTokens int      // uncached tokens outside full blocks (the partial tail), until the first byte
	extraBlocks int      // partial tail + expected output blocks
	held        bool
}

// Demand is what one leg asks of a target.
type Demand struct {
	// Keys are the prompt's full-block keys; the first Cached of them are cached on
	// the target and need no prefill.
	Keys   []uint64
	Cached int
	// BlockSize, PromptTokens and OutputTokens size the partial tail and output.
	BlockSize, PromptTokens, OutputTokens int
	// Prefill: the leg prefills here (false for a decode leg fed by a prefill worker).
	Prefill bool
}

// Reserve records a leg to t.
func (l *Ledger) Reserve(t Target, d Demand) *Reservation {
	bs := max(d.BlockSize, 1)
	tail := d.PromptTokens - len(d.Keys)*bs
	r := &Reservation{l: l, t: t, created: l.now(), bs: bs, keys: d.Keys, held: true,
		extraBlocks: (max(tail, 0) + d.OutputTokens + bs - 1) / bs}
	if d.Prefill {
		r.prefillKeys = d.Keys[min(d.Cached, len(d.Keys)):]
		r.extraTokens = max(tail, 0)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	tl := l.targets[t]
	if tl == nil {
		tl = &targetLoad{active: map[uint64]int32{}, prefilling: map[uint64]int32{}}
		l.targets[t] = tl
	}
	before := tl.Load
	tl.InFlight++
	for _, k := range r.keys {
		if tl.active[k]++; tl.active[k] == 1 {
			tl.DecodeBlocks++
		}
	}
	tl.DecodeBlocks += r.extraBlocks
	for _, k := range r.prefillKeys {
		if tl.prefilling[k]++; tl.prefilling[k] == 1 {
			tl.PrefillTokens += bs
		}
	}
	tl.PrefillTokens += r.extraTokens
	l.live[r] = struct{}{}
	l.deltaLocked(t, before, tl.Load)
	return r
}

// FirstByte releases the reservation's prefill: the engine has finished
// prefilling. Later calls do nothing.
func (r *Reservation) FirstByte() {
	l := r.l
	l.mu.Lock()
	defer l.mu.Unlock()
	if !r.held {
		return
	}
	tl := l.targets[r.t]
	before := tl.Load
	r.dropPrefillLocked(tl)
	l.deltaLocked(r.t, before, tl.Load)
	l.wakeLocked()
}

func (r *Reservation) dropPrefillLocked(tl *targetLoad) {
	for _, k := range r.prefillKeys {
		if tl.prefilling[k]--; tl.prefilling[k] == 0 {
			delete(tl.prefilling, k)
			tl.PrefillTokens -= r.bs
		}
	}
	tl.PrefillTokens -= r.extraTokens
	r.prefillKeys, r.extraTokens = nil, 0
}

// Release returns everything the reservation holds. It is idempotent, so the
// owner's defer and the TTL sweep may both call it.
func (r *Reservation) Release() {
	l := r.l
	l.mu.Lock()
	defer l.mu.Unlock()
	l.releaseLocked(r)
}

func (l *Ledger) releaseLocked(r *Reservation) {
	if !r.held {
		return
	}
	r.held = false
	delete(l.live, r)
	tl := l.targets[r.t]
	before := tl.Load
	r.dropPrefillLocked(tl)
	tl.InFlight--
	for _, k := range r.keys {
		if tl.active[k]--; tl.active[k] == 0 {
			delete(tl.active, k)
			tl.DecodeBlocks--
		}
	}
	tl.DecodeBlocks -= r.extraBlocks
	r.keys = nil
	l.deltaLocked(r.t, before, tl.Load)
	l.wakeLocked()
}

func (l *Ledger) deltaLocked(t Target, before, after Load) {
	if l.onDelta != nil {
		l.onDelta(t.Worker, after.InFlight-before.InFlight, after.PrefillTokens-before.PrefillTokens, after.DecodeBlocks-before.DecodeBlocks)
	}
}

// wake wakes everyone waiting on Changed for load held outside this ledger that
// went down: the other routers' (fleetLedger), which decisions count as well.
func (l *Ledger) wake() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.wakeLocked()
}

// wakeLocked wakes everyone waiting on Changed.
func (l *Ledger) wakeLocked() {
	close(l.changed)
	l.changed = make(chan struct{})
}

// Load returns the load on t.
func (l *Ledger) Load(t Target) Load {
	l.mu.Lock()
	defer l.mu.Unlock()
	if tl := l.targets[t]; tl != nil {
		return tl.Load
	}
	return Load{}
}

// Shared returns how many of keys (a prompt's chained keys) are in flight on t
// (active) and how many of those are still being prefilled there: work a request
// with these keys would share rather than add.
func (l *Ledger) Shared(t Target, keys []uint64) (active, prefilling int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	tl := l.targets[t]
	if tl == nil {
		return 0, 0
	}
	// keys are chained (each stands for its whole prefix) and a reservation holds
	// a prompt's every key, so the keys in flight here are a leading run: the
	// count stops at the first one that is not, and a target that shares nothing
	// costs one lookup, whatever the prompt's length.
	for _, k := range keys {
		if tl.active[k] == 0 {
			break
		}
		active++
		if tl.prefilling[k] > 0 {
			prefilling++
		}
	}
	return active, prefilling
}

// Loads returns a copy of every busy target's load.
func (l *Ledger) Loads() map[Target]Load {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[Target]Load, len(l.targets))
	for t, tl := range l.targets {
		if tl.Load != (Load{}) {
			out[t] = tl.Load
		}
	}
	return out
}

// Changed returns a channel closed the next time any load goes down: this
// ledger's, or the other routers' (wake).
func (l *Ledger) Changed() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.changed
}

// Sweep releases reservations older than the TTL and returns how many.
func (l *Ledger) Sweep() int {
	cutoff := l.now().Add(-l.ttl)
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for r := range l.live {
		if r.created.Before(cutoff) {
			l.releaseLocked(r)
			n++
			if l.onExpire != nil {
				l.onExpire()
			}
		}
	}
	return n
}
