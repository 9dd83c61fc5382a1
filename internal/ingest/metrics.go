package ingest

import (
	"errors"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/kvindex/kvindex/internal/ingest/wire"
	"github.com/prometheus/client_golang/prometheus"
)

// Metric names are public API (dashboards, alerts): never rename one.
//
// Ingest (Manager):
//
//	kvindex_ingest_events_total{worker,type}              decoded events applied, type = BlockStored|BlockRemoved|AllBlocksCleared
//	kvindex_ingest_block_events_total{worker,type}        blocks in those events (one per block hash)
//	kvindex_ingest_batches_total{worker,result}           batches by fate: applied|duplicate|undecodable|bad_seq (a seq no engine sends next: dropped)
//	kvindex_ingest_decode_errors_total{source,reason}     bad input dropped: source = zmq|bind|forwarded|nats|replay
//	kvindex_ingest_bind_frames_total{route}               bind socket frames: ingested (Run runs here), forwarded (to the Forwarder), dropped (neither)
//	kvindex_ingest_skipped_total{what}                    unknown events, fields and media skipped inside good batches
//	kvindex_ingest_refused_events_total{worker,reason}    events not indexed: token_count, block_size, no_model (logged); placeholder, other_group (expected, not logged)
//	kvindex_ingest_gaps_total{worker,dp_rank}             sequence gaps detected on live streams
//	kvindex_ingest_replays_total{worker,reason,result}    replay requests: reason = gap|catch_up|restart, result = ok|failed|skipped
//	kvindex_ingest_replayed_batches_total{worker,reason}  batches applied from replays
//	kvindex_ingest_resets_total{worker,reason}            worker cleared: restart|gap|undecodable|catch_up|dead (a fresh stream after the worker was declared dead, or unregistered and registered again)
//	kvindex_ingest_lag_seconds{worker,dp_rank}            engine timestamp of the last batch to its hand-off to the index
//	kvindex_ingest_last_seq{worker,dp_rank}               seq of the last batch handed off
//	kvindex_ingest_workers{source}                        registered workers by source: flag|file|registry|discovered
//
// Single-node hand-off (LocalSink):
//
//	kvindex_ingest_queue_depth, kvindex_ingest_queue_capacity, kvindex_ingest_queue_full_total,
//	kvindex_ingest_apply_seconds (Submit to applied), kvindex_ingest_event_lag_seconds
//	(engine timestamp to applied), kvindex_ingest_apply_op_errors_total.
type metrics struct {
	events          *prometheus.CounterVec
	blockEvents     *prometheus.CounterVec
	batches         *prometheus.CounterVec
	decodeErrors    *prometheus.CounterVec
	bindFrames      *prometheus.CounterVec
	skipped         *prometheus.CounterVec
	refused         *prometheus.CounterVec
	gaps            *prometheus.CounterVec
	replays         *prometheus.CounterVec
	replayedBatches *prometheus.CounterVec
	resets          *prometheus.CounterVec
	lag             *prometheus.GaugeVec
	lastSeq         *prometheus.GaugeVec
	workers         *prometheus.GaugeVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
	}
	gauge := func(name, help string, labels ...string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, labels)
	}
	m := &metrics{
		events:          counter("kvindex_ingest_events_total", "KV events handed to the index, by worker and event type.", "worker", "type"),
		blockEvents:     counter("kvindex_ingest_block_events_total", "Blocks in the KV events handed to the index (one per block hash), by worker and event type.", "worker", "type"),
		batches:         counter("kvindex_ingest_batches_total", "Event batches by fate: applied, duplicate (already applied), undecodable or bad_seq (a seq no engine sends next, dropped).", "worker", "result"),
		decodeErrors:    counter("kvindex_ingest_decode_errors_total", "Frames and payloads dropped as bad input, by transport and reason.", "source", "reason"),
		bindFrames:      counter("kvindex_ingest_bind_frames_total", "Frames received on the --zmq-bind socket by route: ingested here (this member leads), forwarded (to the leader), dropped (neither).", "route"),
		skipped:         counter("kvindex_ingest_skipped_total", "Unknown event tags, fields and media skipped inside otherwise valid batches.", "what"),
		refused:         counter("kvindex_ingest_refused_events_total", "Decoded events that cannot be indexed, by worker and reason.", "worker", "reason"),
		gaps:            counter("kvindex_ingest_gaps_total", "Sequence gaps detected on live event streams.", "worker", "dp_rank"),
		replays:         counter("kvindex_ingest_replays_total", "Replay requests to engines, by reason (gap, catch_up, restart) and result (ok, failed, skipped).", "worker", "reason", "result"),
		replayedBatches: counter("kvindex_ingest_replayed_batches_total", "Batches applied from replays.", "worker", "reason"),
		resets:          counter("kvindex_ingest_resets_total", "Times a worker's blocks were dropped because its stream could not be followed, by reason.", "worker", "reason"),
		lag:             gauge("kvindex_ingest_lag_seconds", "Seconds between the engine stamping the last batch and ingest handing it to the index.", "worker", "dp_rank"),
		lastSeq:         gauge("kvindex_ingest_last_seq", "Sequence number of the last batch handed to the index.", "worker", "dp_rank"),
		workers:         gauge("kvindex_ingest_workers", "Registered workers by source (flag, file, registry, discovered).", "source"),
	}
	for _, c := range []prometheus.Collector{m.events, m.blockEvents, m.batches, m.decodeErrors, m.bindFrames, m.skipped, m.refused,
		m.gaps, m.replays, m.replayedBatches, m.resets, m.lag, m.lastSeq, m.workers} {
		if err := registerCollector(reg, c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// registerCollector registers c unless reg is nil.
func registerCollector(reg prometheus.Registerer, c prometheus.Collector) error {
	if reg == nil {
		return nil
	}
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			return errors.New("ingest: metrics already registered on this registry (one Manager and one LocalSink per registry)")
		}
		return err
	}
	return nil
}

