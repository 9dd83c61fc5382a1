package router

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync"
	"time"
)

// Request results (the result label of kvindex_router_requests_total).
const (
	resultOK            = "ok"
	resultUpstreamError = "upstream_error"
	resultClientError   = "client_error"
	resultCanceled      = "canceled"
	resultRejected      = "rejected"
	resultNoWorker      = "no_worker"
)

// Response headers naming where a request went (debugging aids, not routing input).
const (
	HeaderServedBy  = "X-Kvindex-Worker"
	HeaderPrefillBy = "X-Kvindex-Prefill-Worker"
)

// handleGenerate serves /v1/completions, /v1/chat/completions and other /v1/*
// POSTs: read, prepare, then serve.
func (r *Router) handleGenerate(ep endpoint) http.HandlerFunc {
	return func(w http.ResponseWriter, req *http.Request) {
		arrival := r.now()
		body, err := r.readBody(w, req)
		if err != nil {
			r.fail(w, err, resultClientError)
			return
		}
		p, err := r.prepare(req.Header, req.URL.Path, ep, body)
		if err != nil {
			r.fail(w, err, resultClientError)
			return
		}
		r.serve(req.Context(), w, p, arrival)
	}
}

// readBody reads a request body of at most --max-body-bytes within
// --body-read-timeout: a client that sends its headers and then trickles its
// body, or stops, would otherwise hold a goroutine, a connection and up to
// --max-body-bytes of buffer for as long as it kept the connection.
func (r *Router) readBody(w http.ResponseWriter, req *http.Request) ([]byte, error) {
	rc := http.NewResponseController(w)
	// A writer without deadlines (a test's recorder) reads without one.
	_ = rc.SetReadDeadline(time.Now().Add(r.cfg.BodyReadTimeout))
	body, err := io.ReadAll(http.MaxBytesReader(w, req.Body, r.cfg.MaxBodyBytes))
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			return nil, fmt.Errorf("%w: more than --max-body-bytes=%d", ErrTooLarge, r.cfg.MaxBodyBytes)
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			// The deadline stays: the rest of the body is not waited for, and
			// the connection closes after the answer.
			w.Header().Set("Connection", "close")
			return nil, fmt.Errorf("%w: not received within --body-read-timeout=%s", ErrBodyTimeout, r.cfg.BodyReadTimeout)
		}
		return nil, fmt.Errorf("%w: reading the body: %v", ErrBadRequest, err)
	}
	_ = rc.SetReadDeadline(time.Time{})
	return body, nil
}

// fail answers err and counts the request.
func (r *Router) fail(w http.ResponseWriter, err error, result string) {
	writeError(w, err)
	r.metrics.requests.WithLabelValues(r.policy.Name(), result, "").Inc()
}

// serve routes and dispatches a prepared request, retrying on another worker while
// no byte has reached the client.
func (r *Router) serve(ctx context.Context, w http.ResponseWriter, p *prepared, arrival time.Time) {
	tried := map[string]bool{}
	var last *failure
	var sent sync.Once
	markSent := func() { sent.Do(func() { r.metrics.overhead.Observe(r.now().Sub(arrival).Seconds()) }) }
	for attempt := 0; attempt <= r.cfg.RequestMaxRetries; attempt++ {
		d, err := r.admit(ctx, p, tried)
		switch {
		case err == nil:
		case ctx.Err() != nil:
			r.metrics.requests.WithLabelValues(r.policy.Name(), resultCanceled, "").Inc()
			return
		case last != nil && errors.Is(err, ErrNoWorkers):
			// Nobody left to retry on: the last failure is the answer.
			last.writeTo(w)
			r.metrics.requests.WithLabelValues(r.policy.Name(), resultUpstreamError, last.worker).Inc()
			return
		case errors.Is(err, ErrQueueFull):
			r.metrics.rejected.WithLabelValues("queue_full").Inc()
			r.fail(w, err, resultRejected)
			return
		case errors.Is(err, ErrQueueTimeout):
			r.metrics.rejected.WithLabelValues("queue_timeout").Inc()
			r.fail(w, err, resultRejected)
			return
		case errors.Is(err, ErrNoWorkers):
			r.fail(w, err, resultNoWorker)
			return
		default:
			r.fail(w, err, resultClientError)
			return
		}
		if last != nil { // counted once another worker took it, not when nobody could
			r.metrics.retries.WithLabelValues(last.reason).Inc()
			r.log.Debug("retrying on another worker", "failed", last.worker, "reason", last.reason, "err", last.err, "worker", d.Target.Worker)
		}
		r.record(d, p, attempt == 0)
		fail := r.dispatch(ctx, w, p, d, markSent)
		d.release()
		if fail == nil {
			return
		}
		last = fail
		tried[fail.worker] = true
		if !fail.retryable() {
			break
		}
	}
	last.writeTo(w)
	r.metrics.requests.WithLabelValues(r.policy.Name(), resultUpstreamError, last.worker).Inc()
}

