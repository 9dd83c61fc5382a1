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

// Load is what the router has in flight on a target.
type Load struct {
	// InFlight counts requests dispatched and not yet finished.
	InFlight int
	// PrefillTokens are uncached prompt tokens of requests whose first response
	// byte has not arrived yet.
	PrefillTokens int
	// DecodeBlocks are KV blocks (prompt + expected output) of requests in flight.
	DecodeBlocks int
}

// Ledger holds the router's load per target as reservations: every dispatched leg
// takes one and exactly one owner (the leg's defer) releases it, on success, error,
// retry and cancel alike. A sweep drops reservations older than the TTL, so a leak
// can never pin load forever. Safe for concurrent use.
type Ledger struct {
	ttl time.Duration
	now func() time.Time

	mu    sync.Mutex
	loads map[Target]*Load          // guarded by mu; entries are dropped at zero
	live  map[*Reservation]struct{} // guarded by mu
	// changed is closed and replaced whenever load goes down, waking queued requests.
	changed chan struct{} // guarded by mu

	onDelta  func(worker string, inflight, prefillTokens, decodeBlocks int) // metrics hook; called under mu
	onExpire func()                                                         // metrics hook
}

func newLedger(ttl time.Duration, now func() time.Time) *Ledger {
	return &Ledger{ttl: ttl, now: now, loads: map[Target]*Load{}, live: map[*Reservation]struct{}{},
		changed: make(chan struct{})}
}

// Reservation is the load one upstream leg holds on one target.
type Reservation struct {
	l       *Ledger
	t       Target
	created time.Time
	// What is still held; guarded by l.mu.
	prefill, decode int
	held            bool
}

// Reserve records a leg to t with its uncached prefill tokens and decode blocks.
func (l *Ledger) Reserve(t Target, prefillTokens, decodeBlocks int) *Reservation {
	r := &Reservation{l: l, t: t, created: l.now(), prefill: prefillTokens, decode: decodeBlocks, held: true}
	l.mu.Lock()
	defer l.mu.Unlock()
	ld := l.loads[t]
	if ld == nil {
		ld = &Load{}
		l.loads[t] = ld
	}
	ld.InFlight++
	ld.PrefillTokens += prefillTokens
	ld.DecodeBlocks += decodeBlocks
	l.live[r] = struct{}{}
	l.deltaLocked(t, 1, prefillTokens, decodeBlocks)
	return r
}

// FirstByte releases the reservation's prefill tokens: the engine has finished
// prefilling. Later calls do nothing.
func (r *Reservation) FirstByte() {
	l := r.l
	l.mu.Lock()
	defer l.mu.Unlock()
	if !r.held || r.prefill == 0 {
		return
	}
	l.loads[r.t].PrefillTokens -= r.prefill
	l.deltaLocked(r.t, 0, -r.prefill, 0)
	r.prefill = 0
	l.wakeLocked()
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
	ld := l.loads[r.t]
	ld.InFlight--
	ld.PrefillTokens -= r.prefill
	ld.DecodeBlocks -= r.decode
	l.deltaLocked(r.t, -1, -r.prefill, -r.decode)
	r.prefill, r.decode = 0, 0
	if *ld == (Load{}) {
		delete(l.loads, r.t)
	}
	l.wakeLocked()
}

func (l *Ledger) deltaLocked(t Target, inflight, prefill, decode int) {
	if l.onDelta != nil {
		l.onDelta(t.Worker, inflight, prefill, decode)
	}
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
	if ld := l.loads[t]; ld != nil {
		return *ld
	}
	return Load{}
}

// Loads returns a copy of every target's load.
func (l *Ledger) Loads() map[Target]Load {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[Target]Load, len(l.loads))
	for t, ld := range l.loads {
		out[t] = *ld
	}
	return out
}

// Changed returns a channel closed the next time any load goes down.
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
