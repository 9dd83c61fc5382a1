package server

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	kvindexv1 "github.com/kvindex/kvindex/api/proto/kvindex/v1"
	"github.com/kvindex/kvindex/internal/ingest"
	"github.com/kvindex/kvindex/internal/radix"
	"github.com/kvindex/kvindex/internal/raftstore"
	"github.com/kvindex/kvindex/internal/retry"
)

// Server is one indexer: a member of a raft cluster (of one, by default) whose
// replicated state is the index, the stream cursors and the worker registry.
// It serves the API (gRPC on --grpc-addr, REST on --http-addr, and with
// --probe-addr health and metrics in plain HTTP) over a raftBackend; while it
// leads, its ingest Manager follows the engines and proposes their events to
// the log.
type Server struct {
	cfg     Config
	log     *slog.Logger
	reg     *prometheus.Registry
	node    *raftstore.Node
	ingest  *ingest.Manager
	peers   *peers
	backend *raftBackend
	// forwarder sends bind-mode frames to the leader while this node does
	// not lead (with --zmq-bind).
	forwarder *frameForwarder
	api       *API

	httpLn, grpcLn net.Listener
	// probeLn and probe serve --probe-addr (probe.go); nil when it is off.
	probeLn       net.Listener
	probe         *http.Server
	grpcAdvertise string
	http          *http.Server
	grpc          *grpc.Server
	health        *health.Server
	tls           *tls.Config

	ran atomic.Bool
}