// forgetWorker drops every series of a removed worker.
func (m *metrics) forgetWorker(id string) {
	l := prometheus.Labels{"worker": id}
	for _, v := range []*prometheus.CounterVec{m.events, m.blockEvents, m.batches, m.refused, m.gaps, m.replays, m.replayedBatches, m.resets} {
		v.DeletePartialMatch(l)
	}
	m.lag.DeletePartialMatch(l)
	m.lastSeq.DeletePartialMatch(l)
}

// streamMetrics are one stream's series, resolved once so the hot path does no
// label lookups.
type streamMetrics struct {
	stored, removed, cleared        prometheus.Counter
	storedBlocks, removedBlocks     prometheus.Counter
	applied, duplicate, undecodable prometheus.Counter
	badSeq                          prometheus.Counter
	gaps                            prometheus.Counter
	lag, lastSeq                    prometheus.Gauge
	m                               *metrics
	worker                          string
}

func (m *metrics) forStream(s Stream) *streamMetrics {
	w, r := s.Worker, strconv.FormatUint(uint64(s.DPRank), 10)
	return &streamMetrics{
		stored:        m.events.WithLabelValues(w, wire.BlockStored.String()),
		removed:       m.events.WithLabelValues(w, wire.BlockRemoved.String()),
		cleared:       m.events.WithLabelValues(w, wire.AllBlocksCleared.String()),
		storedBlocks:  m.blockEvents.WithLabelValues(w, wire.BlockStored.String()),
		removedBlocks: m.blockEvents.WithLabelValues(w, wire.BlockRemoved.String()),
		applied:       m.batches.WithLabelValues(w, "applied"),
		duplicate:     m.batches.WithLabelValues(w, "duplicate"),
		undecodable:   m.batches.WithLabelValues(w, "undecodable"),
		badSeq:        m.batches.WithLabelValues(w, "bad_seq"),
		gaps:          m.gaps.WithLabelValues(w, r),
		lag:           m.lag.WithLabelValues(w, r),
		lastSeq:       m.lastSeq.WithLabelValues(w, r),
		m:             m,
		worker:        w,
	}
}

func (sm *streamMetrics) replay(reason, result string) {
	sm.m.replays.WithLabelValues(sm.worker, reason, result).Inc()
}

func (sm *streamMetrics) replayed(reason string) {
	sm.m.replayedBatches.WithLabelValues(sm.worker, reason).Inc()
}

func (sm *streamMetrics) reset(reason string) {
	sm.m.resets.WithLabelValues(sm.worker, reason).Inc()
}

func (sm *streamMetrics) refused(reason string, n int) {
	sm.m.refused.WithLabelValues(sm.worker, reason).Add(float64(n))
}

// rateLimitedLog logs the first occurrence of each kind of bad input and then at
// most one line per interval, with the number of occurrences it did not log: a
// flood of garbage must not become a flood of log lines.
//
// Kinds name workers ("bad_seq/<worker>"), so the table would grow with worker
// churn for the life of the process. It is swept whenever it has doubled since
// the last sweep: a kind last logged an interval ago or more goes (its next
// occurrence logs anyway; only a count of suppressed lines older than an
// interval can be lost), so the table holds about the kinds seen within one
// interval, at amortised O(1) per Warn.
type rateLimitedLog struct {
	log      *slog.Logger
	interval time.Duration
	now      func() time.Time

	mu      sync.Mutex
	kinds   map[string]*rateState
	sweepAt int // len(kinds) at which the next sweep runs
}

// minSweepAt is the table size below which no sweep runs.
const minSweepAt = 64

type rateState struct {
	last       time.Time
	suppressed int
}

func newRateLimitedLog(log *slog.Logger, interval time.Duration) *rateLimitedLog {
	return &rateLimitedLog{log: log, interval: interval, now: time.Now, kinds: map[string]*rateState{}, sweepAt: minSweepAt}
}

// Warn logs msg at warn level unless a message of the same kind was logged less
// than an interval ago.
func (l *rateLimitedLog) Warn(kind, msg string, args ...any) {
	now := l.now()
	l.mu.Lock()
	st, ok := l.kinds[kind]
	if !ok {
		if len(l.kinds) >= l.sweepAt {
			l.sweepLocked(now)
		}
		st = &rateState{}
		l.kinds[kind] = st
	} else if now.Sub(st.last) < l.interval {
		st.suppressed++
		l.mu.Unlock()
		return
	}
	suppressed := st.suppressed
	st.last, st.suppressed = now, 0
	l.mu.Unlock()
	if suppressed > 0 {
		args = append(args, "suppressed_since_last_log", suppressed)
	}
	l.log.Warn(msg, args...)
}

// sweepLocked forgets the kinds last logged an interval ago or more.
func (l *rateLimitedLog) sweepLocked(now time.Time) {
	for kind, st := range l.kinds {
		if now.Sub(st.last) >= l.interval {
			delete(l.kinds, kind)
		}
	}
	l.sweepAt = max(minSweepAt, 2*len(l.kinds))
}
