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
// the maximum. It never changes the fleet (discovery owns that). A worker it
// stops excluding is announced (onUsable): requests queued while it was excluded
// may have nothing else to wake them. Safe for concurrent use.
type Breakers struct {
	threshold   int
	cooldown    time.Duration
	maxCooldown time.Duration
	now         func() time.Time
	// afterFunc runs f once d has passed: time.AfterFunc (tests drive a fake
	// clock's).
	afterFunc func(d time.Duration, f func()) stopper

	mu      sync.Mutex
	m       map[string]*breaker // guarded by mu
	stopped bool                // stop was called: no more cooldown timers; guarded by mu

	onState func(worker string, s BreakerState) // metrics hook; called under mu
	onTrip  func(worker string)                 // metrics hook; called under mu
	// onUsable is called, outside mu, when a worker the breaker excluded may be
	// chosen again: its cooldown ended, its probe was handed back, or it closed.
	onUsable func()
}

// stopper is a timer that can be stopped (*time.Timer).
type stopper interface{ Stop() bool }

type breaker struct {
	state    BreakerState
	failures int           // consecutive, while closed
	cooldown time.Duration // current; doubles on failed probes
	until    time.Time     // end of the open window
	probing  bool          // half-open: the probe is in flight
	timer    stopper       // fires at until (usable); nil when never opened
}

// excludes reports whether the breaker keeps its worker from being chosen (an
// open one whose cooldown ended included: Allows turns it half-open).
func (br *breaker) excludes() bool {
	return br.state == BreakerOpen || br.state == BreakerHalfOpen && br.probing
}

func newBreakers(threshold int, cooldown, maxCooldown time.Duration, now func() time.Time) *Breakers {
	return &Breakers{threshold: threshold, cooldown: cooldown, maxCooldown: maxCooldown, now: now, m: map[string]*breaker{},
		afterFunc: func(d time.Duration, f func()) stopper { return time.AfterFunc(d, f) }}
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
	b.halfOpenIfDueLocked(w, br)
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
	if b.record(w, o, probe) {
		b.usable()
	}
}

// record is Record under mu; it reports whether w was excluded before and is
// not any more (its probe came back, or it closed).
func (b *Breakers) record(w string, o Outcome, probe bool) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	br := b.get(w)
	excluded := br.excludes()
	if probe {
		br.probing = false
	}
	switch o {
	case OutcomeSuccess:
		br.failures = 0
		if br.state != BreakerClosed {
			br.cooldown = b.cooldown
			b.setLocked(w, br, BreakerClosed)
			if br.timer != nil { // closed before its cooldown ended: nothing to announce then
				br.timer.Stop()
				br.timer = nil
			}
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
	return excluded && !br.excludes()
}

// openLocked opens w's breaker for its cooldown, and sets the timer that
// announces the cooldown's end: Allows would let the worker in again then, but
// only when a decision asks, and the requests queued for it may have nothing
// else to make them decide again.
func (b *Breakers) openLocked(w string, br *breaker) {
	br.failures = 0
	br.until = b.now().Add(br.cooldown)
	b.setLocked(w, br, BreakerOpen)
	if b.onTrip != nil {
		b.onTrip(w)
	}
	if br.timer != nil {
		br.timer.Stop()
	}
	if !b.stopped {
		br.timer = b.afterFunc(br.cooldown, func() { b.cooldownEnded(w) })
	}
}

// cooldownEnded turns w's breaker half-open when its cooldown is over, so that
// the state gauge and State say so without waiting for a decision to ask
// (Allows), and announces that the worker may be chosen again.
func (b *Breakers) cooldownEnded(w string) {
	b.mu.Lock()
	if br := b.m[w]; br != nil {
		b.halfOpenIfDueLocked(w, br)
	}
	b.mu.Unlock()
	b.usable()
}

// halfOpenIfDueLocked turns an open breaker whose cooldown is over half-open.
func (b *Breakers) halfOpenIfDueLocked(w string, br *breaker) {
	if br.state == BreakerOpen && !b.now().Before(br.until) {
		b.setLocked(w, br, BreakerHalfOpen)
	}
}

// usable announces that a worker may be chosen again (onUsable).
func (b *Breakers) usable() {
	if b.onUsable != nil {
		b.onUsable()
	}
}

// stop stops the cooldown timers, for good (at shutdown).
func (b *Breakers) stop() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.stopped = true
	for _, br := range b.m {
		if br.timer != nil {
			br.timer.Stop()
			br.timer = nil
		}
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