// New validates cfg, builds the pipeline, loads the tokenizers, binds both
// listeners and starts the raft node from cfg.DataDir (bootstrapping a new
// cluster when the directory is empty and cfg.Join is not set). Run must be
// called to serve and to release them.
func New(cfg Config, logger *slog.Logger) (_ *Server, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	logger = logger.With("node", cfg.NodeID)
	s := &Server{cfg: cfg, log: logger, reg: prometheus.NewRegistry()}
	if s.tls, err = cfg.tlsConfig(); err != nil {
		return nil, err
	}
	tokenizers, fallback, err := cfg.tokenizers()
	if err != nil {
		return nil, err
	}
	s.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if s.ingest, err = ingest.NewManager(cfg.Ingest, logger, s.reg); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			if s.node != nil {
				s.node.Shutdown(context.Background())
			}
			s.closeListeners()
			s.ingest.Close()
		}
	}()
	if s.httpLn, err = net.Listen("tcp", cfg.HTTPAddr); err != nil {
		return nil, fmt.Errorf("--http-addr %s: %w", cfg.HTTPAddr, err)
	}
	if s.grpcLn, err = net.Listen("tcp", cfg.GRPCAddr); err != nil {
		return nil, fmt.Errorf("--grpc-addr %s: %w", cfg.GRPCAddr, err)
	}
	if cfg.ProbeAddr != "" {
		if s.probeLn, err = net.Listen("tcp", cfg.ProbeAddr); err != nil {
			return nil, fmt.Errorf("--probe-addr %s: %w", cfg.ProbeAddr, err)
		}
	}
	s.grpcAdvertise = cmp.Or(cfg.GRPCAdvertise, s.grpcLn.Addr().String())
	s.peers = newPeers(cfg.NodeID, cfg.AdminToken, cfg.peerTLS(s.tls))
	s.backend = &raftBackend{
		ingest: s.ingest, feed: NewChangeFeed(cfg.WatchBuffer), peers: s.peers, log: logger, nodeID: cfg.NodeID,
		regChanged:  make(chan struct{}, 1),
		readyMaxLag: uint64(cfg.ReadyMaxLag), contactTimeout: cfg.Raft.HeartbeatTimeout,
	}
	if cfg.Kube.Selector != "" { // before the raft node: a discovery that cannot start leaves no raft state behind
		if s.backend.kube, err = newKubeWorkers(cfg, s.backend, s.reg, logger); err != nil {
			return nil, err
		}
	}
	rc := cfg.raftConfig()
	rc.GRPCAddr = s.grpcAdvertise
	rc.Logger = logger
	rc.Registerer = s.reg
	rc.OnWorkersChanged = s.backend.workersChanged
	rc.BeforeBatch = s.backend.beforeBatch
	rc.OnBatch = s.backend.afterBatch
	if observe := cfg.onBatch; observe != nil {
		rc.OnBatch = func(index uint64, b *ingest.StreamBatch, o raftstore.BatchOutcome, r ingest.ApplyResult) {
			s.backend.afterBatch(index, b, o, r)
			observe(index, b, o, r)
		}
	}
	rc.OnWorkerRemoved = s.backend.workerRemoved
	rc.OnWorkerDead = s.backend.workerDead
	rc.AfterEntry = s.backend.feed.EntryApplied
	raftServer, raftClient, err := cfg.raftTLS()
	if err != nil {
		return nil, err
	}
	if raftServer != nil {
		if rc.StreamLayer, err = raftstore.NewTLSStreamLayer(rc.RaftAddr, rc.RaftAdvertise, raftServer, raftClient); err != nil {
			return nil, fmt.Errorf("--raft-addr %s: %w", rc.RaftAddr, err)
		}
	}
	if s.node, err = raftstore.NewNode(rc); err != nil {
		if rc.StreamLayer != nil {
			rc.StreamLayer.Close()
		}
		return nil, err
	}
	s.backend.node = s.node
	// The leader's gRPC limit bounds a forwarded message; a little of it is
	// the message's own framing.
	if cfg.Ingest.ZMQBind != "" {
		if s.forwarder, err = newFrameForwarder(s.node, s.peers, int(cfg.MaxBodyBytes)-1024, logger, s.reg); err != nil {
			return nil, err
		}
	}
	if s.backend.health, err = newHealthProber(s.node, cfg.WorkerDeadAfter, cfg.WorkerHealthInterval, logger, s.reg); err != nil {
		return nil, err
	}
	s.reg.MustRegister(deadCollector{s.node})
	s.backend.digests = digests{copyIndex: s.node.IndexCopy, applied: s.node.AppliedIndex, interval: minDigestInterval}
	s.backend.index.Store(s.node.Index())
	s.api, err = NewAPI(s.backend, APIConfig{
		DefaultBlockSize: cfg.Ingest.DefaultBlockSize, MaxPromptTokens: cfg.MaxPromptTokens,
		MaxBodyBytes: cfg.MaxBodyBytes, AdminToken: cfg.AdminToken, LedgerToken: cfg.LedgerToken, Tokenizers: tokenizers, Fallback: fallback,
		MaxConcurrentStreams: cfg.GRPCMaxConcurrentStreams, MaxWatchStreams: cfg.MaxWatchStreams,
		LedgerLease: cfg.LedgerLease, LedgerPushInterval: cfg.LedgerPushInterval, LedgerMaxRouters: cfg.LedgerMaxRouters,
		HTTPWriteTimeout: cfg.HTTPWriteTimeout,
		Registerer:       s.reg, Gatherer: s.reg,
	}, logger)
	if err != nil {
		return nil, err
	}
	invalidate := s.api.view.invalidate
	s.backend.onRegistry.Store(&invalidate)
	s.http = s.httpServer(s.api.Handler())
	s.http.TLSConfig = s.tls
	if s.probeLn != nil {
		s.probe = s.httpServer(s.api.ProbeHandler()) // plain HTTP whatever --tls-cert says
	}
	var creds credentials.TransportCredentials
	if s.tls != nil {
		creds = credentials.NewTLS(s.tls)
	}
	s.health = health.NewServer()
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	s.grpc = s.api.GRPCServer(creds, s.health)
	s.warnIfExposed()
	return s, nil
}

// httpServer serves handler with the --http-*-timeout limits, without TLS.
func (s *Server) httpServer(handler http.Handler) *http.Server {
	return &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: min(readHeaderTimeout, s.cfg.HTTPReadTimeout),
		ReadTimeout:       s.cfg.HTTPReadTimeout,
		WriteTimeout:      s.cfg.HTTPWriteTimeout,
		IdleTimeout:       s.cfg.HTTPIdleTimeout,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
}

// warnIfExposed logs, loudly, each listener beyond loopback that serves
// without TLS: whoever reaches the raft port can rewrite the index, and the
// API's admin token then crosses the network in clear. --probe-addr is never
// warned about: it is plain HTTP by design and serves only health and metrics
// (probe.go).
func (s *Server) warnIfExposed() {
	if s.tls != nil {
		return
	}
	for _, l := range []struct{ flag, addr string }{
		{"--raft-addr", s.cfg.Raft.RaftAddr}, {"--grpc-addr", s.cfg.GRPCAddr}, {"--http-addr", s.cfg.HTTPAddr},
	} {
		if !isLoopback(l.addr) {
			s.log.Warn("INSECURE: a listener beyond loopback without TLS; anyone who reaches it can read the index, and on the raft port rewrite it. Set --tls-cert, --tls-key and --raft-tls-ca",
				"flag", l.flag, "addr", l.addr)
		}
	}
}

