package ingest

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// ErrSinkStopped: the LocalSink's apply loop has ended.
var ErrSinkStopped = errors.New("ingest: sink stopped")

// WorkerRemover is implemented by Sinks that can drop every block and cursor of a
// worker in order with the batches submitted before. When the Manager removes a
// worker while Run runs (RemoveWorker, a workers-file reload) it first stops the
// worker's streams, then calls RemoveWorker on a Sink that implements it. A Sink
// whose removals travel another way (a replicated registry) need not implement it.
type WorkerRemover interface {
	RemoveWorker(ctx context.Context, worker string) error
}

// BatchApplier is what a LocalSink applies batches to: an *Applier, or something
// wrapping one. Its methods are called from the sink's apply goroutine only.
type BatchApplier interface {
	Apply(StreamBatch) ApplyResult
	RemoveWorker(worker string)
}

var _ BatchApplier = (*Applier)(nil)

// DefaultQueueCapacity is the LocalSink queue length NewLocalSink uses when given 0.
const DefaultQueueCapacity = 4096

// LocalSink is the single-node Sink: a bounded queue in front of one goroutine (Run)
// that applies batches to an Applier in submission order. Submit blocks while the
// queue is full (back-pressure reaches the subscribers, whose sockets then buffer
// and, past their high-water mark, drop: gaps that replay repairs), and counts it.
//
// Submit, RemoveWorker and Flush are safe for concurrent use; Run is called once.
type LocalSink struct {
	applier BatchApplier
	log     *slog.Logger
	queue   chan sinkItem
	stopped chan struct{}
	started atomic.Bool

	depth      prometheus.Gauge
	full       prometheus.Counter
	applyTime  prometheus.Histogram
	eventLag   prometheus.Histogram
	opErrors   prometheus.Counter
	opErrorLog *rateLimitedLog
}

type sinkItem struct {
	batch     StreamBatch
	remove    string        // a worker to remove instead of a batch
	flushed   chan struct{} // a Flush barrier instead of a batch
	submitted time.Time
}

var (
	_ Sink          = (*LocalSink)(nil)
	_ WorkerRemover = (*LocalSink)(nil)
)

// NewLocalSink returns a sink applying to a, with a queue of capacity batches
// (DefaultQueueCapacity when 0), registering its metrics on reg (none when nil).
func NewLocalSink(a BatchApplier, capacity int, logger *slog.Logger, reg prometheus.Registerer) (*LocalSink, error) {
	if capacity <= 0 {
		capacity = DefaultQueueCapacity
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	s := &LocalSink{
		applier: a,
		log:     logger,
		queue:   make(chan sinkItem, capacity),
		stopped: make(chan struct{}),
		depth: prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvindex_ingest_queue_depth",
			Help: "Batches waiting in the single-node apply queue."}),
		full: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvindex_ingest_queue_full_total",
			Help: "Submits that found the apply queue full and waited (back-pressure)."}),
		applyTime: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "kvindex_ingest_apply_seconds",
			Help:    "Seconds from a batch's Submit to its application to the index (queueing included).",
			Buckets: prometheus.ExponentialBuckets(1e-6, 4, 12)}),
		eventLag: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "kvindex_ingest_event_lag_seconds",
			Help:    "Seconds from the engine's batch timestamp to its application to the index (includes clock skew between hosts).",
			Buckets: prometheus.ExponentialBuckets(1e-4, 4, 10)}),
		opErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvindex_ingest_apply_op_errors_total",
			Help: "Index operations the index refused while applying batches."}),
		opErrorLog: newRateLimitedLog(logger, 10*time.Second),
	}
	capGauge := prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvindex_ingest_queue_capacity",
		Help: "Capacity of the single-node apply queue, in batches."})
	capGauge.Set(float64(capacity))
	for _, c := range []prometheus.Collector{s.depth, s.full, s.applyTime, s.eventLag, s.opErrors, capGauge} {
		if err := registerCollector(reg, c); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Submit queues b; it blocks while the queue is full and returns ctx.Err() if ctx
// ends first, or ErrSinkStopped once Run has returned.
func (s *LocalSink) Submit(ctx context.Context, b StreamBatch) error {
	return s.enqueue(ctx, sinkItem{batch: b, submitted: time.Now()})
}

// RemoveWorker queues the removal of every dp rank of worker behind the batches
// already submitted, so none of them can bring its blocks back.
func (s *LocalSink) RemoveWorker(ctx context.Context, worker string) error {
	return s.enqueue(ctx, sinkItem{remove: worker})
}

// Flush returns once everything submitted before it has been applied.
func (s *LocalSink) Flush(ctx context.Context) error {
	done := make(chan struct{})
	if err := s.enqueue(ctx, sinkItem{flushed: done}); err != nil {
		return err
	}
	select {
	case <-done:
		return nil
	case <-s.stopped:
		return ErrSinkStopped
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *LocalSink) enqueue(ctx context.Context, it sinkItem) error {
	select {
	case <-s.stopped:
		return ErrSinkStopped
	default:
	}
	select {
	case s.queue <- it:
		s.depth.Inc()
		return nil
	default:
	}
	s.full.Inc()
	select {
	case s.queue <- it:
		s.depth.Inc()
		return nil
	case <-s.stopped:
		return ErrSinkStopped
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Run applies queued items in order until ctx ends; what is still queued then is
// dropped (single node: the index lives in memory and ends with the process).
func (s *LocalSink) Run(ctx context.Context) error {
	if !s.started.CompareAndSwap(false, true) {
		return errors.New("ingest: LocalSink.Run called twice")
	}
	defer close(s.stopped)
	for {
		select {
		case <-ctx.Done():
			return nil
		case it := <-s.queue:
			s.depth.Dec()
			s.apply(&it)
		}
	}
}

func (s *LocalSink) apply(it *sinkItem) {
	switch {
	case it.flushed != nil:
		close(it.flushed)
		return
	case it.remove != "":
		s.applier.RemoveWorker(it.remove)
		return
	}
	res := s.applier.Apply(it.batch)
	now := time.Now()
	s.applyTime.Observe(now.Sub(it.submitted).Seconds())
	if it.batch.TS > 0 {
		s.eventLag.Observe(max(0, float64(now.UnixNano())/1e9-it.batch.TS))
	}
	if res.OpErrors > 0 {
		s.opErrors.Add(float64(res.OpErrors))
		s.opErrorLog.Warn("apply", "index refused operations", "count", res.OpErrors, "first", res.FirstErr)
	}
}
