package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/kvindex/kvindex/internal/ingest"
	"github.com/kvindex/kvindex/internal/radix"
)

// Server is a single-node indexer: a radix index behind an Applier, fed by an
// ingest Manager through a LocalSink, with the HTTP endpoints on --http-addr.
type Server struct {
	cfg     Config
	log     *slog.Logger
	reg     *prometheus.Registry
	index   *radix.Index
	applier *ingest.Applier
	sink    *ingest.LocalSink
	ingest  *ingest.Manager
	ln      net.Listener
	http    *http.Server

	sinkRunning atomic.Bool
	ran         atomic.Bool
}

// New validates cfg, builds the pipeline and binds the HTTP listener (so that
// HTTPAddr is known before Run). Run must be called to serve and to release it.
func New(cfg Config, logger *slog.Logger) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	logger = logger.With("node", cfg.NodeID)
	s := &Server{cfg: cfg, log: logger, reg: prometheus.NewRegistry(), index: radix.New(radix.Config{})}
	s.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	s.applier = ingest.NewApplier(s.index)
	var err error
	if s.sink, err = ingest.NewLocalSink(s.applier, cfg.QueueCapacity, logger, s.reg); err != nil {
		return nil, err
	}
	if s.ingest, err = ingest.NewManager(cfg.Ingest, logger, s.reg); err != nil {
		return nil, err
	}
	if s.ln, err = net.Listen("tcp", cfg.HTTPAddr); err != nil {
		s.ingest.Close()
		return nil, fmt.Errorf("--http-addr %s: %w", cfg.HTTPAddr, err)
	}
	s.http = &http.Server{
		Handler:           s.Handler(),
		ReadHeaderTimeout: readHeaderTimeout,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
	return s, nil
}

// HTTPAddr is the bound HTTP address.
func (s *Server) HTTPAddr() string { return s.ln.Addr().String() }

// Index is the server's index (tests and, later, the query handlers read it).
func (s *Server) Index() *radix.Index { return s.index }

// Applier is the index's applier (cursors per stream).
func (s *Server) Applier() *ingest.Applier { return s.applier }

// Ingest is the server's ingest Manager (worker registry).
func (s *Server) Ingest() *ingest.Manager { return s.ingest }

// Run serves until ctx ends or a component fails, then stops the HTTP server
// gracefully, the ingest Manager and the apply loop, and returns the first error.
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
	wg.Add(3)
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
		if err := s.http.Serve(s.ln); !errors.Is(err, http.ErrServerClosed) {
			fail("http", err)
		}
	}()
	s.log.Info("indexer started", "http", s.HTTPAddr(), "transport", s.cfg.Ingest.Transport,
		"workers", len(s.cfg.Ingest.Workers), "zmq_bind", s.cfg.Ingest.ZMQBind)
	<-ctx.Done()
	shutdownCtx, stop := context.WithTimeout(context.Background(), shutdownTimeout)
	if err := s.http.Shutdown(shutdownCtx); err != nil {
		s.http.Close()
	}
	stop()
	wg.Wait()
	if err := s.ingest.Close(); err != nil {
		fail("ingest close", err)
	}
	s.log.Info("indexer stopped")
	return firstErr
}