func (s *Server) closeListeners() {
	for _, ln := range []net.Listener{s.httpLn, s.grpcLn, s.probeLn} {
		if ln != nil {
			ln.Close()
		}
	}
}

// HTTPAddr is the bound HTTP address.
func (s *Server) HTTPAddr() string { return s.httpLn.Addr().String() }

// ProbeAddr is the bound --probe-addr address; "" when it is off.
func (s *Server) ProbeAddr() string {
	if s.probeLn == nil {
		return ""
	}
	return s.probeLn.Addr().String()
}

// GRPCAddr is the bound gRPC address.
func (s *Server) GRPCAddr() string { return s.grpcLn.Addr().String() }

// RaftAddr is the raft address this node advertises.
func (s *Server) RaftAddr() string { return s.node.RaftAddr() }

// Index is this replica's index.
func (s *Server) Index() *radix.Index { return s.node.Index() }

// Applier is the index's applier (cursors per stream), as replicated.
func (s *Server) Applier() *ingest.Applier { return s.node.Applier() }

// Ingest is the server's ingest Manager (it follows the engines while this node leads).
func (s *Server) Ingest() *ingest.Manager { return s.ingest }

// API is the server's query API.
func (s *Server) API() *API { return s.api }

// Backend is the Backend the API is served over.
func (s *Server) Backend() Backend { return s.backend }

// healthInterval is how often the gRPC health status follows readiness.
const healthInterval = 200 * time.Millisecond

// Run serves until ctx ends or a component fails, then stops: ingest first,
// then raft (a leader hands leadership over before it stops), then the HTTP and
// gRPC servers, gracefully; it returns the first error.
func (s *Server) Run(ctx context.Context) error {
	if !s.ran.CompareAndSwap(false, true) {
		return errors.New("indexer: Server.Run called twice")
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	var errMu sync.Mutex
	var firstErr error
	fail := func(what string, err error) {
		if err == nil {
			return
		}
		errMu.Lock()
		if firstErr == nil {
			firstErr = fmt.Errorf("%s: %w", what, err)
		}
		errMu.Unlock()
		cancel(err)
	}
	run := func(f func()) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f()
		}()
	}
	run(func() { s.backend.runIngest(ctx, fail) })
	if s.cfg.Ingest.ZMQBind != "" {
		// Every member binds; one that does not lead forwards to the leader.
		run(func() { s.forwarder.run(ctx) })
		run(func() {
			if err := s.ingest.ServeBind(ctx, s.forwarder); err != nil {
				fail("bind", err)
			}
		})
	}
	run(func() { s.backend.followRegistry(ctx) })
	run(func() {
		select {
		case <-s.node.Done():
			if ctx.Err() == nil {
				fail("raft", cmp.Or(s.node.Err(), raftstore.ErrShutdown))
			}
		case <-ctx.Done():
		}
	})
	switch {
	case s.cfg.Join != "":
		run(func() { s.joinCluster(ctx, s.cfg.Join) })
	case len(s.cfg.BootstrapPeers) > 0:
		run(func() { s.bootstrapOrJoin(ctx) })
	}
	run(func() {
		var err error
		if s.tls != nil {
			err = s.http.ServeTLS(s.httpLn, "", "")
		} else {
			err = s.http.Serve(s.httpLn)
		}
		if !errors.Is(err, http.ErrServerClosed) {
			fail("http", err)
		}
	})
	if s.probe != nil {
		run(func() {
			if err := s.probe.Serve(s.probeLn); !errors.Is(err, http.ErrServerClosed) {
				fail("probe", err)
			}
		})
	}
	run(func() { fail("grpc", s.grpc.Serve(s.grpcLn)) })
	run(func() { s.followReadiness(ctx) })
	run(func() { s.followLeadership(ctx) })
	run(func() { s.api.ledger.run(ctx, func() bool { return s.api.leaderOnly() == nil }) })
	s.log.Info("indexer started", "http", s.HTTPAddr(), "grpc", s.GRPCAddr(), "probe", s.ProbeAddr(), "raft", s.RaftAddr(), "data_dir", s.cfg.DataDir,
		"join", s.cfg.Join, "tls", s.tls != nil, "mtls", s.cfg.TLSClientCA != "", "admin_token", s.cfg.AdminToken != "", "ledger_token", s.cfg.LedgerToken != "",
		"transport", s.cfg.Ingest.Transport, "workers", len(s.cfg.Ingest.Workers), "zmq_bind", s.cfg.Ingest.ZMQBind,
		"kube_selector", s.cfg.Kube.Selector, "tokenizers", len(s.cfg.Tokenizers))
	<-ctx.Done()
	s.health.Shutdown()
	s.backend.Changes().Close(fmt.Errorf("%w: the indexer is shutting down", ErrUnavailable))
	shutdownCtx, stop := context.WithTimeout(context.Background(), shutdownTimeout)
	// Ingest has stopped with ctx; raft stops while the API still answers reads.
	if err := s.node.Shutdown(shutdownCtx); err != nil {
		fail("raft shutdown", err)
	}
	for _, hs := range []*http.Server{s.http, s.probe} {
		if hs != nil && hs.Shutdown(shutdownCtx) != nil {
			hs.Close()
		}
	}
	stopped := make(chan struct{})
	go func() {
		s.grpc.GracefulStop()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-shutdownCtx.Done():
		s.grpc.Stop() // open Watch streams never end by themselves
	}
	stop()
	wg.Wait()
	if err := s.ingest.Close(); err != nil {
		fail("ingest close", err)
	}
	s.peers.close()
	s.log.Info("indexer stopped")
	return firstErr
}

