package router

import (
	"context"
	"errors"
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
// only the head of its pool's queue retries its decision, each time load goes
// down, so waiters are served in arrival order. Each pool (the model's workers)
// has its own FIFO, so a waiter for one model never holds up another model's;
// --queue-size bounds all of them together. Safe for concurrent use.
type admission struct {
	size    int
	timeout time.Duration

	mu     sync.Mutex
	queues map[string][]chan struct{} // per pool, waiters in arrival order; a waiter's channel is closed when it becomes head; guarded by mu
	n      int                        // waiters in every queue; guarded by mu

	onDepth func(int) // metrics hook; called under mu
}

func newAdmission(size int, timeout time.Duration) *admission {
	return &admission{size: size, timeout: timeout, queues: map[string][]chan struct{}{}}
}

// admit runs decide until it is not errBusy, waiting in pool's queue in between.
func (a *admission) admit(ctx context.Context, pool string, changed func() <-chan struct{}, decide func() (*Decision, error)) (*Decision, error) {
	// Subscribe before deciding, so a release between the decision and the wait
	// is not missed. A request arriving while others wait joins the queue at once:
	// it must not take a slot that frees up from the one at the head.
	ch := changed()
	if a.waiting(pool) == 0 {
		d, err := decide()
		if !errors.Is(err, errBusy) {
			return d, err
		}
	}
	turn, err := a.enqueue(pool)
	if err != nil {
		return nil, err
	}
	defer a.leave(pool, turn)
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

func (a *admission) enqueue(pool string) (chan struct{}, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.n >= a.size {
		return nil, ErrQueueFull
	}
	turn := make(chan struct{})
	q := a.queues[pool]
	if len(q) == 0 {
		close(turn)
	}
	a.queues[pool] = append(q, turn)
	a.n++
	a.depthLocked()
	return turn, nil
}

// leave removes a waiter; when it was head, the next one's turn begins.
func (a *admission) leave(pool string, turn chan struct{}) {
	a.mu.Lock()
	defer a.mu.Unlock()
	q := a.queues[pool]
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
		delete(a.queues, pool)
	} else {
		a.queues[pool] = q
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

// waiting is how many requests wait in pool's queue.
func (a *admission) waiting(pool string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.queues[pool])
}
