package router

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// hopHeaders are not forwarded (RFC 9110 §7.6.1), nor Host and Content-Length,
// which the client recomputes.
var hopHeaders = []string{"Connection", "Keep-Alive", "Proxy-Connection", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade", "Host", "Content-Length"}

// HeaderDPRank pins a request to a data-parallel rank of a vLLM engine.
const HeaderDPRank = "X-Data-Parallel-Rank"

// maxErrorBody bounds what the router keeps of an upstream error answer.
const maxErrorBody = 1 << 20

// errAbortResponse: a non-streamed answer broke after bytes reached the client;
// the handler must abort the connection (panic(http.ErrAbortHandler)).
var errAbortResponse = errors.New("upstream answer broke mid-body")

// errClientWrite: the client did not take a chunk within --request-idle-timeout,
// or its connection broke. The engine did nothing wrong; the handler must abort
// the connection, which can carry nothing more.
var errClientWrite = errors.New("writing to the client failed")

// failure is an attempt that ended before any byte reached the client, so it may
// be retried elsewhere (unless it is an answer_timeout).
type failure struct {
	worker string
	// retry reason label: connect, status_5xx, status_429, first_byte_timeout; or
	// answer_timeout, which is never retried
	reason string
	// status, header and body of the upstream's answer, relayed when no retry is left;
	// status 0 when there was none.
	status int
	header http.Header
	body   []byte
	err    error
}

func (f *failure) Error() string { return f.err.Error() }

// outcome is what a failure tells the breaker.
func (f *failure) outcome() Outcome {
	if f.status == http.StatusTooManyRequests {
		return OutcomeNeutral
	}
	return OutcomeFailure
}

// retryable: another worker may take the request. A non-streamed answer that
// did not come within --request-idle-timeout is not run again: the engine may
// have been generating it all along, and the client has waited that long already.
func (f *failure) retryable() bool { return f.reason != "answer_timeout" }

// writeTo relays the failure to the client as the final answer.
func (f *failure) writeTo(w http.ResponseWriter) {
	if f.status == 0 {
		if f.reason == "first_byte_timeout" || f.reason == "answer_timeout" {
			writeError(w, fmt.Errorf("%w: %v", ErrUpstreamTimeout, f.err))
		} else {
			writeError(w, fmt.Errorf("%w: %v", ErrUpstream, f.err))
		}
		return
	}
	copyHeader(w.Header(), f.header)
	w.WriteHeader(f.status)
	w.Write(f.body)
}

func copyHeader(dst, src http.Header) {
	for k, vs := range src {
		dst[k] = append([]string(nil), vs...)
	}
	for _, h := range hopHeaders {
		dst.Del(h)
	}
}

// leg is one upstream request.
type leg struct {
	target Target
	worker *Worker
	path   string
	body   []byte
	header http.Header
	res    *Reservation
	// oneShot: the engine answers in one piece when the generation ends (the
	// client did not ask for a stream), so its first byte says nothing about
	// time to first token.
	oneShot bool
}

// start sends the leg and waits for its response headers and first body bytes:
// within --first-byte-timeout for a stream or a prefill leg (whose one-token
// answer comes when prefill ends, as a stream's first token does), within
// --request-idle-timeout for a oneShot leg (0: no bound). It returns the response
// with its first chunk (the caller owns resp.Body and must call stop), or a
// failure. stop ends the attempt's timers and context.
func (r *Router) start(ctx context.Context, l *leg) (resp *http.Response, first []byte, stop func(), fail *failure) {
	actx, cancel := context.WithCancelCause(ctx)
	wait, timeoutReason, flag := r.cfg.FirstByteTimeout, "first_byte_timeout", "--first-byte-timeout"
	if l.oneShot {
		wait, timeoutReason, flag = r.cfg.RequestIdleTimeout, "answer_timeout", "--request-idle-timeout"
	}
	var timedOut atomic.Bool
	stopTimer := func() bool { return false }
	if wait > 0 {
		timer := time.AfterFunc(wait, func() {
			timedOut.Store(true)
			cancel(fmt.Errorf("%w: no response within %s=%s", ErrUpstreamTimeout, flag, wait))
		})
		stopTimer = timer.Stop
	}
	stop = func() { stopTimer(); cancel(nil) }
	failed := func(reason string, err error) *failure {
		if timedOut.Load() {
			reason, err = timeoutReason, context.Cause(actx)
		}
		return &failure{reason: reason, err: fmt.Errorf("worker %s: %w", l.target.Worker, err)}
	}
	req, err := http.NewRequestWithContext(actx, http.MethodPost, l.worker.URL+l.path, bytes.NewReader(l.body))
	if err != nil {
		stop()
		return nil, nil, nil, failed("connect", err)
	}
	copyHeader(req.Header, l.header)
	req.Header.Set("Content-Type", "application/json")
	// The router picks the rank (and books its load there): a client's own
	// rank header is never forwarded.
	req.Header.Del(HeaderDPRank)
	if l.worker.Ranks > 1 {
		req.Header.Set(HeaderDPRank, strconv.FormatUint(uint64(l.target.Rank), 10))
	}
	resp, err = r.hc.Do(req)
	if err != nil {
		stop()
		return nil, nil, nil, failed("connect", err)
	}
	if resp.StatusCode >= 500 || resp.StatusCode == http.StatusTooManyRequests {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		resp.Body.Close()
		stop()
		f := failed("status_5xx", fmt.Errorf("answered %s", resp.Status))
		if resp.StatusCode == http.StatusTooManyRequests {
			f.reason = "status_429"
		}
		f.status, f.header, f.body = resp.StatusCode, resp.Header, body
		return nil, nil, nil, f
	}
	buf := make([]byte, 32<<10)
	n, err := readSome(resp.Body, buf)
	if err != nil && !errors.Is(err, io.EOF) {
		resp.Body.Close()
		stop()
		return nil, nil, nil, failed("connect", fmt.Errorf("response broke before its first byte: %w", err))
	}
	stopTimer()
	if timedOut.Load() { // the timer fired between the read and Stop
		resp.Body.Close()
		stop()
		return nil, nil, nil, failed(timeoutReason, context.Cause(actx))
	}
	return resp, buf[:n], stop, nil
}

// readSome reads until it has at least one byte or an error.
func readSome(rd io.Reader, buf []byte) (int, error) {
	for {
		n, err := rd.Read(buf)
		if n > 0 || err != nil {
			if n > 0 && errors.Is(err, io.EOF) {
				err = nil
			}
			return n, err
		}
	}
}

// relay writes the response to the client chunk by chunk, flushing each, with
// --request-idle-timeout between chunks, and as the longest a chunk waits for the
// client to take it. It returns nil when the upstream body ended cleanly, the
// client's context error when the client left, errClientWrite when the client
// stopped taking the answer, or the upstream failure (which it reports in-band
// for SSE).
func (r *Router) relay(client context.Context, w http.ResponseWriter, resp *http.Response, first []byte, cancelAttempt func()) error {
	defer resp.Body.Close()
	copyHeader(w.Header(), resp.Header)
	w.WriteHeader(resp.StatusCode)
	sse := strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")
	idleTimeout := r.cfg.RequestIdleTimeout
	rc := http.NewResponseController(w)
	// A client that stops reading without closing its connection would block a
	// write forever, and with it the request's load and goroutine: each write
	// gets the idle timeout, and so does the server's end of the response after
	// relay returns (net/http clears the deadline once the response is finished,
	// before a keep-alive connection's next request).
	deadline := func() {
		if idleTimeout > 0 {
			rc.SetWriteDeadline(time.Now().Add(idleTimeout))
		}
	}
	defer deadline()
	write := func(b []byte) error {
		deadline()
		if _, err := w.Write(b); err != nil {
			return fmt.Errorf("%w: %v", errClientWrite, err)
		}
		if err := rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
			return fmt.Errorf("%w: %v", errClientWrite, err)
		}
		return nil
	}
	if err := write(first); err != nil {
		return err
	}
	var idle atomic.Bool
	var timer *time.Timer
	if idleTimeout > 0 {
		timer = time.AfterFunc(idleTimeout, func() { idle.Store(true); cancelAttempt() })
		defer timer.Stop()
	}
	buf := first[:cap(first)]
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			// The upstream is not idle while the client takes the chunk: only
			// the write's deadline runs then.
			if timer != nil {
				timer.Stop()
			}
			if werr := write(buf[:n]); werr != nil {
				return werr
			}
			if timer != nil {
				timer.Reset(idleTimeout)
			}
		}
		if errors.Is(err, io.EOF) {
			// The engine's trailers (vLLM-style timing, the fake engine's X-Sim-*)
			// arrive after the body: pass them on.
			for k, vs := range resp.Trailer {
				w.Header()[http.TrailerPrefix+k] = vs
			}
			return nil
		}
		if err != nil {
			switch {
			case idle.Load():
				err = fmt.Errorf("%w: no data for --request-idle-timeout=%s", ErrUpstreamTimeout, r.cfg.RequestIdleTimeout)
			case client.Err() != nil:
				return client.Err() // the client left; its context cancelled the upstream
			}
			if sse {
				status, kind := statusOf(fmt.Errorf("%w: %v", ErrUpstream, err))
				if errors.Is(err, ErrUpstreamTimeout) {
					status, kind = http.StatusGatewayTimeout, "TimeoutError"
				}
				write([]byte("data: " + string(errorJSON(status, kind, err.Error())) + "\n\ndata: [DONE]\n\n"))
				return err
			}
			// A plain body cannot carry an error once started: the caller aborts
			// the connection (after releasing the request's load and recording
			// the failure) so the client sees a truncated response, not a short one.
			return fmt.Errorf("%w: %v", errAbortResponse, err)
		}
	}
}
