package router

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"

	kvindexv1 "github.com/kvindex/kvindex/api/proto/kvindex/v1"
	kvindex "github.com/kvindex/kvindex/clients/go"
	"github.com/kvindex/kvindex/internal/logging"
	"github.com/kvindex/kvindex/internal/tokenize"
	"github.com/kvindex/kvindex/internal/workerspec"
)

// Router is one router process: the fleet view, the load ledger, the breakers,
// the overlays and the policy, behind an HTTP handler. Safe for concurrent use.
type Router struct {
	cfg Config
	log *slog.Logger
	now func() time.Time
	hc  *http.Client
	reg *prometheus.Registry

	fleet      *Fleet
	ledger     *Ledger
	breakers   *Breakers
	adm        *admission
	tokenizers *tokenize.Registry
	builtin    tokenize.Tokenizer
	tcache     *tokenize.Cache
	index      *indexSource // nil without --indexer
	client     *kvindex.Client
	recent     *overlay // the predicted overlay and the approximate index
	sessions   *sessionMap
	policy     Policy
	keyRules   keyRules
	scraper    *engineScraper // nil without --scrape-engine-metrics
	shared     *fleetLedger   // nil without --indexer or with --ledger=false
	metrics    *metrics
	ui         *routerUI // the console (ui.go)

	eppAddr    atomic.Value // string: the EPP's bound address, once listening
	kubeSource WorkerSource // nil without --kube-selector

	// pickMu makes the read of the router's own decisions (predicted overlay,
	// session bindings), load snapshot, pick, reservation and breaker probe one
	// step, so that concurrent decisions see each other (doc.go).
	pickMu sync.Mutex
}

// New builds a router from a validated configuration. It loads the tokenizers
// and connects nothing yet; Run starts the background loops.
func New(cfg Config, log *slog.Logger) (*Router, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	tcache, err := tokenize.NewCache(tokenize.CacheConfig{MaxBytes: cfg.TokenizeCacheBytes, Registerer: reg})
	if err != nil {
		return nil, err
	}
	tokenizers := tokenize.NewRegistry()
	opts := tokenize.Options{Cache: tcache, ContentFormat: tokenize.ContentFormat(cfg.ChatTemplateContentFormat)}
	if err := tokenizers.LoadAll(cfg.Tokenizers, opts); err != nil {
		tcache.Close()
		return nil, err
	}
	now := time.Now
	r := &Router{
		cfg: cfg, log: log, now: now, reg: reg,
		hc: &http.Client{Transport: &http.Transport{
			Proxy:               nil,
			DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConns:        1024,
			MaxIdleConnsPerHost: 256,
			IdleConnTimeout:     90 * time.Second,
			DisableCompression:  true, // relay bytes as the engine sent them
		}},
		fleet:      newFleet(cfg.Workers, cfg.BlockSize, log),
		ledger:     newLedger(cfg.ReservationTTL, now),
		breakers:   newBreakers(cfg.BreakerFailureThreshold, cfg.BreakerCooldown, cfg.BreakerMaxCooldown, now),
		adm:        newAdmission(cfg.QueueSize, cfg.QueueTimeout),
		tokenizers: tokenizers,
		builtin:    tokenize.NewBuiltin(),
		tcache:     tcache,
		recent:     newOverlay(cfg.PredictedTTL, cfg.ApproxTTL, cfg.OverlayMaxBlocks),
		sessions:   newSessionMap(cfg.SessionTTL, cfg.OverlayMaxBlocks),
		keyRules:   keyRules{explicitMax: cfg.ExplicitKeyMaxLength, systemMax: cfg.SystemSegmentMaxLength, documentMax: cfg.DocumentSegmentMaxLength},
	}
	// A worker can become usable without load going down; the queued requests
	// are woken then too.
	r.fleet.onChange, r.breakers.onUsable = r.adm.wake, r.adm.wake
	r.metrics = newMetricsWith(reg, r.refreshFleetInflight)
	r.policy = NewPolicy(cfg)
	if cfg.ScrapeEngineMetrics {
		r.scraper = &engineScraper{loads: map[Target]EngineLoad{}}
	}
	if len(cfg.Indexer) > 0 {
		opts := kvindex.Options{Addrs: cfg.Indexer}
		if cfg.IndexerTLSCA != "" || cfg.IndexerTLSCert != "" {
			if opts.TLS, err = kvindex.ClientTLS(cfg.IndexerTLSCA, cfg.IndexerTLSCert, cfg.IndexerTLSKey, cfg.IndexerTLSServerName); err != nil {
				tcache.Close()
				return nil, fmt.Errorf("%w: --indexer-tls-*: %v", ErrInvalidConfig, err)
			}
		}
		c, err := kvindex.New(opts)
		if err != nil {
			tcache.Close()
			return nil, err
		}
		r.client = c
		r.index = &indexSource{client: c, timeout: cfg.IndexerTimeout, retryAfter: cfg.IndexerRetryAfter, now: now,
			onResult: func(ok bool, took time.Duration) {
				result, up := "ok", 1.0
				if !ok {
					result, up = "error", 0
				}
				r.metrics.indexerLatency.WithLabelValues(result).Observe(took.Seconds())
				r.metrics.indexerUp.Set(up)
			}}
		r.metrics.indexerUp.Set(1)
		if cfg.Ledger {
			id := cfg.RouterID
			if id == "" {
				host, _ := os.Hostname()
				id = fmt.Sprintf("%s-%d", host, os.Getpid())
			}
			r.shared = &fleetLedger{r: r, id: id, addrs: cfg.Indexer, token: cfg.IndexerToken, interval: cfg.LedgerInterval, tls: opts.TLS,
				conns: map[string]*grpc.ClientConn{}, others: NewOtherRouters(cfg.ApproxTTL, cfg.OverlayMaxBlocks)}
			reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kvindex_router_ledger_staleness_seconds",
				Help: "Age of the fleet view this router uses (time since the ledger's last push); -1 while disconnected."}, r.shared.staleness))
		}
	}
	r.wireMetrics()
	r.ui = r.newUI()
	return r, nil
}

