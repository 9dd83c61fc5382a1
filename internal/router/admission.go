package router

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"time"
)

// Admission errors (429 with Retry-After).
var (
	// ErrQueueFull: every eligible worker is busy and the queue is full.
	ErrQueueFull = errors.New("every eligible worker is busy and the admission queue is full")
	// ErrQueueTimeout: the request waited --queue-timeout without a worker freeing up.
	ErrQueueTimeout = errors.New("every eligible worker stayed busy for the whole queue timeout")
)

// admission is the bounded FIFO in front of a busy fleet. A request whose every
// eligible candidate is excluded by a busy threshold or --max-pending waits here;
// only the head of its candidate set's queue retries its decision, each time load
// goes down or a worker may have become usable otherwise (wake: the fleet
// changed, a breaker's cooldown ended or its probe came back), so waiters for the
// same candidates are served in arrival order. Each
// candidate set (queueKey) has its own FIFO, so a waiter whose candidates are busy
// never holds up a request whose candidates are free (another model, another LoRA
// adapter, another subset hint); --queue-size bounds all of them together.
//
// Sets may share workers, and a worker that frees goes to the oldest waiter that
// can use it, whatever its queue: every decision is handed a held predicate that
// keeps, for the head of every other queue that arrived earlier (every queue's
// head, for a request not queued yet), the workers that head may be served by, so
// a later request of another set neither takes such a worker on arrival nor wins
// it from the older head when both are woken. A decision that left a free worker
// to an older head pokes that head (it may not have been woken yet: a new
// request can find a worker free before the wake-up that freed it reaches the
// head), and a waiter that leaves pokes the later heads it held workers from.
// The dry run (dryAdmit) decides with the same held predicate, and queues and
// pokes nobody. Safe for concurrent use.
type admission struct {
	size    int
	timeout time.Duration

	mu     sync.Mutex
	queues map[string][]*waiter // per candidate set, waiters in arrival order; guarded by mu
	n      int                  // waiters in every queue; guarded by mu
	seq    uint64               // waiters ever queued, their arrival order; guarded by mu
	woken  chan struct{}        // closed and replaced by wake; guarded by mu

	onDepth func(int) // metrics hook; called under mu
}

// waiter is one queued request.
type waiter struct {
	seq uint64
	// serves says whether the request may be served by a worker (its candidate
	// set); called by other requests' decisions, so it must be safe for
	// concurrent use and must not change.
	serves func(*Worker) bool
	turn   chan struct{} // closed when the waiter becomes its queue's head
	poke   chan struct{} // 1-buffered: decide again, a worker may be free for it
}

func newAdmission(size int, timeout time.Duration) *admission {
	return &admission{size: size, timeout: timeout, queues: map[string][]*waiter{}, woken: make(chan struct{})}
}

// wake makes the head of every queue decide again: a worker may have become
// usable without load going down (the fleet changed, a breaker's cooldown ended
// or its probe came back), and nothing else would wake them before their queue
// timeout. The oldest-first rule holds as for any wake-up: each head decides
// with the workers of the earlier heads held.
func (a *admission) wake() {
	a.mu.Lock()
	defer a.mu.Unlock()
	close(a.woken)
	a.woken = make(chan struct{})
}

// wakeups returns a channel closed at the next wake.
func (a *admission) wakeups() <-chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.woken
}

// admit decides p's route (tried: the workers it already failed on), waiting in
// the admission queue of its candidate set while every candidate is busy. A
// request naming its worker (direct mode) never waits: its decision never finds
// the worker busy, so it has nothing to wait for.
func (r *Router) admit(ctx context.Context, p *prepared, tried map[string]bool) (*Decision, error) {
	if p.route.DirectWorker != "" {
		return r.decide(ctx, p, tried, false)
	}
	// What other requests' decisions ask of this one while it waits: its own
	// copies, since the caller goes on changing tried (and p.route) once it
	// is admitted.
	route, failed := p.route, maps.Clone(tried)
	serves := func(w *Worker) bool { return !failed[w.ID] && route.eligible(w) }
	return r.adm.admit(ctx, queueKey(p, tried), serves, r.ledger.Changed, r.decideHeld(ctx, p, tried, false))
}

