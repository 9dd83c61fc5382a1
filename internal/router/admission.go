package router

import (
	"context"
	"errors"
	"maps"
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
// goes down, so waiters for the same candidates are served in arrival order. Each
// candidate set (queueKey) has its own FIFO, so a waiter whose candidates are busy
// never holds up a request whose candidates are free (another model, another LoRA
// adapter, another subset hint); --queue-size bounds all of them together. Safe
// for concurrent use.
type admission struct {
	size    int
	timeout time.Duration

	mu     sync.Mutex
	queues map[string][]chan struct{} // per candidate set, waiters in arrival order; a waiter's channel is closed when it becomes head; guarded by mu
	n      int                        // waiters in every queue; guarded by mu

	onDepth func(int) // metrics hook; called under mu
}

func newAdmission(size int, timeout time.Duration) *admission {
	return &admission{size: size, timeout: timeout, queues: map[string][]chan struct{}{}}
}

// admit decides p's route (tried: the workers it already failed on), waiting in
// the admission queue of its candidate set while every candidate is busy. A
// request naming its worker (direct mode) never waits: its decision never finds
// the worker busy, so it has nothing to wait for.
func (r *Router) admit(ctx context.Context, p *prepared, tried map[string]bool) (*Decision, error) {
	decide := func() (*Decision, error) { return r.decide(ctx, p, tried, false) }
	if p.route.DirectWorker != "" {
		return decide()
	}
	return r.adm.admit(ctx, queueKey(p, tried), r.ledger.Changed, decide)
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
func (a *admission) admit(ctx context.Context, queue string, changed func() <-chan struct{}, decide func() (*Decision, error)) (*Decision, error) {
	// Subscribe before deciding, so a release between the decision and the wait
	// is not missed. A request arriving while others wait joins the queue at once:
	// it must not take a slot that frees up from the one at the head.
	ch := changed()
	if a.waiting(queue) == 0 {
		d, err := decide()
		if !errors.Is(err, errBusy) {
			return d, err
		}
	}
	turn, err := a.enqueue(queue)
	if err != nil {
		return nil, err
	}
	defer a.leave(queue, turn)
	deadline := time.NewTimer(a.timeout)
	defer deadline.Stop()
	// Wait to be head.
	select {
	case <-turn:
	case <-deadline.C:
		return nil, ErrQueueTimeout
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
	for {
		ch = changed()
		d, err := decide()
		if !errors.Is(err, errBusy) {
			return d, err
		}
		select {
		case <-ch:
		case <-deadline.C:
			return nil, ErrQueueTimeout
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
	}
}

func (a *admission) enqueue(queue string) (chan struct{}, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.n >= a.size {
		return nil, ErrQueueFull
	}
	turn := make(chan struct{})
	q := a.queues[queue]
	if len(q) == 0 {
		close(turn)
	}
	a.queues[queue] = append(q, turn)
	a.n++
	a.depthLocked()
	return turn, nil
}

// leave removes a waiter; when it was head, the next one's turn begins.
func (a *admission) leave(queue string, turn chan struct{}) {
	a.mu.Lock()
	defer a.mu.Unlock()
	q := a.queues[queue]
	for i, t := range q {
		if t == turn {
			q = append(q[:i], q[i+1:]...)
			a.n--
			if i == 0 && len(q) > 0 {
				close(q[0])
			}
			break
		}
	}
	if len(q) == 0 {
		delete(a.queues, queue)
	} else {
		a.queues[queue] = q
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

// waiting is how many requests wait in queue.
func (a *admission) waiting(queue string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.queues[queue])
}