// joinBackoff paces the attempts to join the cluster.
var joinBackoff = retry.Backoff{Initial: 100 * time.Millisecond, Max: 2 * time.Second}

// joinAttemptTimeout bounds one Join: a member that takes the connection but
// never answers must not hold the join up for good (a Join retried after a
// timeout that did add this node is a no-op).
const joinAttemptTimeout = 15 * time.Second

// joinCluster asks the member at via (--join) to add this node, until it
// succeeds or ctx ends. A node that is a member already (a restart) is added
// again as a no-op, which also updates the gRPC address the cluster knows for
// it.
func (s *Server) joinCluster(ctx context.Context, via string) {
	for attempt := 1; ; attempt++ {
		resp, err := s.joinOnce(ctx, via)
		if err == nil {
			s.log.Info("joined the cluster", "via", via, "applied_index", resp.AppliedIndex, "attempts", attempt)
			return
		}
		if ctx.Err() != nil {
			return
		}
		s.log.Log(ctx, retryLogLevel(attempt), "joining the cluster failed; trying again", "via", via, "attempt", attempt, "err", err)
		if joinBackoff.Wait(ctx, attempt-1) != nil {
			return
		}
	}
}

// joinOnce asks the member at via to add this node as a voter (the member
// forwards the request to the leader).
func (s *Server) joinOnce(ctx context.Context, via string) (*kvindexv1.JoinResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, joinAttemptTimeout)
	defer cancel()
	actx, c, err := s.peers.admin(ctx, via, false)
	if err != nil {
		return nil, err
	}
	return c.Join(actx, &kvindexv1.JoinRequest{NodeId: s.cfg.NodeID, RaftAddr: s.node.RaftAddr(), GrpcAddr: s.grpcAdvertise,
		Suffrage: kvindexv1.Suffrage_SUFFRAGE_VOTER})
}

// retryLogLevel rate-limits the log of a loop that retries: attempt 1 and
// every tenth after it warn, the others are debug.
func retryLogLevel(attempt int) slog.Level {
	if attempt%10 == 1 {
		return slog.LevelWarn
	}
	return slog.LevelDebug
}

// followReadiness keeps the gRPC health status equal to the backend's readiness.
func (s *Server) followReadiness(ctx context.Context) {
	t := time.NewTicker(healthInterval)
	defer t.Stop()
	serving := healthpb.HealthCheckResponse_UNKNOWN
	for {
		want := healthpb.HealthCheckResponse_SERVING
		if s.backend.Ready() != nil {
			want = healthpb.HealthCheckResponse_NOT_SERVING
		}
		if want != serving {
			s.health.SetServingStatus("", want)
			s.health.SetServingStatus("kvindex.v1.IndexService", want)
			serving = want
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
