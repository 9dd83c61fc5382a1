package server

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvindex/kvindex/internal/radix"
	"github.com/kvindex/kvindex/internal/tokenize"
)

// APIConfig configures the query API.
type APIConfig struct {
	// DefaultBlockSize is the block size of workers that do not state one
	// (--block-size); 0 when unknown.
	DefaultBlockSize int
	// MaxPromptTokens bounds a prompt (token ids, tokenized text or chat) and a
	// block hash list.
	MaxPromptTokens int
	// MaxBodyBytes bounds HTTP request bodies and gRPC messages.
	MaxBodyBytes int64
	// AdminToken, when set, is the bearer token every admin call requires
	// (access.go: all but the public reads); LedgerToken, when set too, opens
	// LoadService and nothing else.
	AdminToken, LedgerToken string
	// MaxConcurrentStreams bounds the calls open at once on one gRPC
	// connection; MaxWatchStreams the Watch streams open at once (0: defaults).
	MaxConcurrentStreams uint32
	MaxWatchStreams      int
	// LedgerLease, LedgerPushInterval and LedgerMaxRouters configure the routers'
	// shared load ledger (LoadService); 0 takes the defaults.
	LedgerLease        time.Duration
	LedgerPushInterval time.Duration
	LedgerMaxRouters   int
	// HTTPWriteTimeout is how long writing one part of a REST dump may take (0:
	// the server's own write timeout for the whole response).
	HTTPWriteTimeout time.Duration
	// Tokenizers maps models to tokenizers; Fallback, when not nil, serves
	// models without one.
	Tokenizers *tokenize.Registry
	Fallback   tokenize.Tokenizer
	// Registerer receives the API's metrics; Gatherer serves /metrics.
	Registerer prometheus.Registerer
	Gatherer   prometheus.Gatherer
}

// DefaultMaxPromptTokens is --max-prompt-tokens's default.
const DefaultMaxPromptTokens = 512 << 10

// API serves the query and admin API of one node over its Backend: the gRPC
// services (GRPCServer) and the REST endpoints (Handler). Safe for concurrent use.
type API struct {
	backend          Backend
	log              *slog.Logger
	tokenizers       *tokenize.Registry
	fallback         tokenize.Tokenizer
	defaultBlockSize int
	maxPromptTokens  int
	maxBodyBytes     int64
	adminToken       string
	ledgerToken      string
	gatherer         prometheus.Gatherer
	names            *namespaceNames
	view             *viewCache
	metrics          *apiMetrics
	dumps            dumpSlot
	maxStreams       uint32
	watches          streamLimit
	ledger           *loadLedger
	ui               *uiConsole // one per API, however many handlers are built
	writeTimeout     time.Duration
}

// NewAPI returns the API of a node served by b; what its queries teach about
// namespace names also names the changes of b's ChangeFeed.
func NewAPI(b Backend, cfg APIConfig, logger *slog.Logger) (*API, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Tokenizers == nil {
		cfg.Tokenizers = tokenize.NewRegistry()
	}
	if cfg.MaxPromptTokens <= 0 {
		cfg.MaxPromptTokens = DefaultMaxPromptTokens
	}
	a := &API{
		backend: b, log: logger, tokenizers: cfg.Tokenizers, fallback: cfg.Fallback,
		defaultBlockSize: cfg.DefaultBlockSize, maxPromptTokens: cfg.MaxPromptTokens,
		maxBodyBytes: cfg.MaxBodyBytes, adminToken: cfg.AdminToken, ledgerToken: cfg.LedgerToken,
		gatherer: cfg.Gatherer, names: b.Changes().Names(), dumps: newDumpSlot(),
		writeTimeout: cfg.HTTPWriteTimeout,
		maxStreams:   cmp.Or(cfg.MaxConcurrentStreams, DefaultConfig().GRPCMaxConcurrentStreams),
		watches:      streamLimit{max: int64(cmp.Or(cfg.MaxWatchStreams, DefaultConfig().MaxWatchStreams))},
	}
	a.view = &viewCache{backend: b, defaultBlockSize: cfg.DefaultBlockSize, ttl: viewTTL}
	if _, err := a.view.get(context.Background()); err != nil {
		return nil, fmt.Errorf("reading the worker registry: %w", err)
	}
	var err error
	if a.metrics, err = newAPIMetrics(cfg.Registerer, b.Index()); err != nil {
		return nil, err
	}
	lm, err := newLedgerMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	d := DefaultConfig()
	a.ledger = newLoadLedger(cmp.Or(cfg.LedgerLease, d.LedgerLease), cmp.Or(cfg.LedgerPushInterval, d.LedgerPushInterval),
		cmp.Or(cfg.LedgerMaxRouters, d.LedgerMaxRouters), lm, logger)
	a.ui = a.newUIConsole()
	return a, nil
}