// decideHeld is decide with the workers held for earlier waiters (the held
// predicate the admission queue hands it) excluded.
func (r *Router) decideHeld(ctx context.Context, p *prepared, tried map[string]bool, dryRun bool) func(held func(*Worker) bool) (*Decision, error) {
	return func(held func(*Worker) bool) (*Decision, error) {
		p.route.held = held
		defer func() { p.route.held = nil }()
		return r.decide(ctx, p, tried, dryRun)
	}
}

// dryAdmit is admit for the dry run (POST /debug/route): the decision p would
// get on arrival, taken with the workers of the earlier waiters held exactly as
// admit holds them, or, when p would wait in the admission queue instead, why.
// It changes nothing: it neither queues nor pokes a waiter, and its decision
// reserves no load and takes no breaker probe. A request that would wait while
// the queue is full gets ErrQueueFull, as admit answers it.
func (r *Router) dryAdmit(ctx context.Context, p *prepared) (*Decision, *waitJSON, error) {
	if p.route.DirectWorker != "" {
		d, err := r.decide(ctx, p, nil, true)
		return d, nil, err
	}
	heads, ahead, full := r.adm.look(queueKey(p, nil))
	var wait waitJSON
	if ahead > 0 {
		wait.Ahead = ahead
		wait.Reason = fmt.Sprintf("%d requests for the same candidates wait ahead of it in the admission queue", ahead)
	} else {
		d, err := r.decideHeld(ctx, p, nil, true)(heldFor(heads, func(_ *waiter, w *Worker) {
			if !slices.Contains(wait.Held, w.ID) {
				wait.Held = append(wait.Held, w.ID)
			}
		}))
		if !errors.Is(err, errBusy) {
			return d, nil, err
		}
		wait.Reason = "every eligible worker is busy, full or held for an earlier waiter of another candidate set"
	}
	if full {
		return nil, nil, ErrQueueFull
	}
	return nil, &wait, nil
}

// queueKey names the candidate set a request draws from, which its admission
// queue is: the model as requested (a LoRA adapter's name when it asks for one;
// with the fleet, it decides the pools and their roles), the EPP's subset hint,
// and the workers the request already failed on (a retry's candidates are fewer).
func queueKey(p *prepared, tried map[string]bool) string {
	if p.subset == "" && len(tried) == 0 {
		return p.route.Model
	}
	var b strings.Builder
	b.WriteString(p.route.Model)
	b.WriteString("\x00")
	b.WriteString(p.subset)
	for _, id := range slices.Sorted(maps.Keys(tried)) {
		b.WriteString("\x00")
		b.WriteString(id)
	}
	return b.String()
}

