package server

import (
	"fmt"
	"sync/atomic"
	"time"
)

// A server stream whose client stops reading (without closing its connection,
// which keepalive would notice) blocks the handler in Send for ever, holding
// its slot (--max-watch-streams, the one dump) and what it buffers. Dump and
// Watch therefore send through a sendWatch: their sending loop runs on a
// goroutine of its own, and once one Send has been pending for longer than the
// write timeout (--http-write-timeout, else defaultSendStall) the handler
// returns ErrRequestTimeout; gRPC then cancels the stream, which unblocks the
// pending Send, and the slot is free. A stream with nothing to send (an idle
// Watch) is never ended this way.
//
// Concurrency: send is called by the sending goroutine only; the handler reads
// pending.

// defaultSendStall is how long one Send may wait when no write timeout is configured.
const defaultSendStall = 30 * time.Second

// sendWatch tracks the Send in progress, if any.
type sendWatch struct {
	pending atomic.Int64 // when the Send in progress started (unix ns); 0 when none
}

// send runs one Send.
func (w *sendWatch) send(f func() error) error {
	w.pending.Store(time.Now().UnixNano())
	defer w.pending.Store(0)
	return f()
}

// runSending runs loop on a goroutine of its own and returns its error, or
// ErrRequestTimeout as soon as one of its Sends has been pending for longer
// than stall (what names the stream in the error).
func runSending(stall time.Duration, what string, loop func(*sendWatch) error) error {
	w := &sendWatch{}
	done := make(chan error, 1)
	go func() { done <- loop(w) }()
	tick := time.NewTicker(max(stall/4, time.Millisecond)) // a 1 ns --http-write-timeout is valid
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			return err
		case <-tick.C:
			if start := w.pending.Load(); start != 0 {
				if waited := time.Since(time.Unix(0, start)); waited > stall {
					return fmt.Errorf("%w: the client read nothing of the %s for %s", ErrRequestTimeout, what, waited.Round(time.Millisecond))
				}
			}
		}
	}
}