// viewTTL bounds how stale the registry view of scoring may be for workers
// registered other than through this API (flags, files, discovery, raft).
const viewTTL = 250 * time.Millisecond

// apiMetrics are the API's Prometheus metrics.
type apiMetrics struct {
	requests *prometheus.CounterVec
	latency  *prometheus.HistogramVec
}

func newAPIMetrics(reg prometheus.Registerer, ix *radix.Index) (*apiMetrics, error) {
	m := &apiMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvindex_api_requests_total",
			Help: "API requests by protocol (grpc, http), method and outcome code."}, []string{"api", "method", "code"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "kvindex_api_request_seconds",
			Help: "API request latency by protocol and method (streams: until the stream ends).", Buckets: prometheus.ExponentialBuckets(25e-6, 2, 16)},
			[]string{"api", "method"}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.requests, m.latency, indexCollector{ix}} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("registering API metrics: %w", err)
		}
	}
	return m, nil
}

func (m *apiMetrics) observe(api, method, code string, start time.Time) {
	m.requests.WithLabelValues(api, method, code).Inc()
	m.latency.WithLabelValues(api, method).Observe(time.Since(start).Seconds())
}

// indexCollector exports the index's sizes and counters (radix.Stats) at scrape
// time. Stats reports the counters under the same names without the prefix.
type indexCollector struct{ ix *radix.Index }

var (
	indexGaugeDescs = map[string]*prometheus.Desc{
		"nodes":           prometheus.NewDesc("kvindex_index_nodes", "Block nodes in the index, including holder-less ones kept for their children.", nil, nil),
		"residencies":     prometheus.NewDesc("kvindex_index_residencies", "(block, worker, dp rank) pairs held on at least one tier.", nil, nil),
		"holders":         prometheus.NewDesc("kvindex_index_holders", "(worker, dp rank) holders known to the index.", nil, nil),
		"namespaces":      prometheus.NewDesc("kvindex_index_namespaces", "(model, LoRA, cache salt) namespaces holding blocks.", nil, nil),
		"detached_blocks": prometheus.NewDesc("kvindex_index_detached_blocks", "Blocks kept detached because their parent is unknown to their worker.", nil, nil),
	}
	workerDetachedDesc = prometheus.NewDesc("kvindex_worker_detached_blocks",
		"Blocks of a worker (all dp ranks) kept detached: stored under a parent the worker never reported, so they cannot match. Only workers that keep any are listed.",
		[]string{"worker"}, nil)
	indexCounterDesc = prometheus.NewDesc("kvindex_index_block_results_total",
		"What the index did with stored and removed blocks since it was created (result: stored_attached, stored_duplicate, stored_detached, stored_dropped, stored_replaced, detached_reattached, removed_blocks, removed_unknown).",
		[]string{"result"}, nil)
)

func (c indexCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range indexGaugeDescs {
		ch <- d
	}
	ch <- indexCounterDesc
	ch <- workerDetachedDesc
}

func (c indexCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.ix.Stats()
	for name, v := range indexGauges(st) {
		ch <- prometheus.MustNewConstMetric(indexGaugeDescs[name], prometheus.GaugeValue, float64(v))
	}
	for name, v := range indexCounters(st) {
		ch <- prometheus.MustNewConstMetric(indexCounterDesc, prometheus.CounterValue, float64(v), name)
	}
	for worker, n := range c.ix.DetachedBlocks() {
		ch <- prometheus.MustNewConstMetric(workerDetachedDesc, prometheus.GaugeValue, float64(n), worker)
	}
}

func indexGauges(st radix.Stats) map[string]uint64 {
	return map[string]uint64{
		"nodes": uint64(st.Nodes), "residencies": uint64(st.Residencies), "holders": uint64(st.Workers),
		"namespaces": uint64(st.Namespaces), "detached_blocks": uint64(st.Detached),
	}
}

func indexCounters(st radix.Stats) map[string]uint64 {
	c := st.Counters
	return map[string]uint64{
		"stored_attached": c.StoredAttached, "stored_duplicate": c.StoredDuplicate,
		"stored_detached": c.StoredDetached, "stored_dropped": c.StoredDropped,
		"stored_replaced": c.StoredReplaced, "detached_reattached": c.DetachedReattached,
		"removed_blocks": c.RemovedBlocks, "removed_unknown": c.RemovedUnknown,
	}
}