// NewPolicy returns the policy cfg.Policy names, configured by cfg (kv-aware's
// cost knobs, the ring's virtual nodes). The route bench drives policies through
// it with the same code the router runs.
func NewPolicy(cfg Config) Policy {
	switch cfg.Policy {
	case PolicyRoundRobin:
		return &roundRobin{}
	case PolicyRandom:
		return random{}
	case PolicyPowerOfTwo:
		return powerOfTwo{}
	case PolicyLeastLoaded:
		return leastLoaded{}
	case PolicySession:
		return &ringPolicy{name: PolicySession, rings: newRingCache(cfg.RingVNodes), key: func(q *RouteRequest) string { return q.SessionKey }}
	case PolicyPrefixHash:
		return &ringPolicy{name: PolicyPrefixHash, rings: newRingCache(cfg.RingVNodes), key: func(q *RouteRequest) string { return q.PrefixKey }}
	}
	return &kvAware{cfg: cfg}
}

// wireMetrics connects the ledger, breakers and queue to their gauges.
func (r *Router) wireMetrics() {
	m := r.metrics
	r.ledger.onDelta = func(worker string, inflight, prefill, decode int) {
		m.inflight.WithLabelValues(worker, "local").Add(float64(inflight))
		m.prefillTokens.WithLabelValues(worker).Add(float64(prefill))
		m.decodeBlocks.WithLabelValues(worker).Add(float64(decode))
	}
	r.ledger.onExpire = m.reservationsTTL.Inc
	r.breakers.onState = func(worker string, s BreakerState) { m.breakerState.WithLabelValues(worker).Set(float64(s)) }
	r.breakers.onTrip = func(worker string) {
		m.breakerTrips.WithLabelValues(worker).Inc()
		r.log.Warn("breaker opened: worker excluded", "worker", worker)
	}
	r.adm.onDepth = func(n int) { m.queueDepth.Set(float64(n)) }
	for _, w := range r.fleet.Workers() {
		m.breakerState.WithLabelValues(w.ID).Set(0)
		m.breakerTrips.WithLabelValues(w.ID)
		m.inflight.WithLabelValues(w.ID, "local")
		m.tokenParity.WithLabelValues(w.Model).Set(-1)
	}
}

// loadOf is the load on t that decisions use: this router's own plus, with the
// ledger, every other router's.
func (r *Router) loadOf(t Target) Load {
	return AddLoad(r.ledger.Load(t), r.shared.remoteLoad(t))
}

// refreshFleetInflight sets kvindex_router_worker_inflight{scope="fleet"}: per
// worker, this router's live count plus the others' from the ledger.
func (r *Router) refreshFleetInflight(vec *prometheus.GaugeVec) {
	local := r.ledger.Loads()
	for _, w := range r.fleet.Workers() {
		n := 0
		for rank := range w.Ranks {
			t := Target{Worker: w.ID, Rank: rank}
			n += local[t].InFlight + r.shared.remoteLoad(t).InFlight
		}
		vec.WithLabelValues(w.ID, "fleet").Set(float64(n))
	}
}

