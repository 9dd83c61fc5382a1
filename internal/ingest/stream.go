package ingest

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/kvindex/kvindex/internal/ingest/wire"
	"github.com/kvindex/kvindex/internal/workerspec"
)

// item is one live batch handed from the goroutine that owns a socket (and decoded
// it) to the goroutine of its stream.
type item struct {
	seq   uint64
	batch wire.EventBatch
	// err: the payload did not decode; the batch is lost (Tracker.Discard).
	err error
	// replay is a replay endpoint announced with the batch (NATS Kv-Replay), used
	// when the worker's spec names none.
	replay string
}

// Stream states, as GET /workers shows them.
const (
	StateConnecting = "connecting" // no batch handed to the index yet
	StateLive       = "live"
	StateReplaying  = "replaying"
)

// StreamStatus is what a stream looks like from outside, for status pages.
type StreamStatus struct {
	DPRank uint32
	State  string
	// LastSeq and Epoch are the position of the last batch handed to the sink
	// (meaningful when State is not StateConnecting).
	LastSeq uint64
	Epoch   uint64
	// LagSeconds is the age of the last batch (engine timestamp) when it was handed off.
	LagSeconds float64
	LastBatch  time.Time
	Stats      TrackerStats
}

// streamEnv is what every stream of a run shares.
type streamEnv struct {
	sink          Sink
	cursors       CursorSource
	metrics       *metrics
	log           *slog.Logger
	badLog        *rateLimitedLog
	maxFrame      int
	restartWindow uint64
	idleReplay    time.Duration
	newReplayer   func() *replayer
}

// streamRunner drives one stream (worker, dp rank): it owns the stream's Tracker,
// applies each live batch in order through the sink, and fills gaps from the
// engine's replay socket. Everything but status belongs to its goroutine (run).
type streamRunner struct {
	key      Stream
	in       chan item
	done     chan struct{}
	replayEP string // rank's replay endpoint from the spec; "" when none is configured

	env     *streamEnv
	tr      *Tracker
	ops     *opBuilder
	dec     *wire.Decoder
	rp      *replayer
	sm      *streamMetrics
	log     *slog.Logger
	started bool // a batch has been applied (or the stream resumed from a cursor)
	// appliedTS is the latest engine timestamp of a batch applied here (0:
	// none yet); see handle for the late copies it tells from restarts.
	appliedTS float64
	// discarded: the tracker was told of a lost batch, so its next reset is
	// reported as "undecodable".
	discarded bool
	// fence is the index's fence of this stream that the runner last acted on
	// (checkFence); fresh: the stream starts afresh after it, so its next reset
	// is reported as "dead".
	fence uint64
	fresh bool
	// inherited: the runner took over a stopped runner's position (inherit).
	inherited bool

	mu     sync.Mutex
	status StreamStatus // guarded by mu
}

// streamQueue is the number of decoded batches a stream buffers from its socket; a
// stream that is replaying lets live batches wait here.
const streamQueue = 256

func newStreamRunner(key Stream, spec workerspec.Spec, defaultBlockSize int, env *streamEnv) (*streamRunner, error) {
	replayEP, err := spec.ReplayEndpoint(key.DPRank)
	if err != nil {
		return nil, err
	}
	blockSize := spec.BlockSize
	if blockSize == 0 {
		blockSize = defaultBlockSize
	}
	return &streamRunner{
		key:      key,
		in:       make(chan item, streamQueue),
		done:     make(chan struct{}),
		replayEP: replayEP,
		env:      env,
		tr:       NewTracker(env.restartWindow),
		ops:      newOpBuilder(spec.Model, blockSize),
		dec:      wire.NewDecoder(env.maxFrame),
		rp:       env.newReplayer(),
		sm:       env.metrics.forStream(key),
		log:      env.log.With("worker", key.Worker, "dp_rank", key.DPRank),
		status:   StreamStatus{DPRank: key.DPRank, State: StateConnecting},
	}, nil
}

