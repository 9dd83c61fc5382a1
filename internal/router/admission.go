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
// only the head of the queue retries its decision, each time load goes down, so
// waiters are served in arrival order. Safe for concurrent use.
type admission struct {
	size    int
	timeout time.Duration

	mu    sync.Mutex
	queue []chan struct{} // waiters in arrival order; a waiter's channel is closed when it becomes head; guarded by mu

	onDepth func(int) // metrics hook; called under mu
}

func newAdmission(size int, timeout time.Duration) *admission {
	return &admission{size: size, timeout: timeout}
}

// admit runs decide until it is not errBusy, waiting in the queue in between.
func (a *admission) admit(ctx context.Context, changed func() <-chan struct{}, decide func() (*Decision, error)) (*Decision, error) {
	// Subscribe before deciding, so a release between the decision and the wait
	// is not missed.
	ch := changed()
	d, err := decide()
	if !errors.Is(err, errBusy) {
		return d, err
	}
	turn, err := a.enqueue()
	if err != nil {
		return nil, err
	}
	defer a.leave(turn)
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
		d, err = decide()
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

func (a *admission) enqueue() (chan struct{}, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.queue) >= a.size {
		return nil, ErrQueueFull
	}
	turn := make(chan struct{})
	if len(a.queue) == 0 {
		close(turn)
	}
	a.queue = append(a.queue, turn)
	a.depthLocked()
	return turn, nil
}

// leave removes a waiter; when it was head, the next one's turn begins.
func (a *admission) leave(turn chan struct{}) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for i, t := range a.queue {
		if t == turn {
			a.queue = append(a.queue[:i], a.queue[i+1:]...)
			if i == 0 && len(a.queue) > 0 {
				close(a.queue[0])
			}
			break
		}
	}
	a.depthLocked()
}

func (a *admission) depthLocked() {
	if a.onDepth != nil {
		a.onDepth(len(a.queue))
	}
}

// depth returns how many requests wait.
func (a *admission) depth() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.queue)
}