// Handler serves the proxy and the router's own endpoints.
func (r *Router) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", r.handleGenerate(endpointChat))
	mux.HandleFunc("POST /v1/completions", r.handleGenerate(endpointCompletions))
	mux.HandleFunc("POST /v1/", r.handleGenerate(endpointOther))
	mux.HandleFunc("GET /v1/models", r.handleModels)
	mux.HandleFunc("POST /debug/route", r.handleDebugRoute)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok\n")) })
	mux.HandleFunc("GET /readyz", r.handleReady)
	mux.Handle("GET /metrics", promhttp.HandlerFor(r.reg, promhttp.HandlerOpts{}))
	r.ui.register(mux)
	return mux
}

// handleReady: ready when the fleet has at least one routable worker. The
// indexer is not required: without it the router routes on its own view.
func (r *Router) handleReady(w http.ResponseWriter, _ *http.Request) {
	if len(r.fleet.Workers()) == 0 {
		http.Error(w, "no routable worker (give --worker, --workers-file or --workers-from-indexer; workers need http=)", http.StatusServiceUnavailable)
		return
	}
	w.Write([]byte("ok\n"))
}

// handleModels answers the union of the workers' models and LoRA adapters.
func (r *Router) handleModels(w http.ResponseWriter, _ *http.Request) {
	list := modelList{Object: "list", Data: []modelCard{}}
	seen := map[string]bool{}
	created := r.now().Unix()
	for _, wk := range r.fleet.Workers() {
		if !seen[wk.Model] {
			seen[wk.Model] = true
			list.Data = append(list.Data, modelCard{ID: wk.Model, Object: "model", Created: created, OwnedBy: "kvindex", Root: wk.Model})
		}
		for a := range wk.Adapters {
			if !seen[a] {
				seen[a] = true
				base := wk.Model
				list.Data = append(list.Data, modelCard{ID: a, Object: "model", Created: created, OwnedBy: "kvindex", Root: a, Parent: &base})
			}
		}
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(list)
}

// Run starts the background loops (workers file, registry, models, scrape,
// parity, reservation sweep) and serves on l until ctx ends, then drains
// in-flight streams for --shutdown-timeout.
func (r *Router) Run(ctx context.Context, l net.Listener) error {
	bg, stopBG := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	goBG := func(f func()) { wg.Add(1); go func() { defer wg.Done(); f() }() }
	defer func() { stopBG(); wg.Wait(); r.close() }()

	if r.cfg.WorkersFile != "" {
		goBG(func() { r.fleet.watchFile(bg, r.cfg.WorkersFile, min(r.cfg.WorkersRefresh, time.Second)) })
	}
	if r.cfg.WorkersFromIndexer {
		goBG(func() { r.followRegistry(bg) })
	}
	if r.kubeSource != nil {
		goBG(func() { r.followKube(bg) })
	}
	goBG(func() { r.fleet.pollModels(bg, r.hc, r.cfg.WorkersRefresh) })
	if r.scraper != nil {
		goBG(func() { r.scraper.run(bg, r.hc, r.fleet, r.cfg.ScrapeInterval) })
	}
	if r.shared != nil {
		goBG(func() { r.shared.run(bg) })
	}
	goBG(func() { r.watchParity(bg) })
	if r.client != nil {
		// Connect to the indexer now, so the first request's query does not pay for
		// the connection and miss its deadline.
		goBG(func() {
			wctx, cancel := context.WithTimeout(bg, 5*time.Second)
			defer cancel()
			if _, err := r.client.Stats(wctx); err != nil && bg.Err() == nil {
				r.log.Warn("indexer not reachable at start; routing on the approximate index until it answers", "indexer", r.cfg.Indexer, "err", err)
			}
		})
	}
	goBG(func() {
		r.every(bg, min(r.cfg.ReservationTTL/4, 30*time.Second), func(context.Context) {
			if n := r.ledger.Sweep(); n > 0 {
				r.log.Warn("dropped load reservations past --reservation-ttl", "count", n)
			}
		})
	})

	if r.cfg.EPP.Addr != "" {
		el, err := net.Listen("tcp", r.cfg.EPP.Addr)
		if err != nil {
			return fmt.Errorf("--epp-addr: %w", err)
		}
		r.eppAddr.Store(el.Addr().String())
		goBG(func() {
			if err := r.serveEPP(bg, el); err != nil {
				r.log.Error("endpoint picker stopped", "err", err)
			}
		})
	}
	srv := &http.Server{Handler: r.Handler(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 120 * time.Second,
		ErrorLog: slog.NewLogLogger(r.log.Handler(), slog.LevelDebug)}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(l) }()
	r.log.Info("router listening", "addr", l.Addr().String(), "policy", r.cfg.Policy, "mode", r.cfg.Mode,
		"workers", len(r.fleet.Workers()), "indexer", r.cfg.Indexer)
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	r.log.Info("draining in-flight requests", "timeout", r.cfg.ShutdownTimeout)
	sctx, cancel := context.WithTimeout(context.Background(), r.cfg.ShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		srv.Close()
		return fmt.Errorf("shutdown: %w", err)
	}
	return nil
}

// EPPAddr is the endpoint picker's bound address ("" before Run listens or
// without --epp-addr).
func (r *Router) EPPAddr() string {
	s, _ := r.eppAddr.Load().(string)
	return s
}

// every runs f now and then every period until ctx ends.
func (r *Router) every(ctx context.Context, period time.Duration, f func(context.Context)) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		f(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (r *Router) close() {
	r.breakers.stop()
	if r.client != nil {
		r.client.Close()
	}
	if r.shared != nil {
		r.shared.close()
	}
	r.tcache.Close()
	r.hc.CloseIdleConnections()
}

// followRegistry keeps the fleet equal to the indexer's worker registry: a poll
// every --workers-refresh, and an immediate one when Watch reports a worker
// removed or a change from a worker the router does not know.
func (r *Router) followRegistry(ctx context.Context) {
	refresh := make(chan struct{}, 1)
	poke := func() {
		select {
		case refresh <- struct{}{}:
		default:
		}
	}
	go func() {
		for ctx.Err() == nil {
			err := r.client.Watch(ctx, &kvindexv1.WatchRequest{}, func(changes []*kvindexv1.IndexChange) error {
				v := r.fleet.View()
				for _, c := range changes {
					if c.Kind == kvindexv1.ChangeKind_CHANGE_KIND_WORKER_REMOVED || v.byID[c.Worker] == nil {
						poke()
						return nil
					}
				}
				return nil
			})
			if err != nil && ctx.Err() == nil {
				r.log.Debug("registry watch ended; retrying", "err", err)
			}
			select {
			case <-ctx.Done():
			case <-time.After(r.cfg.WorkersRefresh):
			}
		}
	}()
	t := time.NewTicker(r.cfg.WorkersRefresh)
	defer t.Stop()
	for {
		qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		resp, err := r.client.Workers(qctx, "")
		cancel()
		if err == nil {
			specs := make([]workerspec.Spec, 0, len(resp.Workers))
			for _, w := range resp.Workers {
				specs = append(specs, specFromProto(w.Spec))
			}
			r.fleet.setRegistry(specs)
		} else if ctx.Err() == nil {
			r.log.Warn("indexer registry unavailable; keeping the last worker list", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-refresh:
		}
	}
}

var roleNames = map[kvindexv1.WorkerRole]string{
	kvindexv1.WorkerRole_WORKER_ROLE_PREFILL: "prefill",
	kvindexv1.WorkerRole_WORKER_ROLE_DECODE:  "decode",
}

func specFromProto(p *kvindexv1.WorkerSpec) workerspec.Spec {
	return workerspec.Spec{ID: p.Id, Model: p.Model, BlockSize: int(p.BlockSize), DPSize: int(p.DpSize),
		HTTP: p.HttpEndpoint, Role: roleNames[p.Role], Labels: p.Labels}
}

// Main is the router binary: parse flags and environment, then serve until ctx
// ends.
func Main(ctx context.Context, args []string, stderr io.Writer, opts ...Option) error {
	var o mainOptions
	for _, opt := range opts {
		opt(&o)
	}
	cfg, err := ParseFlags(args, stderr, nil)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	log := logging.New(cfg.LogLevel, cfg.LogFormat, stderr)
	r, err := New(cfg, log)
	if err != nil {
		return err
	}
	if cfg.Kube.Selector != "" {
		if o.kube == nil {
			r.close()
			return invalid("--kube-selector=%q: this binary was built without Kubernetes discovery (use cmd/router)", cfg.Kube.Selector)
		}
		src, err := o.kube(cfg.Kube, log)
		if err != nil {
			r.close()
			return err
		}
		r.SetKubeSource(src)
	}
	l, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		r.close()
		return err
	}
	return r.Run(ctx, l)
}
