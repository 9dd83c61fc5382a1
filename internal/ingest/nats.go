package ingest

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/kvindex/kvindex/internal/ingest/wire"
	"github.com/kvindex/kvindex/internal/workerspec"
	"github.com/nats-io/nats.go"
)

// NATS message convention, shared by the relay (publisher) and the Manager
// (subscriber):
//
//   - Subject: <prefix>.<worker>.<dp_rank>, e.g. kv.events.pod-7.0. The worker id
//     must be a single subject token (no '.', '*', '>' or whitespace).
//   - Payload: the engine's msgpack EventBatch, verbatim.
//   - Headers: Kv-Seq (required): the engine's sequence number, decimal. Optional:
//     Kv-Topic (the engine's ZMQ topic), Kv-Model (the served model; else taken
//     from a kv@<pod>@<model> Kv-Topic), Kv-Replay (the ZMQ replay endpoint of
//     this rank, used to fill gaps when the worker's spec names none).
const (
	HeaderSeq    = "Kv-Seq"
	HeaderTopic  = "Kv-Topic"
	HeaderModel  = "Kv-Model"
	HeaderReplay = "Kv-Replay"
)

// natsPending bounds what the subscription buffers before NATS drops messages as a
// slow consumer (the gaps are then replayed).
const (
	natsPendingMsgs  = 1 << 18
	natsPendingBytes = 256 << 20
)

// validSubjectPrefix checks a subject prefix: dot-separated non-empty tokens
// without wildcards or whitespace.
func validSubjectPrefix(p string) error {
	if p == "" {
		return errors.New("empty")
	}
	for _, tok := range strings.Split(p, ".") {
		if err := validSubjectToken(tok); err != nil {
			return err
		}
	}
	return nil
}

// validSubjectToken checks one subject token (a worker id in a subject).
func validSubjectToken(tok string) error {
	if tok == "" {
		return errors.New("empty subject token")
	}
	if i := strings.IndexAny(tok, ".*> \t\r\n"); i >= 0 {
		return fmt.Errorf("%q contains %q, not allowed in a NATS subject token", tok, tok[i])
	}
	return nil
}

// Subject is the NATS subject of a stream's batches.
func Subject(prefix, worker string, rank uint32) string {
	return prefix + "." + worker + "." + strconv.FormatUint(uint64(rank), 10)
}

// parseSubject splits <prefix>.<worker>.<rank>.
func parseSubject(prefix, subject string) (worker string, rank uint32, err error) {
	rest, ok := strings.CutPrefix(subject, prefix+".")
	if !ok {
		return "", 0, fmt.Errorf("subject %q is not under %q", subject, prefix)
	}
	worker, rankStr, ok := strings.Cut(rest, ".")
	if !ok || worker == "" {
		return "", 0, fmt.Errorf("subject %q: want %s.<worker>.<dp_rank>", subject, prefix)
	}
	r, err := strconv.ParseUint(rankStr, 10, 32)
	if err != nil || r >= workerspec.MaxDPSize {
		return "", 0, fmt.Errorf("subject %q: dp rank %q is not a number below %d", subject, rankStr, workerspec.MaxDPSize)
	}
	return worker, uint32(r), nil
}

// header returns a header value, matching the key case-insensitively when the exact
// spelling is absent (NATS headers are case-sensitive; publishers vary).
func header(h nats.Header, key string) string {
	if v := h.Get(key); v != "" {
		return v
	}
	for k, v := range h {
		if strings.EqualFold(k, key) && len(v) > 0 {
			return v[0]
		}
	}
	return ""
}

// natsSub is the Manager's subscription and its connection.
type natsSub struct {
	nc  *nats.Conn
	sub *nats.Subscription
}

func (r *run) subscribeNATS() (*natsSub, error) {
	m := r.m
	nc, err := nats.Connect(m.cfg.NATSURL,
		nats.Name("kvindex-indexer"),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(500*time.Millisecond),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			if errors.Is(err, nats.ErrSlowConsumer) {
				m.metrics.decodeErrors.WithLabelValues("nats", "slow_consumer").Inc()
			}
			m.badLog.Warn("nats/async", "nats error; dropped batches are replayed", "err", err)
		}))
	if err != nil {
		return nil, fmt.Errorf("--nats-url %s: %w", m.cfg.NATSURL, err)
	}
	subject := m.cfg.NATSSubjectPrefix + ".*.*"
	sub, err := nc.SubscribeSync(subject)
	if err == nil {
		err = sub.SetPendingLimits(natsPendingMsgs, natsPendingBytes)
	}
	if err == nil {
		// The subscription is live once the server has it; a publish racing the
		// subscription would be missed silently otherwise.
		err = nc.Flush()
	}
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("nats subscribe %s: %w", subject, err)
	}
	m.log.Info("subscribed to NATS", "url", m.cfg.NATSURL, "subject", subject)
	return &natsSub{nc: nc, sub: sub}, nil
}

// natsLoop receives relayed batches until the run ends, then closes the connection.
func (r *run) natsLoop(s *natsSub) {
	m := r.m
	defer s.nc.Close()
	d := r.newDispatcher("nats")
	dec := wire.NewDecoder(m.cfg.MaxFrameBytes)
	for {
		msg, err := s.sub.NextMsgWithContext(r.ctx)
		if err != nil {
			if r.ctx.Err() != nil {
				return
			}
			m.badLog.Warn("nats/next", "nats receive failed", "err", err)
			if errors.Is(err, nats.ErrConnectionClosed) || errors.Is(err, nats.ErrBadSubscription) {
				r.fail(fmt.Errorf("nats subscription ended: %w", err))
				return
			}
			continue
		}
		worker, rank, err := parseSubject(m.cfg.NATSSubjectPrefix, msg.Subject)
		if err != nil {
			m.metrics.decodeErrors.WithLabelValues("nats", "bad_subject").Inc()
			m.badLog.Warn("nats/bad_subject", "dropping message", "err", err)
			continue
		}
		seq, err := strconv.ParseUint(header(msg.Header, HeaderSeq), 10, 64)
		if err == nil && seq == wire.EndOfReplaySeq {
			err = errors.New("the replay end marker's seq") // as wire.ParseFrame refuses it
		}
		if err != nil {
			m.metrics.decodeErrors.WithLabelValues("nats", "bad_seq").Inc()
			m.badLog.Warn("nats/bad_seq", "dropping message without a valid "+HeaderSeq+" header", "subject", msg.Subject)
			continue
		}
		batch, st, err := dec.Decode(msg.Data)
		countDecode(r.env, "nats", st, err)
		model := header(msg.Header, HeaderModel)
		if model == "" {
			if _, fromTopic, err := wire.ParseTopic(header(msg.Header, HeaderTopic)); err == nil {
				model = fromTopic
			}
		}
		it := item{seq: seq, batch: batch, err: err, replay: header(msg.Header, HeaderReplay)}
		if it.replay != "" && (!strings.HasPrefix(it.replay, "tcp://") || !matchAny(m.cfg.ReplayAllow, it.replay)) {
			m.metrics.decodeErrors.WithLabelValues("nats", "replay_not_allowed").Inc()
			m.badLog.Warn("nats/replay_not_allowed", "ignoring a "+HeaderReplay+" endpoint that is not tcp:// or matches no --discover-replay-allow pattern",
				"worker", worker, "replay", it.replay)
			it.replay = ""
		}
		if !d.deliver(worker, model, rank, it) {
			return
		}
	}
}
