package server

import (
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

	"github.com/kvindex/kvindex/internal/ingest"
	"github.com/kvindex/kvindex/internal/radix"
)

// Server is a single-node indexer: a radix index behind an Applier, fed by an
// ingest Manager through a LocalSink, with the API (gRPC on --grpc-addr, REST
// on --http-addr) served over a localBackend.
type Server struct {
	cfg     Config
	log     *slog.Logger
	reg     *prometheus.Registry
	index   *radix.Index
	applier *ingest.Applier
	sink    *ingest.LocalSink
	ingest  *ingest.Manager
	backend *localBackend
	api     *API

	httpLn, grpcLn net.Listener
	http           *http.Server
	grpc           *grpc.Server
	health         *health.Server
	tls            *tls.Config

	sinkRunning atomic.Bool
	ran         atomic.Bool
}

// New validates cfg, builds the pipeline, loads the tokenizers and binds both
// listeners (so that HTTPAddr and GRPCAddr are known before Run). Run must be
// called to serve and to release them.
func New(cfg Config, logger *slog.Logger) (_ *Server, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	logger = logger.With("node", cfg.NodeID)
	s := &Server{cfg: cfg, log: logger, reg: prometheus.NewRegistry(), index: radix.New(radix.Config{})}
	if s.tls, err = cfg.tlsConfig(); err != nil {
		return nil, err
	}
	tokenizers, fallback, err := cfg.tokenizers()
	if err != nil {
		return nil, err
	}
	s.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	s.applier = ingest.NewApplier(s.index)
	fa := &feedApplier{inner: s.applier, feed: NewChangeFeed(cfg.WatchBuffer)}
	if s.sink, err = ingest.NewLocalSink(fa, cfg.QueueCapacity, logger, s.reg); err != nil {
		return nil, err
	}
	if s.ingest, err = ingest.NewManager(cfg.Ingest, logger, s.reg); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			s.closeListeners()
			s.ingest.Close()
		}
	}()
	s.backend = &localBackend{nodeID: cfg.NodeID, index: s.index, applier: s.applier, fa: fa, sink: s.sink,
		ingest: s.ingest, running: &s.sinkRunning}
	s.api, err = NewAPI(s.backend, APIConfig{
		NodeID: cfg.NodeID, DefaultBlockSize: cfg.Ingest.DefaultBlockSize, MaxPromptTokens: cfg.MaxPromptTokens,
		MaxBodyBytes: cfg.MaxBodyBytes, AdminToken: cfg.AdminToken, Tokenizers: tokenizers, Fallback: fallback,
		Registerer: s.reg, Gatherer: s.reg,
	}, logger)
	if err != nil {
		return nil, err
	}
	if s.httpLn, err = net.Listen("tcp", cfg.HTTPAddr); err != nil {
		return nil, fmt.Errorf("--http-addr %s: %w", cfg.HTTPAddr, err)
	}
	if s.grpcLn, err = net.Listen("tcp", cfg.GRPCAddr); err != nil {
		return nil, fmt.Errorf("--grpc-addr %s: %w", cfg.GRPCAddr, err)
	}
	s.backend.grpcAddr = s.GRPCAddr()
	s.http = &http.Server{
		Handler:           s.api.Handler(),
		ReadHeaderTimeout: readHeaderTimeout,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
		TLSConfig:         s.tls,
	}
	var creds credentials.TransportCredentials
	if s.tls != nil {
		creds = credentials.NewTLS(s.tls)
	}
	s.health = health.NewServer()
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	s.grpc = s.api.GRPCServer(creds, s.health)
	return s, nil
}

func (s *Server) closeListeners() {
	for _, ln := range []net.Listener{s.httpLn, s.grpcLn} {
		if ln != nil {
			ln.Close()
		}
	}
}

// HTTPAddr is the bound HTTP address.
func (s *Server) HTTPAddr() string { return s.httpLn.Addr().String() }

// GRPCAddr is the bound gRPC address.
func (s *Server) GRPCAddr() string { return s.grpcLn.Addr().String() }

// Index is the server's index.
func (s *Server) Index() *radix.Index { return s.index }

// Applier is the index's applier (cursors per stream).
func (s *Server) Applier() *ingest.Applier { return s.applier }

// Ingest is the server's ingest Manager (worker registry).
func (s *Server) Ingest() *ingest.Manager { return s.ingest }

// API is the server's query API.
func (s *Server) API() *API { return s.api }

// Backend is the single-node Backend the API is served over.
func (s *Server) Backend() Backend { return s.backend }

// healthInterval is how often the gRPC health status follows readiness.
const healthInterval = 200 * time.Millisecond

// Run serves until ctx ends or a component fails, then stops the HTTP and gRPC
// servers gracefully, the ingest Manager and the apply loop, and returns the
// first error.
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
	wg.Add(5)
	go func() {
		defer wg.Done()
		s.sinkRunning.Store(true)
		defer s.sinkRunning.Store(false)
		fail("apply loop", s.sink.Run(ctx))
	}()
	go func() {
		defer wg.Done()
		fail("ingest", s.ingest.Run(ctx, s.sink, s.applier))
	}()
	go func() {
		defer wg.Done()
		var err error
		if s.tls != nil {
			err = s.http.ServeTLS(s.httpLn, "", "")
		} else {
			err = s.http.Serve(s.httpLn)
		}
		if !errors.Is(err, http.ErrServerClosed) {
			fail("http", err)
		}
	}()
	go func() {
		defer wg.Done()
		fail("grpc", s.grpc.Serve(s.grpcLn))
	}()
	go func() {
		defer wg.Done()
		s.followReadiness(ctx)
	}()
	s.log.Info("indexer started", "http", s.HTTPAddr(), "grpc", s.GRPCAddr(), "tls", s.tls != nil,
		"mtls", s.cfg.TLSClientCA != "", "admin_token", s.cfg.AdminToken != "", "transport", s.cfg.Ingest.Transport,
		"workers", len(s.cfg.Ingest.Workers), "zmq_bind", s.cfg.Ingest.ZMQBind, "tokenizers", len(s.cfg.Tokenizers))
	<-ctx.Done()
	s.health.Shutdown()
	s.backend.Changes().CloseAll(fmt.Errorf("%w: the indexer is shutting down", ErrUnavailable))
	shutdownCtx, stop := context.WithTimeout(context.Background(), shutdownTimeout)
	if err := s.http.Shutdown(shutdownCtx); err != nil {
		s.http.Close()
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
	s.log.Info("indexer stopped")
	return firstErr
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
