package router

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the router's Prometheus series. Names and labels are public API
// (dashboards and alerts use them): add, never rename.
type metrics struct {
	requests        *prometheus.CounterVec   // policy, result, worker
	decisions       *prometheus.CounterVec   // policy, source
	overhead        prometheus.Histogram     // arrival -> upstream request sent
	retries         *prometheus.CounterVec   // reason
	rejected        *prometheus.CounterVec   // reason (429s)
	queueDepth      prometheus.Gauge         //
	excluded        *prometheus.CounterVec   // reason
	inflight        *prometheus.GaugeVec     // worker, scope
	prefillTokens   *prometheus.GaugeVec     // worker
	decodeBlocks    *prometheus.GaugeVec     // worker
	breakerState    *prometheus.GaugeVec     // worker
	breakerTrips    *prometheus.CounterVec   // worker
	tokenParity     *prometheus.GaugeVec     // model
	hitAvailable    prometheus.Counter       //
	hitCaptured     prometheus.Counter       //
	indexerUp       prometheus.Gauge         //
	indexerLatency  *prometheus.HistogramVec // result
	reservationsTTL prometheus.Counter       //
	pdLocalPrefill  *prometheus.CounterVec   // reason
	ledgerConnected prometheus.Gauge
	ledgerRouters   prometheus.Gauge
	ledgerRebuild   prometheus.Histogram
	ledgerMessages  *prometheus.CounterVec // direction
	ledgerBytes     *prometheus.CounterVec // direction
}

func newMetrics(reg prometheus.Registerer) *metrics {
	return newMetricsWith(reg, nil)
}

// newMetricsWith registers the metrics; fleet, when not nil, refreshes the
// scope="fleet" in-flight gauges right before each scrape.
func newMetricsWith(reg prometheus.Registerer, fleet func(*prometheus.GaugeVec)) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvindex_router_requests_total",
			Help: "Requests finished, by policy, result (ok, upstream_error, client_error, canceled, rejected, no_worker) and serving worker (empty when none)."},
			[]string{"policy", "result", "worker"}),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvindex_router_decisions_total",
			Help: "Routing decisions by policy and by where the chosen worker's overlap came from (index, predicted, approximate, load-only, direct, session)."},
			[]string{"policy", "source"}),
		overhead: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "kvindex_router_overhead_seconds",
			Help:    "Router overhead per request: arrival to the upstream request sent (body read, tokenization, indexer query, decision).",
			Buckets: []float64{50e-6, 100e-6, 200e-6, 400e-6, 700e-6, 1e-3, 2e-3, 5e-3, 10e-3, 25e-3, 50e-3, 0.1}}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvindex_router_retries_total",
			Help: "Attempts retried on another worker before the first response byte, by reason (connect, status_5xx, status_429, first_byte_timeout, prefill_failed)."},
			[]string{"reason"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvindex_router_rejected_total",
			Help: "Requests refused with 429 by admission, by reason (queue_full, queue_timeout)."},
			[]string{"reason"}),
		queueDepth: prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvindex_router_queue_depth",
			Help: "Requests waiting in the admission queue for a busy fleet."}),
		excluded: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvindex_router_excluded_total",
			Help: "Candidates filtered out before scoring, by reason (breaker, busy, full, retried, queued), per decision attempt (a queued request counts at each retry)."},
			[]string{"reason"}),
		inflight: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "kvindex_router_worker_inflight",
			Help: "Requests in flight per worker; scope=local counts this router's own, scope=fleet all routers' (the ledger's view plus this router's live count)."},
			[]string{"worker", "scope"}),
		prefillTokens: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "kvindex_router_worker_prefill_tokens",
			Help: "Uncached prompt tokens dispatched to the worker whose first byte has not arrived."},
			[]string{"worker"}),
		decodeBlocks: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "kvindex_router_worker_decode_blocks",
			Help: "KV blocks (prompt + expected output) of requests in flight on the worker."},
			[]string{"worker"}),
		breakerState: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "kvindex_router_worker_breaker_state",
			Help: "Circuit breaker per worker: 0 closed, 1 half-open, 2 open."},
			[]string{"worker"}),
		breakerTrips: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvindex_router_worker_breaker_trips_total",
			Help: "Times the worker's breaker opened."},
			[]string{"worker"}),
		tokenParity: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "kvindex_router_token_parity",
			Help: "1 when the router's token ids equal a worker's /tokenize for the model's probe prompts, 0 when they differ (every overlap will then be 0), -1 before the first probe answered."},
			[]string{"model"}),
		hitAvailable: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvindex_router_hit_available_blocks_total",
			Help: "Sum over decisions of the best cached-prefix overlap (blocks) any eligible worker had."}),
		hitCaptured: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvindex_router_hit_captured_blocks_total",
			Help: "Sum over decisions of the chosen worker's cached-prefix overlap (blocks); captured/available says how much of the available cache routing used."}),
		indexerUp: prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvindex_router_indexer_up",
			Help: "1 while the indexer answers queries, 0 while the router routes on its approximate index."}),
		indexerLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "kvindex_router_indexer_query_seconds",
			Help:    "Indexer QueryByHash latency, by result (ok, error).",
			Buckets: []float64{100e-6, 200e-6, 400e-6, 700e-6, 1e-3, 2e-3, 5e-3, 10e-3, 20e-3, 50e-3}},
			[]string{"result"}),
		reservationsTTL: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvindex_router_reservations_expired_total",
			Help: "Load reservations dropped by the --reservation-ttl sweep (should stay 0: a leak guard)."}),
		pdLocalPrefill: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvindex_router_pd_local_prefill_total",
			Help: "Disaggregated requests prefilled on the decode worker, by reason (below_threshold, prefill_failed)."},
			[]string{"reason"}),
		ledgerConnected: prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvindex_router_ledger_connected",
			Help: "1 while the router shares load through the indexer's ledger, 0 while it routes on its own load."}),
		ledgerRouters: prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvindex_router_ledger_routers",
			Help: "Routers the ledger counts, as last pushed (this one included)."}),
		ledgerRebuild: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "kvindex_router_ledger_rebuild_seconds",
			Help:    "From losing the ledger stream (an election, a fault) to the first fleet view from the new leader.",
			Buckets: prometheus.ExponentialBuckets(0.01, 2, 12)}),
		ledgerMessages: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvindex_router_ledger_messages_total",
			Help: "Ledger stream messages by direction (sent, received)."}, []string{"direction"}),
		ledgerBytes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvindex_router_ledger_bytes_total",
			Help: "Ledger stream payload bytes (protobuf) by direction (sent, received)."}, []string{"direction"}),
	}
	var inflight prometheus.Collector = m.inflight
	if fleet != nil {
		inflight = refreshed{m.inflight, func() { fleet(m.inflight) }}
	}
	reg.MustRegister(m.ledgerConnected, m.ledgerRouters, m.ledgerRebuild, m.ledgerMessages, m.ledgerBytes)
	reg.MustRegister(m.requests, m.decisions, m.overhead, m.retries, m.rejected, m.queueDepth, m.excluded,
		inflight, m.prefillTokens, m.decodeBlocks, m.breakerState, m.breakerTrips, m.tokenParity,
		m.hitAvailable, m.hitCaptured, m.indexerUp, m.indexerLatency, m.reservationsTTL, m.pdLocalPrefill)
	return m
}

// refreshed is a collector that runs refresh before each collection.
type refreshed struct {
	prometheus.Collector
	refresh func()
}

func (c refreshed) Collect(ch chan<- prometheus.Metric) {
	c.refresh()
	c.Collector.Collect(ch)
}
