package ingest

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/kvindex/kvindex/internal/ingest/wire"
	"github.com/kvindex/kvindex/internal/workerspec"
)

// Bind mode. ServeBind owns the --zmq-bind socket for as long as it runs, on
// every member of a cluster, whether Run runs or not: engines behind one
// Kubernetes Service reach any member, and a member must not drop their
// connections each time leadership moves. While Run runs, the socket's frames
// go through a FrameInput into Run's streams; otherwise to a Forwarder (a
// follower sends them to the leader, whose FrameInput takes them the same way).

// ErrNotRunning: a FrameInput's Run is not running (or no longer).
var ErrNotRunning = errors.New("ingest: manager not running")

// Sources of bind-mode frames (kvindex_ingest_decode_errors_total{source}).
const (
	SourceBind      = "bind"      // this Manager's bind socket
	SourceForwarded = "forwarded" // another member's bind socket, forwarded here
)

// podPlaceholder is what BindReplayPattern's {pod} is.
const podPlaceholder = "{pod}"

// Forwarder takes the bind socket's frames while no Run runs on the Manager.
// Forward is called on the socket's goroutine and must not block: what it
// cannot take, it drops (and counts); the stream's next frame then shows the
// gap, and whichever member leads replays it.
type Forwarder interface {
	Forward(f wire.Frame)
}

// ServeBind binds ManagerConfig.ZMQBind (BindEndpoint is its actual endpoint
// meanwhile) and receives what engines publish to it until ctx ends: while Run
// runs, into Run's streams (kvindex_ingest_bind_frames_total{route="ingested"}),
// otherwise to fwd ({route="forwarded"}), or nowhere when fwd is nil
// ({route="dropped"}). It fails at once when the socket cannot be bound, when
// another ServeBind runs (ErrRunning) or the Manager is closed (ErrClosed).
func (m *Manager) ServeBind(ctx context.Context, fwd Forwarder) error {
	if m.cfg.ZMQBind == "" {
		return invalidConfig("ServeBind needs --zmq-bind")
	}
	m.mu.Lock()
	switch {
	case m.closed:
		m.mu.Unlock()
		return ErrClosed
	case m.binding:
		m.mu.Unlock()
		return ErrRunning
	}
	m.binding = true
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		m.binding, m.bindAddr = false, ""
		m.mu.Unlock()
	}()
	sock, addr, err := m.zs.bindSocket(m.cfg.ZMQBind)
	if err != nil {
		return err
	}
	m.mu.Lock()
	m.bindAddr = addr
	m.mu.Unlock()
	m.log.Info("accepting engines on the bind socket", "endpoint", addr)
	var in *FrameInput // into the Run running now; nil when none was
	m.zs.receive(ctx, sock, SourceBind, func(parts [][]byte) bool {
		f, err := wire.ParseFrame(parts)
		if err != nil {
			m.metrics.decodeErrors.WithLabelValues(SourceBind, "bad_frame").Inc()
			m.badLog.Warn("bind/bad_frame", "dropping malformed frame", "err", err)
			return true
		}
		if in == nil || in.r.ctx.Err() != nil {
			in, _ = m.NewFrameInput(SourceBind)
		}
		if in != nil {
			if in.Deliver(f) == nil {
				m.metrics.bindFrames.WithLabelValues("ingested").Inc()
				return true
			}
			in = nil // Run ended before it took the frame: it goes on below
		}
		if fwd == nil {
			m.metrics.bindFrames.WithLabelValues("dropped").Inc()
			return true
		}
		m.metrics.bindFrames.WithLabelValues("forwarded").Inc()
		fwd.Forward(f)
		return true
	})
	return nil
}

// FrameInput hands bind-mode frames to the Run running when it was made, the
// way the bind socket does: the worker from the topic (a registered worker's
// exact Topic, else llm-d's kv@<pod>@<model>, discovered when new), the dp rank
// from the batch, then the stream's sequence tracking and replay. Bad input is
// counted under its source and dropped. A cluster leader makes one for each
// stream of frames a follower forwards. It belongs to one goroutine.
type FrameInput struct {
	r      *run
	d      *dispatcher
	dec    *wire.Decoder
	source string
}