// record counts and logs a decision.
func (r *Router) record(d *Decision, p *prepared, first bool) {
	r.metrics.decisions.WithLabelValues(d.Policy, string(d.Source)).Inc()
	r.ui.recent.add(d, p, r.now())
	if first {
		r.metrics.hitAvailable.Add(float64(d.Available))
		r.metrics.hitCaptured.Add(float64(d.Captured))
	}
	if r.log.Enabled(context.Background(), -4) { // slog.LevelDebug
		r.log.Debug("RouteDecision", "decision", decisionLog{d, p})
	}
}

// dispatch runs the decision's legs and relays the answer. It returns a failure
// only when nothing reached the client, so the request may be retried elsewhere.
func (r *Router) dispatch(ctx context.Context, w http.ResponseWriter, p *prepared, d *Decision, markSent func()) *failure {
	body := p.body
	prefilledBy := ""
	if d.Prefill != nil {
		markSent()
		if kv, by, ok := r.prefillLeg(ctx, p, d); ok {
			prefilledBy = by
			b, err := withKVTransfer(p.body, kv)
			if err == nil {
				body = b
			}
		} else if ctx.Err() == nil {
			r.metrics.pdLocalPrefill.WithLabelValues("prefill_failed").Inc()
			r.log.Warn("prefill failed on every tried worker; the decode worker prefills locally", "decode", d.Target.Worker)
		}
	} else if d.LocalPrefill {
		r.metrics.pdLocalPrefill.WithLabelValues("below_threshold").Inc()
	}
	if ctx.Err() != nil {
		r.breakers.Record(d.Target.Worker, OutcomeNeutral, d.probe)
		r.metrics.requests.WithLabelValues(d.Policy, resultCanceled, d.Target.Worker).Inc()
		return nil
	}
	worker := d.candidate(d.Target).Worker
	if worker == nil {
		worker = r.fleet.View().byID[d.Target.Worker]
	}
	l := &leg{target: d.Target, worker: worker, path: p.path, body: body, header: p.header, res: d.res, oneShot: !p.stream}
	probe := d.probe
	markSent()
	resp, first, stop, fail := r.start(ctx, l)
	if fail != nil {
		if ctx.Err() != nil {
			r.breakers.Record(worker.ID, OutcomeNeutral, probe)
			r.metrics.requests.WithLabelValues(d.Policy, resultCanceled, worker.ID).Inc()
			return nil
		}
		r.breakers.Record(worker.ID, fail.outcome(), probe)
		fail.worker = worker.ID
		return fail
	}
	defer stop()
	d.res.FirstByte()
	if probe {
		// The worker answered: a half-open breaker closes now, not when a long
		// stream ends (which would keep a healthy worker excluded meanwhile). A
		// failure later in this stream counts like any other.
		r.breakers.Record(worker.ID, OutcomeSuccess, true)
		probe = false
	}
	w.Header().Set(HeaderServedBy, worker.ID)
	if prefilledBy != "" {
		w.Header().Set(HeaderPrefillBy, prefilledBy)
	}
	err := r.relay(ctx, w, resp, first, stop)
	result, outcome := resultOK, OutcomeSuccess
	switch {
	case err == nil && resp.StatusCode >= 400:
		result = resultClientError
	case err != nil && ctx.Err() != nil:
		result, outcome = resultCanceled, OutcomeNeutral
	case errors.Is(err, errClientWrite):
		// The client stopped taking the answer: the engine did nothing wrong.
		result, outcome = resultCanceled, OutcomeNeutral
		r.log.Debug("the client took no chunk for --request-idle-timeout (or its connection broke); connection closed", "worker", worker.ID, "err", err)
	case err != nil:
		result, outcome = resultUpstreamError, OutcomeFailure
		r.log.Warn("stream failed after the first byte; ended with an error event, not retried", "worker", worker.ID, "err", err)
	}
	r.breakers.Record(worker.ID, outcome, probe)
	r.metrics.requests.WithLabelValues(d.Policy, result, worker.ID).Inc()
	if errors.Is(err, errAbortResponse) || errors.Is(err, errClientWrite) {
		d.release() // the panic skips the caller's release
		panic(http.ErrAbortHandler)
	}
	return nil
}