// admit runs decide until it is not errBusy, waiting in queue's FIFO in between.
// serves is the request's candidate set, for the held predicate of later requests
// while it waits; decide gets the predicate for the earlier ones.
func (a *admission) admit(ctx context.Context, queue string, serves func(*Worker) bool, changed func() <-chan struct{}, decide func(held func(*Worker) bool) (*Decision, error)) (*Decision, error) {
	// Subscribe before deciding, so a release between the decision and the wait
	// is not missed. A request arriving while others wait for the same candidates
	// joins the queue at once: it must not take a slot that frees up from the one
	// at the head.
	ch := changed()
	if heads, first := a.arrive(queue); first {
		d, err := a.try(decide, heads)
		if !errors.Is(err, errBusy) {
			return d, err
		}
	}
	w, err := a.enqueue(queue, serves)
	if err != nil {
		return nil, err
	}
	defer a.leave(queue, w)
	deadline := time.NewTimer(a.timeout)
	defer deadline.Stop()
	// Wait to be head.
	select {
	case <-w.turn:
	case <-deadline.C:
		return nil, ErrQueueTimeout
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
	for {
		ch = changed()
		woken := a.wakeups()
		d, err := a.try(decide, a.headsBefore(queue, w.seq))
		if !errors.Is(err, errBusy) {
			return d, err
		}
		select {
		case <-ch:
		case <-woken:
		case <-w.poke:
		case <-deadline.C:
			return nil, ErrQueueTimeout
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
	}
}

// try runs decide with the held predicate of the earlier heads (oldest first),
// then pokes each head that a free worker was left to: it may be asleep still
// (the wake-up that freed the worker may not have reached it yet).
func (a *admission) try(decide func(held func(*Worker) bool) (*Decision, error), earlier []*waiter) (*Decision, error) {
	var holders []*waiter
	d, err := decide(heldFor(earlier, func(h *waiter, _ *Worker) {
		if !slices.Contains(holders, h) {
			holders = append(holders, h)
		}
	}))
	for _, h := range holders {
		poke(h)
	}
	return d, err
}

// heldFor is the held predicate of a decision that comes after the waiters
// earlier (oldest first): a worker one of them may be served by is held for the
// oldest such waiter, and found is told which.
func heldFor(earlier []*waiter, found func(h *waiter, wk *Worker)) func(*Worker) bool {
	return func(wk *Worker) bool {
		for _, h := range earlier {
			if h.serves(wk) {
				found(h, wk)
				return true
			}
		}
		return false
	}
}

func poke(w *waiter) {
	select {
	case w.poke <- struct{}{}:
	default: // one pending poke is enough
	}
}

// arrive reports whether queue is empty, so that a new request may decide at
// once, and the heads of the other queues, every one of them earlier than it.
func (a *admission) arrive(queue string) (heads []*waiter, first bool) {
	heads, ahead, _ := a.look(queue)
	return heads, ahead == 0
}

// look is what a request arriving for queue finds: how many wait in it already
// (ahead), the heads of the other queues when none does (nil otherwise: the
// request would not decide), and whether the queue is full.
func (a *admission) look(queue string) (heads []*waiter, ahead int, full bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if ahead = len(a.queues[queue]); ahead == 0 {
		heads = a.headsBeforeLocked(queue, math.MaxUint64)
	}
	return heads, ahead, a.fullLocked()
}

func (a *admission) fullLocked() bool { return a.n >= a.size }

// headsBefore lists the heads of the queues other than queue that arrived
// before seq, oldest first.
func (a *admission) headsBefore(queue string, seq uint64) []*waiter {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.headsBeforeLocked(queue, seq)
}

func (a *admission) headsBeforeLocked(queue string, seq uint64) []*waiter {
	var heads []*waiter
	for k, q := range a.queues {
		if k != queue && q[0].seq < seq {
			heads = append(heads, q[0])
		}
	}
	slices.SortFunc(heads, func(x, y *waiter) int { return cmp.Compare(x.seq, y.seq) })
	return heads
}

func (a *admission) enqueue(queue string, serves func(*Worker) bool) (*waiter, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.fullLocked() {
		return nil, ErrQueueFull
	}
	a.seq++
	w := &waiter{seq: a.seq, serves: serves, turn: make(chan struct{}), poke: make(chan struct{}, 1)}
	q := a.queues[queue]
	if len(q) == 0 {
		close(w.turn)
	}
	a.queues[queue] = append(q, w)
	a.n++
	a.depthLocked()
	return w, nil
}

// leave removes a waiter; when it was head, the next one's turn begins, and the
// later heads of the other queues, which it may have held workers from, are
// poked.
func (a *admission) leave(queue string, w *waiter) {
	a.mu.Lock()
	defer a.mu.Unlock()
	q := a.queues[queue]
	i := slices.Index(q, w)
	if i < 0 {
		return
	}
	q = slices.Delete(q, i, i+1)
	a.n--
	if len(q) == 0 {
		delete(a.queues, queue)
	} else {
		a.queues[queue] = q
	}
	if i == 0 {
		if len(q) > 0 {
			close(q[0].turn)
		}
		for k, other := range a.queues {
			if k != queue && other[0].seq > w.seq {
				poke(other[0])
			}
		}
	}
	a.depthLocked()
}

func (a *admission) depthLocked() {
	if a.onDepth != nil {
		a.onDepth(a.n)
	}
}

// depth returns how many requests wait.
func (a *admission) depth() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.n
}