// NewFrameInput returns an input into the Run running now (ErrNotRunning when
// none is); source labels its bad input (SourceBind, SourceForwarded).
func (m *Manager) NewFrameInput(source string) (*FrameInput, error) {
	m.mu.Lock()
	r := m.run
	ready := r != nil && r.ready
	m.mu.Unlock()
	if !ready || r.ctx.Err() != nil {
		return nil, ErrNotRunning
	}
	d := r.newDispatcher(source)
	d.patternReplay = true
	return &FrameInput{r: r, d: d, dec: wire.NewDecoder(m.cfg.MaxFrameBytes), source: source}, nil
}

// Done is closed when the Run the input was made for has ended.
func (in *FrameInput) Done() <-chan struct{} { return in.r.ctx.Done() }

// Deliver hands f to its stream, waiting while the stream's queue is full. It
// returns ErrNotRunning, without having taken f, once the Run has ended, and
// nil otherwise (bad input included: counted and dropped).
func (in *FrameInput) Deliver(f wire.Frame) error {
	m := in.r.m
	if in.r.ctx.Err() != nil {
		return ErrNotRunning
	}
	worker, model, ok := m.topicWorker(f.Topic)
	if !ok {
		m.metrics.decodeErrors.WithLabelValues(in.source, "bad_topic").Inc()
		m.badLog.Warn(in.source+"/bad_topic", "dropping frame whose topic names no worker (want kv@<pod>@<model>)", "topic", truncate(f.Topic, 128))
		return nil
	}
	batch, st, err := in.dec.Decode(f.Payload)
	countDecode(in.r.env, in.source, st, err)
	if err != nil {
		// Without a decoded batch the dp rank is unknown; the stream sees a gap.
		return nil
	}
	var rank uint32
	if batch.HasDPRank {
		rank = batch.DPRank
	}
	if rank >= workerspec.MaxDPSize {
		m.metrics.decodeErrors.WithLabelValues(in.source, "bad_rank").Inc()
		m.badLog.Warn(in.source+"/bad_rank", "dropping batch with an impossible dp rank", "worker", worker, "dp_rank", rank)
		return nil
	}
	if !in.d.deliver(worker, model, rank, item{seq: f.Seq, batch: batch}) {
		return ErrNotRunning
	}
	return nil
}

// topicWorker names the worker of a bind-mode topic: a registered worker whose
// Topic is exactly this one, else llm-d's kv@<pod>@<model> (the model then comes
// from the registry when the pod is registered).
func (m *Manager) topicWorker(topic string) (worker, model string, ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if id, declared := m.byTopic[topic]; declared {
		if e := m.workers[id]; e != nil && e.spec.Topic == topic {
			return id, e.spec.Model, true
		}
	}
	worker, model, err := wire.ParseTopic(topic)
	if err != nil {
		return "", "", false
	}
	if e, known := m.workers[worker]; known {
		model = e.spec.Model
	}
	return worker, model, true
}

// patternReplay is the replay endpoint BindReplayPattern gives a worker
// discovered in bind mode: "" without a pattern, or when the endpoint matches
// no --discover-replay-allow pattern or is no endpoint (counted under source as
// replay_not_allowed and logged; the worker is followed without replay).
func (m *Manager) patternReplay(source, worker string) string {
	if m.cfg.BindReplayPattern == "" {
		return ""
	}
	ep := strings.ReplaceAll(m.cfg.BindReplayPattern, podPlaceholder, worker)
	if err := (workerspec.Spec{ID: worker, Model: "m", Replay: ep}).Validate(); err != nil || !matchAny(m.cfg.ReplayAllow, ep) {
		m.metrics.decodeErrors.WithLabelValues(source, "replay_not_allowed").Inc()
		m.badLog.Warn(source+"/replay_not_allowed", "a discovered worker's --bind-replay-pattern endpoint is not a tcp:// endpoint or matches no --discover-replay-allow pattern; following it without replay",
			"worker", worker, "replay", ep)
		return ""
	}
	return ep
}

// validReplayPattern checks --bind-replay-pattern ("" is valid: none).
func validReplayPattern(p string) error {
	if p == "" {
		return nil
	}
	if !strings.HasPrefix(p, "tcp://") || !strings.Contains(p, podPlaceholder) {
		return fmt.Errorf("must be a tcp:// endpoint with %s in it (tcp://%s.engines.ns.svc:5558)", podPlaceholder, podPlaceholder)
	}
	sample := strings.ReplaceAll(p, podPlaceholder, "pod-0")
	if _, err := workerspec.OffsetEndpoint(sample, 0); err != nil {
		return fmt.Errorf("is no endpoint with {pod} = pod-0 (%s): %v", sample, err)
	}
	return nil
}
