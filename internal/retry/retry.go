// Package retry is kvindex's one retry pause: exponential backoff with jitter,
// bounded by the caller's context. The Go client (clients/go), the server's
// leader forwarding and a joining node's requests all wait between attempts
// with it, so that a burst of callers spreads out instead of retrying in step
// through an election.
//
// It decides only how long to wait; what is worth retrying, and how many
// times, stays with each caller. It starts no goroutine and keeps no state: a
// Backoff is a value, safe for concurrent use.
package retry

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"
)

// Backoff is an exponential backoff with jitter: before retry n (0 for the
// first retry) it waits a random duration between half of and the whole of
// min(Initial * 2^n, Max), so that callers that failed together retry apart.
type Backoff struct {
	// Initial is the ceiling of the first pause; Max the ceiling of any pause.
	Initial, Max time.Duration
}

// Default is the backoff kvindex uses: 25 ms doubling up to 1 s, so that about
// 10 attempts span an election's few seconds.
var Default = Backoff{Initial: 25 * time.Millisecond, Max: time.Second}

// Validate reports a backoff that cannot work, naming the bad value.
func (b Backoff) Validate() error {
	switch {
	case b.Initial <= 0:
		return fmt.Errorf("retry: Initial=%v must be positive", b.Initial)
	case b.Max < b.Initial:
		return fmt.Errorf("retry: Max=%v must be at least Initial=%v", b.Max, b.Initial)
	}
	return nil
}

// Ceiling returns the longest pause before retry n: min(Initial * 2^n, Max).
func (b Backoff) Ceiling(n int) time.Duration {
	d := b.Initial
	for range n {
		if d >= b.Max/2 {
			return b.Max
		}
		d *= 2
	}
	return min(d, b.Max)
}

// Delay returns the pause before retry n: uniform in [Ceiling(n)/2, Ceiling(n)].
func (b Backoff) Delay(n int) time.Duration {
	c := b.Ceiling(n)
	half := c / 2
	return half + rand.N(c-half+1)
}

// Wait pauses before retry n (see Delay). It returns ctx's error, at once,
// when ctx ends first, and when the pause would outlast ctx's deadline: the
// caller cannot use another attempt then.
func (b Backoff) Wait(ctx context.Context, n int) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	d := b.Delay(n)
	if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) < d {
		return context.DeadlineExceeded
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