// streamPosition is where a stopped stream runner left its stream: its
// Tracker and what the runner knew beside it (see streamRunner).
type streamPosition struct {
	tr        *Tracker
	started   bool
	appliedTS float64
	discarded bool
	fence     uint64
	fresh     bool
	replayEP  string
	status    StreamStatus
}

// position is where the runner leaves its stream; call it once its
// goroutine has ended (run returned), and drop the runner.
func (s *streamRunner) position() streamPosition {
	return streamPosition{tr: s.tr, started: s.started, appliedTS: s.appliedTS, discarded: s.discarded,
		fence: s.fence, fresh: s.fresh, replayEP: s.replayEP, status: s.Status()}
}

// inherit takes over the position a stopped runner of the same stream left
// (its worker's spec changed), before run starts. The index's cursor would
// lag it: what the old runner submitted may not be applied yet (a queue, a
// Raft proposal in flight), and a runner resuming from there would continue
// an epoch that a queued Reset of the old one's ends (the index then drops
// all it sends) or take its next batch for the stream's start (a batch lost
// with the old runner's queue is then never seen missing). The old runner's
// queue and held batch are lost: the next batch shows the hole as a gap, and
// the catch-up replays it.
func (s *streamRunner) inherit(p streamPosition) {
	s.tr = p.tr
	s.tr.dropHeld()
	s.started, s.appliedTS, s.discarded = p.started, p.appliedTS, p.discarded
	s.fence, s.fresh = p.fence, p.fresh
	if s.replayEP == "" {
		s.replayEP = p.replayEP // announced by NATS (Kv-Replay)
	}
	s.inherited = true
	s.status = p.status
	s.status.State = StateLive
	if !s.started {
		s.status.State = StateConnecting
	}
}

// Status returns a snapshot of the stream's state.
func (s *streamRunner) Status() StreamStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.status
}

func (s *streamRunner) setState(state string) {
	s.mu.Lock()
	s.status.State = state
	s.mu.Unlock()
}

