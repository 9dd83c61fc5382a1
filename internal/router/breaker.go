package router

import (
	"sync"
	"time"
)

// BreakerState is a worker's circuit-breaker state; the numbers are the values of
// kvindex_router_worker_breaker_state.
type BreakerState int

const (
	// BreakerClosed: the worker takes requests.
	BreakerClosed BreakerState = 0
	// BreakerHalfOpen: the cooldown is over; one probe request may go.
	BreakerHalfOpen BreakerState = 1
	// BreakerOpen: excluded until the cooldown ends.
	BreakerOpen BreakerState = 2
)

func (s BreakerState) String() string {
	switch s {
	case BreakerHalfOpen:
		return "half-open"
	case BreakerOpen:
		return "open"
	}
	return "closed"
}

// Outcome is what one attempt tells the breaker about a worker.
type Outcome uint8

const (
	// OutcomeSuccess: the worker answered (2xx, or a 4xx other than 429: the
	// request was at fault, not the worker).
	OutcomeSuccess Outcome = iota
	// OutcomeFailure: connect error, 5xx, first-byte or idle timeout, broken stream.
	OutcomeFailure
	// OutcomeNeutral: 429, or a request its client cancelled or stopped
	// reading; says nothing.
	OutcomeNeutral
)

// Breakers is the router's private opinion of each worker's health (seeds/000):
// after Threshold consecutive failures a worker is excluded for the cooldown, then
// one probe is admitted: success restores it, failure doubles the cooldown up to
// the maximum. It never changes the fleet (discovery owns that). Safe for
// concurrent use.
type Breakers struct {
	threshold   int
	cooldown    time.Duration
	maxCooldown time.Duration
	now         func() time.Time

	mu sync.Mutex
	m  map[string]*breaker // guarded by mu

	onState func(worker string, s BreakerState) // metrics hook; called under mu
	onTrip  func(worker string)                 // metrics hook; called under mu
}

type breaker struct {
	state    BreakerState
	failures int           // consecutive, while closed
	cooldown time.Duration // current; doubles on failed probes
	until    time.Time     // end of the open window
	probing  bool          // half-open: the probe is in flight
}

func newBreakers(threshold int, cooldown, maxCooldown time.Duration, now func() time.Time) *Breakers {
	return &Breakers{threshold: threshold, cooldown: cooldown, maxCooldown: maxCooldown, now: now, m: map[string]*breaker{}}
}

func (b *Breakers) get(w string) *breaker {
	br := b.m[w]
	if br == nil {
		br = &breaker{cooldown: b.cooldown}
		b.m[w] = br
	}
	return br
}

func (b *Breakers) setLocked(w string, br *breaker, s BreakerState) {
	br.state = s
	if b.onState != nil {
		b.onState(w, s)
	}
}

// Allows reports whether the worker may be chosen now: closed, or half-open with
// no probe in flight (an open breaker whose cooldown ended turns half-open here).
func (b *Breakers) Allows(w string) bool {
	if b.threshold == 0 {
		return true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	br := b.m[w]
	if br == nil {
		return true
	}
	if br.state == BreakerOpen && !b.now().Before(br.until) {
		b.setLocked(w, br, BreakerHalfOpen)
	}
	switch br.state {
	case BreakerClosed:
		return true
	case BreakerHalfOpen:
		return !br.probing
	}
	return false
}

// Begin marks a dispatch to w; it returns true when that dispatch is the
// half-open probe.
func (b *Breakers) Begin(w string) (probe bool) {
	if b.threshold == 0 {
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	br := b.m[w]
	if br == nil || br.state != BreakerHalfOpen || br.probing {
		return false
	}
	br.probing = true
	return true
}

// Record reports an attempt's outcome; probe is what Begin returned for it.
func (b *Breakers) Record(w string, o Outcome, probe bool) {
	if b.threshold == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	br := b.get(w)
	if probe {
		br.probing = false
	}
	switch o {
	case OutcomeSuccess:
		br.failures = 0
		if br.state != BreakerClosed {
			br.cooldown = b.cooldown
			b.setLocked(w, br, BreakerClosed)
		}
	case OutcomeFailure:
		switch br.state {
		case BreakerClosed:
			br.failures++
			if br.failures >= b.threshold {
				b.openLocked(w, br)
			}
		case BreakerHalfOpen:
			br.cooldown = min(2*br.cooldown, b.maxCooldown)
			b.openLocked(w, br)
		}
	}
}

func (b *Breakers) openLocked(w string, br *breaker) {
	br.failures = 0
	br.until = b.now().Add(br.cooldown)
	b.setLocked(w, br, BreakerOpen)
	if b.onTrip != nil {
		b.onTrip(w)
	}
}

// State returns w's state and current cooldown.
func (b *Breakers) State(w string) (BreakerState, time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	br := b.m[w]
	if br == nil {
		return BreakerClosed, b.cooldown
	}
	return br.state, br.cooldown
}
