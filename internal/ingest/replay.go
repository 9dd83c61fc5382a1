package ingest

import (
	"context"
	"errors"
	"fmt"
	"math"
	"syscall"
	"time"

	"github.com/kvindex/kvindex/internal/ingest/wire"
	zmq "github.com/pebbe/zmq4"
)

var (
	// errReplaySkipped: no replay was attempted (no endpoint, or backing off after
	// a failure).
	errReplaySkipped = errors.New("replay skipped")
	// ErrReplayTimeout: the engine's replay socket stopped answering.
	ErrReplayTimeout = errors.New("replay timed out")
)

// replayUntilEnd asks fetch to read up to the end marker.
const replayUntilEnd = math.MaxUint64

// replayer fetches buffered batches from engines' ROUTER replay sockets over a
// DEALER. It belongs to one stream goroutine: each request uses a fresh DEALER that
// only that goroutine touches, so replies of an abandoned request can never be
// mistaken for those of the next one.
//
// After a failure it backs off (doubling from backoffMin to backoffMax) and skips
// replays meanwhile: an engine whose replay socket is gone should not stall its
// stream for a full timeout on every gap.
type replayer struct {
	zctx         *zmq.Context
	timeout      time.Duration
	pollInterval time.Duration
	hardMaxFrame int64
	backoffMin   time.Duration
	backoffMax   time.Duration

	backoff   time.Duration
	notBefore time.Time
}

// fetch sends a replay request for every batch from `from` on to endpoint and calls
// each for every reply, in order, until the end marker, a reply whose seq is at
// least upTo (the caller has what it needs; the engine's later batches come live),
// or an error. It returns errReplaySkipped without asking when endpoint is empty or
// a previous failure's back-off is running, ErrReplayTimeout when no reply came for
// the timeout, each's error, or a socket error. A malformed reply is reported to bad
// and skipped: the tracker sees the seq it lacks.
func (r *replayer) fetch(ctx context.Context, endpoint string, from, upTo uint64, each func(wire.Frame) error, bad func(error)) error {
	if endpoint == "" || time.Now().Before(r.notBefore) {
		return errReplaySkipped
	}
	err := r.request(ctx, endpoint, from, upTo, each, bad)
	switch {
	case err == nil:
		r.backoff = 0
	case ctx.Err() == nil && !errors.Is(err, errStopReplay):
		r.backoff = min(max(2*r.backoff, r.backoffMin), r.backoffMax)
		r.notBefore = time.Now().Add(r.backoff)
	}
	return err
}

// errStopReplay is returned by a replay callback to end a replay without counting
// the engine as failing (the caller is shutting down).
var errStopReplay = errors.New("replay stopped by its consumer")

func (r *replayer) request(ctx context.Context, endpoint string, from, upTo uint64, each func(wire.Frame) error, bad func(error)) (err error) {
	sock, err := r.zctx.NewSocket(zmq.DEALER)
	if err != nil {
		return fmt.Errorf("replay socket: %w", err)
	}
	defer sock.Close()
	// A replay is bounded by the engine's buffer, and a ROUTER drops what exceeds
	// the peer's queue, so the DEALER must not cap its receive queue.
	for _, set := range []func() error{
		func() error { return sock.SetLinger(0) },
		func() error { return sock.SetRcvhwm(0) },
		func() error { return sock.SetMaxmsgsize(r.hardMaxFrame) },
	} {
		if err := set(); err != nil {
			return fmt.Errorf("replay socket option: %w", err)
		}
	}
	if err := sock.Connect(endpoint); err != nil {
		return fmt.Errorf("replay endpoint %s: %w", endpoint, err)
	}
	req := wire.ReplayRequest(from)
	if _, err := sock.SendMessage(req[0], req[1]); err != nil {
		return fmt.Errorf("replay request to %s: %w", endpoint, err)
	}
	poller := zmq.NewPoller()
	poller.Add(sock, zmq.POLLIN)
	deadline := time.Now().Add(r.timeout)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		wait := time.Until(deadline)
		if wait <= 0 {
			return fmt.Errorf("%w: %s sent nothing for %v", ErrReplayTimeout, endpoint, r.timeout)
		}
		polled, err := poller.Poll(min(wait, r.pollInterval))
		if err != nil {
			if retryable(err) {
				continue
			}
			return fmt.Errorf("replay poll: %w", err)
		}
		if len(polled) == 0 {
			continue
		}
		parts, err := sock.RecvMessageBytes(zmq.DONTWAIT)
		if err != nil {
			if retryable(err) {
				continue
			}
			return fmt.Errorf("replay receive: %w", err)
		}
		deadline = time.Now().Add(r.timeout)
		f, end, err := wire.ParseReplayReply(parts)
		if err != nil {
			bad(err)
			continue
		}
		if end {
			return nil
		}
		if err := each(f); err != nil {
			return err
		}
		if f.Seq >= upTo {
			return nil
		}
	}
}

// retryable reports ZMQ errors that only mean "try again".
func retryable(err error) bool {
	switch zmq.AsErrno(err) {
	case zmq.Errno(syscall.EAGAIN), zmq.Errno(syscall.EINTR):
		return true
	}
	return false
}