// run processes the stream's batches until ctx ends or the sink fails; a sink error
// other than ctx's is returned.
func (s *streamRunner) run(ctx context.Context) error {
	defer close(s.done)
	if s.inherited {
		s.checkFence()
	} else if c, ok := s.env.cursors.Cursor(s.key); ok && c.Fence == 0 {
		s.tr.Resume(c)
		s.started = true
		s.mu.Lock()
		s.status.LastSeq, s.status.Epoch = c.Seq, c.Epoch
		s.mu.Unlock()
	} else if ok {
		s.checkFence()
	}
	if s.replayEP != "" {
		if err := s.catchUp(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
	}
	// An idle stream with a replay endpoint asks for what it may have missed:
	// engines send no heartbeat, so a lost last batch (or a whole burst lost to
	// the slow-joiner window) would otherwise stay unseen until the next batch.
	var idleTimer *time.Timer
	var idle <-chan time.Time
	if s.env.idleReplay > 0 {
		idleTimer = time.NewTimer(s.env.idleReplay)
		defer idleTimer.Stop()
		idle = idleTimer.C
	}
	for {
		var err error
		select {
		case <-ctx.Done():
			return nil
		case it := <-s.in:
			err = s.handle(ctx, &it)
		case <-idle:
			s.checkFence()
			if s.replayEP != "" {
				err = s.catchUp(ctx)
			}
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		if idleTimer != nil {
			idleTimer.Reset(s.env.idleReplay)
		}
	}
}

// catchUp replays, when the stream starts, what the engine published after the
// cursor (or its whole buffer for a stream the index does not know): an engine
// that went idle must not wait for its next batch to be indexed, and a new Raft
// leader must not wait for traffic to fill what the old one missed.
func (s *streamRunner) catchUp(ctx context.Context) error {
	from := uint64(0)
	if c, ok := s.tr.Cursor(); ok {
		from = c.Seq + 1
	}
	return s.replay(ctx, replayCatchUp, from, replayUntilEnd)
}

// checkFence starts the stream afresh when the index fenced it since the
// runner last looked (its worker was declared dead, or unregistered, and its
// blocks dropped; Applier.FenceWorker): whatever the engine sends next is the
// first batch of a new stream (Tracker.Fresh), caught up from the engine's
// replay buffer like a stream the index does not know, and no gap is counted. A batch sent in
// between is dropped by the fence, never applied on top of the dropped blocks.
func (s *streamRunner) checkFence() {
	f := s.env.cursors.Fence(s.key)
	if f == 0 || f == s.fence {
		return
	}
	c, _ := s.env.cursors.Cursor(s.key)
	s.fence = c.Fence
	s.tr.Fresh(c.Epoch)
	s.started, s.fresh = false, true
	s.setState(StateConnecting)
	s.updateStats()
	s.log.Info("the worker's blocks were dropped (declared dead, or unregistered): its stream starts afresh", "fence", c.Fence)
}

// handle applies one live batch per the Tracker's rules (see doc.go).
func (s *streamRunner) handle(ctx context.Context, it *item) error {
	s.checkFence()
	if s.replayEP == "" && it.replay != "" {
		s.replayEP = it.replay
	}
	restarted := false
	if c, ok := s.tr.Cursor(); ok && s.appliedTS > 0 && it.seq <= c.Seq {
		if it.err != nil || it.batch.TS <= s.appliedTS {
			// A late copy of a batch applied already: a replay (catch-up, gap)
			// brought it meanwhile, or it came another way (bind mode in a
			// cluster: a member's own socket and a forwarding member's queue,
			// an engine reconnected to another member). The Tracker would take
			// a live seq that goes back for an engine restart.
			s.sm.duplicate.Inc()
			return nil
		}
		// Stamped later than every batch applied, yet at or below the cursor:
		// no copy does that (a copy carries its batch's stamp), a restarted
		// engine does. The Tracker's own rule (the seq went back below the
		// highest live seq) misses it when replays took the cursor past
		// the live batches seen.
		restarted = true
	}
	if !s.started && it.seq > 0 {
		// The first batch of a stream we know nothing about: what the engine
		// published before it (lost to ZMQ's slow-joiner window, or before we
		// existed) may still be in its replay buffer.
		if err := s.replay(ctx, replayCatchUp, 0, it.seq-1); err != nil {
			return err
		}
		if c, ok := s.tr.Cursor(); ok && c.Seq >= it.seq {
			// The replay brought this batch too (an engine that counts from 1
			// has no seq 0, so the first reply was this one): it is applied.
			s.sm.duplicate.Inc()
			s.updateStats()
			return nil
		}
	}
	observe := s.tr.Observe
	if restarted {
		observe = s.tr.ObserveRestart
	}
	d := observe(it.seq)
	switch {
	case d.Action == ActionRefuse:
		s.refuseSeq(it.seq, "live")
		return nil
	case d.Action.Applies():
		return s.submit(ctx, it, d.Action, "")
	case d.Action == ActionDuplicate:
		s.sm.duplicate.Inc()
		s.updateStats()
		return nil
	case d.Action == ActionGap:
		reason := replayGap
		if d.Restart {
			reason = replayRestart // not a gap: the engine may have no seq 0
		} else {
			s.sm.gaps.Inc()
		}
		if err := s.replay(ctx, reason, d.From, d.To); err != nil {
			return err
		}
		a := s.tr.FinishReplay()
		switch {
		case a.Applies():
			return s.submit(ctx, it, a, reason)
		case a == ActionDuplicate:
			s.sm.duplicate.Inc()
		}
		s.updateStats()
	}
	return nil
}

// Replay reasons (kvindex_ingest_replays_total{reason}).
const (
	replayGap     = "gap"
	replayCatchUp = "catch_up"
	// replayRestart asks a restarted engine whose first live batch is seq 1 for
	// seq 0 (Decision.Restart).
	replayRestart = "restart"
)

// replay fetches seqs from..upTo from the engine and applies what the Tracker
// accepts of them. A replay that fails or is skipped is not an error: the Tracker
// decides what its absence means (FinishReplay). Only a sink error is returned.
func (s *streamRunner) replay(ctx context.Context, reason string, from, upTo uint64) error {
	s.setState(StateReplaying)
	var sinkErr error
	err := s.rp.fetch(ctx, s.replayEP, from, upTo, func(f wire.Frame) error {
		a := s.tr.Replayed(f.Seq)
		if !a.Applies() {
			switch a {
			case ActionDuplicate:
				s.sm.duplicate.Inc()
			case ActionRefuse:
				s.refuseSeq(f.Seq, "replay")
			}
			return nil
		}
		it := item{seq: f.Seq}
		it.batch, it.err = s.decode(f.Payload, "replay")
		s.sm.replayed(reason)
		if err := s.submit(ctx, &it, a, reason); err != nil {
			sinkErr = err
			return errStopReplay
		}
		return nil
	}, func(err error) {
		s.env.metrics.decodeErrors.WithLabelValues("replay", "bad_frame").Inc()
		s.env.badLog.Warn("replay/bad_frame", "dropping malformed replay reply", "worker", s.key.Worker, "dp_rank", s.key.DPRank, "err", err)
	})
	switch {
	case sinkErr != nil:
		return sinkErr
	case err == nil:
		s.sm.replay(reason, "ok")
	case errors.Is(err, errReplaySkipped):
		s.sm.replay(reason, "skipped")
	case ctx.Err() != nil:
		return nil
	default:
		s.sm.replay(reason, "failed")
		s.env.badLog.Warn("replay/"+s.key.Worker, "replay failed; the worker's blocks are dropped unless the gap is filled", "worker", s.key.Worker, "dp_rank", s.key.DPRank, "from", from, "err", err)
	}
	if s.started {
		s.setState(StateLive)
	} else {
		s.setState(StateConnecting)
	}
	return nil
}

// refuseSeq counts and logs a batch dropped for an implausible seq
// (ActionRefuse) that came live or from a replay (source).
func (s *streamRunner) refuseSeq(seq uint64, source string) {
	s.sm.badSeq.Inc()
	c, _ := s.tr.Cursor()
	s.env.badLog.Warn("bad_seq/"+s.key.Worker, "dropping a batch whose seq no engine sends next (the end marker's, or too far past the cursor)",
		"worker", s.key.Worker, "dp_rank", s.key.DPRank, "source", source, "seq", seq, "cursor", c.Seq, "max_jump", uint64(MaxSeqJump))
}

// decode decodes a payload, counting errors and skipped content under source.
func (s *streamRunner) decode(payload []byte, source string) (wire.EventBatch, error) {
	b, st, err := s.dec.Decode(payload)
	countDecode(s.env, source, st, err)
	return b, err
}

// countDecode records one Decode call's outcome in the metrics and the
// rate-limited log.
func countDecode(env *streamEnv, source string, st wire.DecodeStats, err error) {
	m := env.metrics
	if err != nil {
		reason := "malformed"
		if errors.Is(err, wire.ErrOversize) {
			reason = "oversize"
		}
		m.decodeErrors.WithLabelValues(source, reason).Inc()
		env.badLog.Warn(source+"/"+reason, "dropping undecodable event batch", "source", source, "reason", reason, "err", err)
	}
	if st.UnknownEvents > 0 {
		m.skipped.WithLabelValues("event").Add(float64(st.UnknownEvents))
		env.badLog.Warn("skip/event", "skipping unknown event types", "first", st.FirstUnknownEvent)
	}
	if st.UnknownFields > 0 {
		m.skipped.WithLabelValues("field").Add(float64(st.UnknownFields))
	}
	if st.UnknownMedia > 0 {
		m.skipped.WithLabelValues("medium").Add(float64(st.UnknownMedia))
		env.badLog.Warn("skip/medium", "unknown storage medium indexed as GPU", "first", st.FirstUnknownMedium)
	}
}

// submit hands an accepted batch to the sink: a as the Tracker decided it (Reset
// when it clears the worker); replayReason is "" for a live batch.
func (s *streamRunner) submit(ctx context.Context, it *item, a Action, replayReason string) error {
	if a.Clears() {
		s.sm.reset(s.resetReason(a, replayReason))
		s.fresh = false
	}
	s.discarded = false
	c, _ := s.tr.Cursor()
	b := StreamBatch{Stream: s.key, Seq: it.seq, Epoch: c.Epoch, Reset: a.Clears(), TS: it.batch.TS}
	if it.err != nil {
		// Its events are lost: the Tracker makes the next batch clear the worker.
		// A clear this batch was to carry is applied now, with no events.
		s.tr.Discard()
		s.discarded = true
		s.sm.undecodable.Inc()
		if !a.Clears() {
			s.updateStats()
			return nil
		}
		b.TS = 0
	} else {
		var st opStats
		b.Ops, st = s.ops.build(it.batch.Events)
		s.count(st)
		s.appliedTS = max(s.appliedTS, b.TS)
	}
	if err := s.env.sink.Submit(ctx, b); err != nil {
		// The Tracker counts the batch as applied: whoever continues from it
		// (a runner inheriting this one) must clear the worker at its next
		// batch rather than miss this one's events.
		s.tr.Discard()
		return err
	}
	s.started = true
	s.sm.applied.Inc()
	s.sm.lastSeq.Set(float64(it.seq))
	now := time.Now()
	lag := 0.0
	if b.TS > 0 {
		lag = max(0, float64(now.UnixNano())/1e9-b.TS)
		s.sm.lag.Set(lag)
	}
	s.mu.Lock()
	s.status.State = StateLive
	s.status.LastSeq, s.status.Epoch = b.Seq, b.Epoch
	s.status.LastBatch = now
	if b.TS > 0 {
		s.status.LagSeconds = lag
	}
	s.status.Stats = s.tr.Stats()
	s.mu.Unlock()
	return nil
}

func (s *streamRunner) updateStats() {
	s.mu.Lock()
	s.status.Stats = s.tr.Stats()
	s.mu.Unlock()
}

// resetReason labels a clearing action for kvindex_ingest_resets_total.
func (s *streamRunner) resetReason(a Action, replayReason string) string {
	switch {
	case s.fresh && a == ActionRestart:
		return "dead"
	case a == ActionRestart:
		return "restart"
	case s.discarded:
		return "undecodable"
	case replayReason == replayCatchUp:
		return replayCatchUp
	case replayReason == replayRestart:
		// A restarted engine's start could not be replayed: the clear is
		// the restart's.
		return "restart"
	}
	return "gap"
}

func (s *streamRunner) count(st opStats) {
	if st.stored > 0 {
		s.sm.stored.Add(float64(st.stored))
		s.sm.storedBlocks.Add(float64(st.storedBlocks))
	}
	if st.removed > 0 {
		s.sm.removed.Add(float64(st.removed))
		s.sm.removedBlocks.Add(float64(st.removedBlocks))
	}
	if st.cleared > 0 {
		s.sm.cleared.Add(float64(st.cleared))
	}
	if st.placeholders > 0 {
		s.sm.refused(refusePlaceholder, st.placeholders)
	}
	if st.otherGroups > 0 {
		s.sm.refused(refuseOtherGroup, st.otherGroups)
	}
	for _, r := range []struct {
		n      int
		reason string
	}{{st.refusedTokens, refuseTokenCount}, {st.refusedBlockLen, refuseBlockSize}, {st.refusedNoModel, refuseNoModel}} {
		if r.n > 0 {
			s.sm.refused(r.reason, r.n)
			s.env.badLog.Warn("refused/"+s.key.Worker+"/"+r.reason, "refusing events that cannot be indexed",
				"worker", s.key.Worker, "reason", r.reason, "count", r.n, "block_size", s.ops.blockSize)
		}
	}
}
