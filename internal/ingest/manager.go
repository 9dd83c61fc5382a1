package ingest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kvindex/kvindex/internal/ingest/wire"
	"github.com/kvindex/kvindex/internal/workerspec"
	zmq "github.com/pebbe/zmq4"
	"github.com/prometheus/client_golang/prometheus"
)

var (
	// ErrInvalidConfig is wrapped by every ManagerConfig error; the message names
	// the flag and the bad value.
	ErrInvalidConfig = errors.New("ingest: invalid config")
	// ErrRunning: Run was called while a previous Run is still running.
	ErrRunning = errors.New("ingest: manager already running")
	// ErrClosed: the Manager was closed.
	ErrClosed = errors.New("ingest: manager closed")
	// ErrWorkerConflict: a worker id is already declared by a source that wins
	// (flags over the registry over the workers file over discovery).
	ErrWorkerConflict = errors.New("ingest: worker declared elsewhere")
)

// Transport is how KV events reach the indexer.
type Transport string

const (
	// TransportZMQ: dial each worker's PUB socket (connect mode) and/or accept
	// engines on --zmq-bind (bind mode).
	TransportZMQ Transport = "zmq"
	// TransportNATS: one subscription to <prefix>.*.* carrying relayed batches.
	TransportNATS Transport = "nats"
)

// WorkerSource says who declared a worker.
type WorkerSource string

const (
	SourceFlag     WorkerSource = "flag"       // ManagerConfig.Workers (--worker)
	SourceRegistry WorkerSource = "registry"   // AddWorker
	SourceFile     WorkerSource = "file"       // --workers-file
	SourceDiscover WorkerSource = "discovered" // first event on the bind socket or NATS
)

// sourceRank orders sources: a worker declared by a higher one cannot be replaced
// by a lower one.
func sourceRank(s WorkerSource) int {
	switch s {
	case SourceFlag:
		return 3
	case SourceRegistry:
		return 2
	case SourceFile:
		return 1
	}
	return 0
}

// ManagerConfig configures a Manager. DefaultManagerConfig gives the defaults.
type ManagerConfig struct {
	Transport Transport
	// Workers are the statically declared workers (--worker).
	Workers []workerspec.Spec
	// WorkersFile is a YAML file of workers (see workerspec.ParseFile), re-read while Run
	// runs whenever it changes (checked every WorkersFilePoll).
	WorkersFile     string
	WorkersFilePoll time.Duration
	// ZMQBind is the endpoint of the bind-mode SUB socket engines connect to;
	// empty disables bind mode. A "tcp://host:*" port picks a free one (BindEndpoint).
	ZMQBind           string
	NATSURL           string
	NATSSubjectPrefix string
	// DefaultBlockSize is the block size of workers whose spec gives none; events
	// carrying another block_size are refused. 0 accepts each event's block_size.
	DefaultBlockSize int
	// MaxFrameBytes bounds an event batch payload: larger ones are counted and
	// dropped. libzmq itself refuses frames above 4x this (plus 1 MiB) by
	// dropping the sender's connection, so a hostile peer cannot make us allocate
	// without bound.
	MaxFrameBytes int
	// ReplayTimeout is how long a replay may go without a reply before it fails.
	ReplayTimeout time.Duration
	// ReplayBackoffMax caps the pause after failed replays (it doubles from
	// ReplayTimeout); gaps during the pause drop the worker's blocks at once.
	ReplayBackoffMax time.Duration
	// IdleReplayInterval: a stream with a replay endpoint that received nothing for
	// this long asks the engine for anything after its cursor (engines send no
	// heartbeat, so a lost last batch is otherwise invisible until the next one).
	// 0 disables it.
	IdleReplayInterval time.Duration
	// RestartWindow is the "near 0" bound of engine restart detection
	// (DefaultRestartWindow when 0).
	RestartWindow uint64
	// BadInputLogInterval is the minimum interval between two log lines about the
	// same kind of bad input.
	BadInputLogInterval time.Duration
	// PollInterval bounds how long a socket goroutine waits before it notices that
	// its context ended.
	PollInterval time.Duration
	// MaxDiscoveredWorkers bounds discovery on the bind socket and NATS: a new
	// worker is refused (counted: decode_errors reason discovery_limit) while
	// the Manager follows this many workers its configuration does not declare
	// (discovered or from the registry). 0 turns discovery off. Every worker
	// costs memory, goroutines and a registry entry on every replica, and
	// anyone who can publish on the socket or subject can invent names.
	MaxDiscoveredWorkers int
	// MaxDiscoveredDPRanks bounds the dp ranks of a discovered worker, whose
	// ranks come from its batches: a batch of rank MaxDiscoveredDPRanks or
	// above is refused (counted: decode_errors reason rank_limit). A declared
	// worker (flag, file, registry) is held to its dp-size the same way
	// (reason dp_size). Every rank is a stream: a goroutine, a decoder, a
	// 256-batch queue and an index holder on every replica.
	MaxDiscoveredDPRanks int
	// DiscoverAllow, when not empty, lists the worker ids discovery accepts, as
	// path.Match patterns (pod-*, vllm-?); others are refused (reason
	// not_allowed).
	DiscoverAllow []string
	// ReplayAllow lists the replay endpoints a NATS Kv-Replay header or
	// BindReplayPattern may name, as path.Match patterns over the whole
	// endpoint; the endpoint must also be tcp://. Others are ignored (reason
	// replay_not_allowed): the indexer would dial whatever a publisher names.
	ReplayAllow []string
	// BindReplayPattern gives a worker discovered on the bind socket its replay
	// endpoint: "{pod}" is replaced by the pod of its kv@<pod>@<model> topic
	// (tcp://{pod}.engines.ns.svc:5558). A SUB socket does not tell who sent
	// a frame, so the topic is all there is to go by. "" leaves such workers
	// without replay (their gaps reset them) unless registered with one.
	BindReplayPattern string
}

// DefaultNATSSubjectPrefix is the default subject prefix of relayed batches.
const DefaultNATSSubjectPrefix = "kv.events"

// DefaultMaxFrameBytes is the default MaxFrameBytes.
const DefaultMaxFrameBytes = wire.DefaultMaxPayload

// DefaultMaxDiscoveredWorkers is the default MaxDiscoveredWorkers.
const DefaultMaxDiscoveredWorkers = 1024

// DefaultMaxDiscoveredDPRanks is the default MaxDiscoveredDPRanks: above the
// data-parallel sizes one engine deployment publishes under one pod name.
const DefaultMaxDiscoveredDPRanks = 64

// DefaultManagerConfig returns the defaults.
func DefaultManagerConfig() ManagerConfig {
	return ManagerConfig{
		Transport:            TransportZMQ,
		WorkersFilePoll:      2 * time.Second,
		NATSSubjectPrefix:    DefaultNATSSubjectPrefix,
		DefaultBlockSize:     16,
		MaxFrameBytes:        DefaultMaxFrameBytes,
		ReplayTimeout:        2 * time.Second,
		ReplayBackoffMax:     30 * time.Second,
		IdleReplayInterval:   5 * time.Second,
		BadInputLogInterval:  10 * time.Second,
		PollInterval:         50 * time.Millisecond,
		MaxDiscoveredWorkers: DefaultMaxDiscoveredWorkers,
		MaxDiscoveredDPRanks: DefaultMaxDiscoveredDPRanks,
		ReplayAllow:          []string{"tcp://*"},
	}
}

func invalidConfig(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, args...))
}

// Validate reports the first bad value, naming its flag.
func (c ManagerConfig) Validate() error {
	switch {
	case c.Transport != TransportZMQ && c.Transport != TransportNATS:
		return invalidConfig("--kv-event-transport=%q must be zmq or nats", c.Transport)
	case c.Transport == TransportNATS && c.NATSURL == "":
		return invalidConfig("--kv-event-transport=nats needs --nats-url")
	case c.Transport != TransportNATS && c.NATSURL != "":
		// Accepted and ignored, it would leave the events the operator meant to
		// take from NATS unread without a word.
		return invalidConfig("--nats-url=%q needs --kv-event-transport=nats (the transport is %s)", c.NATSURL, c.Transport)
	case c.Transport == TransportNATS && c.ZMQBind != "":
		return invalidConfig("--zmq-bind=%q cannot be used with --kv-event-transport=nats", c.ZMQBind)
	case c.DefaultBlockSize < 0 || c.DefaultBlockSize > workerspec.MaxBlockSize:
		return invalidConfig("--block-size=%d must be between 0 and %d", c.DefaultBlockSize, workerspec.MaxBlockSize)
	case c.MaxFrameBytes < 1024 || c.MaxFrameBytes > 1<<30:
		return invalidConfig("--max-frame-bytes=%d must be between 1024 and %d", c.MaxFrameBytes, 1<<30)
	case c.ReplayTimeout <= 0:
		return invalidConfig("--replay-timeout=%v must be positive", c.ReplayTimeout)
	case c.ReplayBackoffMax < 0:
		return invalidConfig("replay back-off max %v must not be negative", c.ReplayBackoffMax)
	case c.IdleReplayInterval < 0:
		return invalidConfig("--idle-replay-interval=%v must not be negative", c.IdleReplayInterval)
	case c.WorkersFilePoll <= 0:
		return invalidConfig("workers file poll interval %v must be positive", c.WorkersFilePoll)
	case c.BadInputLogInterval < 0:
		return invalidConfig("bad input log interval %v must not be negative", c.BadInputLogInterval)
	case c.PollInterval <= 0:
		return invalidConfig("poll interval %v must be positive", c.PollInterval)
	case c.MaxDiscoveredWorkers < 0:
		return invalidConfig("--max-discovered-workers=%d must not be negative", c.MaxDiscoveredWorkers)
	case c.MaxDiscoveredDPRanks < 1 || c.MaxDiscoveredDPRanks > workerspec.MaxDPSize:
		return invalidConfig("--max-discovered-dp-ranks=%d must be between 1 and %d", c.MaxDiscoveredDPRanks, workerspec.MaxDPSize)
	}
	for _, l := range []struct {
		flag     string
		patterns []string
	}{{"--discover-allow", c.DiscoverAllow}, {"--discover-replay-allow", c.ReplayAllow}} {
		for _, p := range l.patterns {
			if _, err := path.Match(p, ""); err != nil || p == "" {
				return invalidConfig("%s pattern %q is not a path.Match pattern", l.flag, p)
			}
		}
	}
	for _, p := range c.ReplayAllow {
		if !strings.HasPrefix(p, "tcp://") {
			return invalidConfig("--discover-replay-allow pattern %q must start with tcp://", p)
		}
	}
	if c.Transport == TransportNATS {
		if err := validSubjectPrefix(c.NATSSubjectPrefix); err != nil {
			return invalidConfig("--nats-subject-prefix=%q: %v", c.NATSSubjectPrefix, err)
		}
	}
	if err := validReplayPattern(c.BindReplayPattern); err != nil {
		return invalidConfig("--bind-replay-pattern=%q %v", c.BindReplayPattern, err)
	}
	if c.ZMQBind != "" && !strings.Contains(c.ZMQBind, "://") {
		return invalidConfig("--zmq-bind=%q is not a ZMQ endpoint (tcp://*:5557)", c.ZMQBind)
	}
	seen := map[string]bool{}
	for _, w := range c.Workers {
		if err := w.Validate(); err != nil {
			return fmt.Errorf("%w: --worker: %w", ErrInvalidConfig, err)
		}
		if seen[w.ID] {
			return invalidConfig("--worker id=%s given twice", w.ID)
		}
		seen[w.ID] = true
	}
	return nil
}

// Manager subscribes to engines' KV event streams and hands ordered batches to a
// Sink. It owns a worker registry (static workers, the workers file, AddWorker and
// workers discovered on the bind socket or NATS) and, while Run runs, one goroutine
// per socket (receive + decode) and one per stream (sequence tracking, replay,
// block keys, Submit).
//
// Every method is safe for concurrent use. Run may be called again after it
// returned (a node that regains Raft leadership); Close releases the ZMQ context
// once no Run is running.
type Manager struct {
	cfg     ManagerConfig
	log     *slog.Logger
	badLog  *rateLimitedLog
	metrics *metrics
	zs      *sockets

	// change serialises registry changes (AddWorker, RemoveWorker, file reloads,
	// discovery, the start and end of Run), including the wait for a removed
	// worker's goroutines. A channel so that discovery can give up when its run ends.
	change chan struct{}

	mu       sync.Mutex
	workers  map[string]*workerEntry // guarded by mu
	byTopic  map[string]string       // guarded by mu: non-empty workerspec.Spec.Topic -> worker id
	run      *run                    // guarded by mu; nil when not running
	bindAddr string                  // guarded by mu: ServeBind's endpoint while it runs
	binding  bool                    // guarded by mu: ServeBind runs
	closed   bool                    // guarded by mu
	fileData []byte                  // guarded by change: the workers file as last applied
}

type workerEntry struct {
	spec   workerspec.Spec
	source WorkerSource
}

// NewManager checks cfg, reads the workers file once (an unreadable or invalid file
// is an error here, and only logged on later reloads) and registers the ingest
// metrics on reg (none when nil).
func NewManager(cfg ManagerConfig, logger *slog.Logger, reg prometheus.Registerer) (*Manager, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	met, err := newMetrics(reg)
	if err != nil {
		return nil, err
	}
	m := &Manager{
		cfg:     cfg,
		log:     logger,
		badLog:  newRateLimitedLog(logger, cfg.BadInputLogInterval),
		metrics: met,
		change:  make(chan struct{}, 1),
		workers: map[string]*workerEntry{},
		byTopic: map[string]string{},
	}
	for _, w := range cfg.Workers {
		m.setEntry(w, SourceFlag)
	}
	if cfg.WorkersFile != "" {
		data, err := os.ReadFile(cfg.WorkersFile)
		if err != nil {
			return nil, fmt.Errorf("%w: --workers-file: %w", ErrInvalidConfig, err)
		}
		specs, err := workerspec.ParseFile(data)
		if err != nil {
			return nil, fmt.Errorf("%w: --workers-file %s: %w", ErrInvalidConfig, cfg.WorkersFile, err)
		}
		m.fileData = data
		for _, w := range specs {
			if _, taken := m.workers[w.ID]; taken {
				m.log.Warn("workers file entry ignored: the id is given by --worker", "worker", w.ID)
				continue
			}
			m.setEntry(w, SourceFile)
		}
	}
	m.updateWorkerGauge()
	zctx, err := zmq.NewContext()
	if err != nil {
		return nil, fmt.Errorf("ingest: zmq context: %w", err)
	}
	m.zs = &sockets{zctx: zctx, hardMaxFrame: hardMaxFrame(cfg.MaxFrameBytes), pollInterval: cfg.PollInterval, badLog: m.badLog}
	return m, nil
}

// Close releases the Manager's ZMQ context. It fails with ErrRunning while Run
// or ServeBind runs.
func (m *Manager) Close() error {
	m.mu.Lock()
	if m.run != nil || m.binding {
		m.mu.Unlock()
		return ErrRunning
	}
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	m.mu.Unlock()
	return m.zs.zctx.Term()
}

func (m *Manager) lockChange(ctx context.Context) bool {
	select {
	case m.change <- struct{}{}:
		return true
	case <-ctx.Done():
		return false
	}
}

func (m *Manager) unlockChange() { <-m.change }

// AddWorker registers spec (source "registry"), replacing a registry, file or
// discovered entry with the same id, and subscribes to it at once when Run runs.
// A worker given by --worker cannot be replaced (ErrWorkerConflict).
func (m *Manager) AddWorker(spec workerspec.Spec) error {
	if err := spec.Validate(); err != nil {
		return err
	}
	m.lockChange(context.Background())
	defer m.unlockChange()
	return m.putWorker(spec, SourceRegistry)
}

// putWorker registers spec and (re)starts it in the running run; callers hold change.
func (m *Manager) putWorker(spec workerspec.Spec, source WorkerSource) error {
	m.mu.Lock()
	old := m.workers[spec.ID]
	if old != nil && sourceRank(old.source) > sourceRank(source) {
		m.mu.Unlock()
		return fmt.Errorf("%w: %q is given by %s", ErrWorkerConflict, spec.ID, old.source)
	}
	m.setEntry(spec, source)
	r := m.run
	m.mu.Unlock()
	m.updateWorkerGauge()
	if old != nil && old.spec.Equal(spec) {
		return nil
	}
	m.log.Info("worker registered", "worker", spec.ID, "source", source, "spec", spec.String())
	if r != nil {
		// The new streams continue from the stopped ones' positions, not from
		// the index's cursors, which lag them (see streamRunner.inherit).
		r.startWorker(spec, source, r.stopWorker(spec.ID))
	}
	return nil
}

// RemoveWorker unregisters a worker: its subscriptions stop, and when Run runs
// and the sink is a WorkerRemover, its blocks leave the index. An unknown id is a
// no-op.
func (m *Manager) RemoveWorker(id string) {
	m.lockChange(context.Background())
	defer m.unlockChange()
	m.removeWorker(id)
}

// removeWorker is RemoveWorker for callers holding change.
func (m *Manager) removeWorker(id string) {
	m.mu.Lock()
	_, known := m.workers[id]
	m.deleteEntry(id)
	r := m.run
	m.mu.Unlock()
	if r != nil {
		r.stopWorker(id)
		if rm, ok := r.sink.(WorkerRemover); ok {
			if err := rm.RemoveWorker(r.ctx, id); err != nil && r.ctx.Err() == nil {
				m.log.Error("removing worker's blocks failed", "worker", id, "err", err)
			}
		}
	}
	m.metrics.forgetWorker(id)
	m.updateWorkerGauge()
	if known {
		m.log.Info("worker removed", "worker", id)
	}
}

// setEntry registers spec; callers hold mu (or own m exclusively).
func (m *Manager) setEntry(spec workerspec.Spec, source WorkerSource) {
	m.deleteEntry(spec.ID)
	m.workers[spec.ID] = &workerEntry{spec: spec, source: source}
	if spec.Topic != "" {
		m.byTopic[spec.Topic] = spec.ID
	}
}

// admitDiscovered says whether discovery may add worker id, and if not the
// reason (a decode_errors label) and why; callers hold mu.
func (m *Manager) admitDiscovered(id string) (reason string, err error) {
	if len(m.cfg.DiscoverAllow) > 0 && !matchAny(m.cfg.DiscoverAllow, id) {
		return "not_allowed", fmt.Errorf("worker id %q matches no --discover-allow pattern %q", id, m.cfg.DiscoverAllow)
	}
	n := 0
	for _, e := range m.workers {
		if e.source == SourceDiscover || e.source == SourceRegistry {
			n++
		}
	}
	if n >= m.cfg.MaxDiscoveredWorkers {
		return "discovery_limit", fmt.Errorf("%d discovered and registered workers, the --max-discovered-workers limit", n)
	}
	return "", nil
}

// matchAny reports whether s matches one of the path.Match patterns.
func matchAny(patterns []string, s string) bool {
	for _, p := range patterns {
		if ok, _ := path.Match(p, s); ok {
			return true
		}
	}
	return false
}

// deleteEntry unregisters a worker; callers hold mu.
func (m *Manager) deleteEntry(id string) {
	if e := m.workers[id]; e != nil && m.byTopic[e.spec.Topic] == id {
		delete(m.byTopic, e.spec.Topic)
	}
	delete(m.workers, id)
}

func (m *Manager) updateWorkerGauge() {
	counts := map[WorkerSource]int{SourceFlag: 0, SourceRegistry: 0, SourceFile: 0, SourceDiscover: 0}
	m.mu.Lock()
	for _, e := range m.workers {
		counts[e.source]++
	}
	m.mu.Unlock()
	for s, n := range counts {
		m.metrics.workers.WithLabelValues(string(s)).Set(float64(n))
	}
}

// WorkerStatus is a registered worker and, while Run runs, its streams.
type WorkerStatus struct {
	Spec    workerspec.Spec
	Source  WorkerSource
	Streams []StreamStatus // by dp rank; empty when not running or nothing received yet
}

// Workers lists the registered workers, ordered by id.
func (m *Manager) Workers() []WorkerStatus {
	m.mu.Lock()
	out := make([]WorkerStatus, 0, len(m.workers))
	for _, e := range m.workers {
		out = append(out, WorkerStatus{Spec: e.spec, Source: e.source})
	}
	r := m.run
	m.mu.Unlock()
	slices.SortFunc(out, func(a, b WorkerStatus) int { return strings.Compare(a.Spec.ID, b.Spec.ID) })
	if r != nil {
		for i := range out {
			out[i].Streams = r.streamStatus(out[i].Spec.ID)
		}
	}
	return out
}

// Running reports whether Run is running and has set up its sockets.
func (m *Manager) Running() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.run != nil && m.run.ready
}

// BindEndpoint is the bind-mode socket's actual endpoint while ServeBind runs ("" otherwise).
func (m *Manager) BindEndpoint() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.bindAddr
}

// Run subscribes to every registered worker (and NATS; ServeBind and
// FrameInputs hand it bind-mode frames while it runs), resumes each stream
// after cursors.Cursor(stream) (replaying from Seq+1 when the engine's replay
// buffer still has it), submits ordered StreamBatches to sink, and returns
// when ctx ends, after closing every socket and stopping every goroutine it
// started. It returns an error when it cannot start (NATS connection failure) or
// when sink.Submit fails for another reason than ctx ending.
func (m *Manager) Run(ctx context.Context, sink Sink, cursors CursorSource) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	r := &run{m: m, ctx: ctx, cancel: cancel, sink: sink, workers: map[string]*workerRun{}}
	r.env = &streamEnv{
		sink:          sink,
		cursors:       cursors,
		metrics:       m.metrics,
		log:           m.log,
		badLog:        m.badLog,
		maxFrame:      m.cfg.MaxFrameBytes,
		restartWindow: m.cfg.RestartWindow,
		idleReplay:    m.cfg.IdleReplayInterval,
		newReplayer:   m.newReplayer,
	}
	m.lockChange(context.Background())
	m.mu.Lock()
	switch {
	case m.closed:
		m.mu.Unlock()
		m.unlockChange()
		return ErrClosed
	case m.run != nil:
		m.mu.Unlock()
		m.unlockChange()
		return ErrRunning
	}
	m.run = r
	m.mu.Unlock()
	err := r.start()
	if err == nil {
		m.mu.Lock()
		r.ready = true
		m.mu.Unlock()
	}
	m.unlockChange()
	if err == nil {
		<-ctx.Done()
	}
	cancel(nil)
	m.lockChange(context.Background())
	m.mu.Lock()
	m.run = nil
	m.mu.Unlock()
	r.wg.Wait()
	m.unlockChange()
	if err != nil {
		return err
	}
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) && !errors.Is(cause, context.DeadlineExceeded) {
		return cause
	}
	return nil
}

func (m *Manager) newReplayer() *replayer {
	return &replayer{
		zctx:         m.zs.zctx,
		timeout:      m.cfg.ReplayTimeout,
		pollInterval: m.cfg.PollInterval,
		hardMaxFrame: m.zs.hardMaxFrame,
		backoffMin:   m.cfg.ReplayTimeout,
		backoffMax:   max(m.cfg.ReplayBackoffMax, m.cfg.ReplayTimeout),
	}
}

// run is the state of one Run call.
type run struct {
	m      *Manager
	ctx    context.Context
	cancel context.CancelCauseFunc
	sink   Sink
	env    *streamEnv
	wg     sync.WaitGroup
	ready  bool // guarded by m.mu

	mu      sync.Mutex
	workers map[string]*workerRun // guarded by mu
}

// workerRun is one worker's goroutines within a run.
type workerRun struct {
	spec   workerspec.Spec
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	source WorkerSource
	// ranks bounds the dp ranks that bind mode and NATS may start streams for
	// (see rankLimit).
	ranks uint32

	mu      sync.Mutex
	streams map[uint32]*streamRunner // guarded by mu
	// prev holds where the streams of the worker's previous spec stopped, by
	// dp rank, until the rank's new runner inherits it.
	prev map[uint32]streamPosition // guarded by mu
}

// rankLimit is the number of dp ranks a worker of source may have streams for:
// a declared worker's dp-size, and MaxDiscoveredDPRanks for a discovered one,
// whose ranks come from its batches. Anyone who can publish can name ranks,
// and every stream costs a goroutine, a queue and an index holder on every
// replica.
func (m *Manager) rankLimit(spec workerspec.Spec, source WorkerSource) uint32 {
	if source == SourceDiscover {
		return uint32(m.cfg.MaxDiscoveredDPRanks)
	}
	return spec.Ranks()
}

// start opens the shared sockets and starts every registered worker; callers hold
// change.
func (r *run) start() error {
	m := r.m
	if m.cfg.WorkersFile != "" {
		m.reloadWorkersFile()
		r.goRun(r.watchWorkersFile)
	}
	if m.cfg.Transport == TransportNATS {
		sub, err := r.subscribeNATS()
		if err != nil {
			return err
		}
		r.goRun(func() { r.natsLoop(sub) })
	}
	m.mu.Lock()
	entries := make([]workerEntry, 0, len(m.workers))
	for _, e := range m.workers {
		entries = append(entries, *e)
	}
	m.mu.Unlock()
	for _, e := range entries {
		r.mu.Lock()
		_, running := r.workers[e.spec.ID] // started by the workers file reload above
		r.mu.Unlock()
		if !running {
			r.startWorker(e.spec, e.source, nil)
		}
	}
	return nil
}

func (r *run) goRun(f func()) {
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		f()
	}()
}

// fail ends the run with err.
func (r *run) fail(err error) {
	r.m.log.Error("ingest stopped", "err", err)
	r.cancel(err)
}

// startWorker starts a worker's goroutines: in connect mode one socket and one
// stream goroutine per dp rank; otherwise streams start as their batches arrive.
// prev is where the streams of its previous spec stopped, which its streams
// take over (stopWorker). Callers hold change.
func (r *run) startWorker(spec workerspec.Spec, source WorkerSource, prev map[uint32]streamPosition) *workerRun {
	ctx, cancel := context.WithCancel(r.ctx)
	wr := &workerRun{spec: spec, ctx: ctx, cancel: cancel, source: source, ranks: r.m.rankLimit(spec, source),
		streams: map[uint32]*streamRunner{}, prev: prev}
	r.mu.Lock()
	r.workers[spec.ID] = wr
	r.mu.Unlock()
	if spec.Endpoint == "" || r.m.cfg.Transport != TransportZMQ {
		if spec.Replay != "" {
			// Streams with a known replay endpoint start now, to catch up
			// before their engine publishes again.
			for rank := range spec.Ranks() {
				r.stream(wr, rank)
			}
		}
		return wr
	}
	for rank := range spec.Ranks() {
		endpoint, _ := spec.EventEndpoint(rank) // validated
		sr := r.stream(wr, rank)
		if sr == nil {
			continue
		}
		r.goWorker(wr, func() { r.connectLoop(wr.ctx, endpoint, spec.Topic, sr) })
	}
	return wr
}

func (r *run) goWorker(wr *workerRun, f func()) {
	r.wg.Add(1)
	wr.wg.Add(1)
	go func() {
		defer r.wg.Done()
		defer wr.wg.Done()
		f()
	}()
}

// stream returns the runner of wr's rank, starting it if needed; nil when the
// worker is stopping or the spec is unusable (logged).
func (r *run) stream(wr *workerRun, rank uint32) *streamRunner {
	wr.mu.Lock()
	defer wr.mu.Unlock()
	if sr := wr.streams[rank]; sr != nil {
		return sr
	}
	if wr.ctx.Err() != nil {
		return nil
	}
	key := Stream{Worker: wr.spec.ID, DPRank: rank}
	sr, err := newStreamRunner(key, wr.spec, r.m.cfg.DefaultBlockSize, r.env)
	if err != nil {
		r.m.badLog.Warn("stream/"+wr.spec.ID, "cannot follow stream", "worker", wr.spec.ID, "dp_rank", rank, "err", err)
		return nil
	}
	if pos, ok := wr.prev[rank]; ok {
		sr.inherit(pos)
		delete(wr.prev, rank)
	}
	wr.streams[rank] = sr
	r.goWorker(wr, func() {
		if err := sr.run(wr.ctx); err != nil {
			r.fail(fmt.Errorf("worker %s dp rank %d: %w", key.Worker, key.DPRank, err))
		}
	})
	return sr
}

// stopWorker stops a worker's goroutines, waits for them and returns where
// its streams stopped, by dp rank (with what its previous spec left that no
// stream inherited), for the streams of a new spec to take over; callers hold
// change.
func (r *run) stopWorker(id string) map[uint32]streamPosition {
	r.mu.Lock()
	wr := r.workers[id]
	delete(r.workers, id)
	r.mu.Unlock()
	if wr == nil {
		return nil
	}
	// Cancelled under mu, so stream() cannot start a goroutine (wg.Add) once
	// Wait may have begun.
	wr.mu.Lock()
	wr.cancel()
	wr.mu.Unlock()
	wr.wg.Wait()
	wr.mu.Lock()
	defer wr.mu.Unlock()
	stopped := wr.prev
	if stopped == nil {
		stopped = map[uint32]streamPosition{}
	}
	for rank, sr := range wr.streams {
		stopped[rank] = sr.position() // its goroutine has ended (wg.Wait)
	}
	return stopped
}

func (r *run) streamStatus(id string) []StreamStatus {
	r.mu.Lock()
	wr := r.workers[id]
	r.mu.Unlock()
	if wr == nil {
		return nil
	}
	wr.mu.Lock()
	runners := make([]*streamRunner, 0, len(wr.streams))
	for _, sr := range wr.streams {
		runners = append(runners, sr)
	}
	wr.mu.Unlock()
	out := make([]StreamStatus, len(runners))
	for i, sr := range runners {
		out[i] = sr.Status()
	}
	slices.SortFunc(out, func(a, b StreamStatus) int { return int(a.DPRank) - int(b.DPRank) })
	return out
}

// dispatcher routes batches from a shared socket (bind mode, NATS) to their
// streams, creating workers seen for the first time. It belongs to the socket's
// goroutine.
type dispatcher struct {
	r      *run
	source string
	cache  map[Stream]*streamRunner
	// patternReplay: workers discovered here get their replay endpoint from
	// ManagerConfig.BindReplayPattern (bind mode; NATS announces its own).
	patternReplay bool
}

func (r *run) newDispatcher(source string) *dispatcher {
	return &dispatcher{r: r, source: source, cache: map[Stream]*streamRunner{}}
}

// deliver hands it to the stream (worker, rank), registering the worker as
// discovered (with model) when it is unknown. It returns false when ctx ended.
func (d *dispatcher) deliver(worker, model string, rank uint32, it item) bool {
	key := Stream{Worker: worker, DPRank: rank}
	for attempt := 0; attempt < 2; attempt++ {
		sr := d.cache[key]
		if sr == nil {
			if sr = d.resolve(key, model); sr == nil {
				return d.r.ctx.Err() == nil
			}
			d.cache[key] = sr
		}
		select {
		case sr.in <- it:
			return true
		case <-sr.done: // the worker was removed or replaced: look it up again
			delete(d.cache, key)
		case <-d.r.ctx.Done():
			return false
		}
	}
	return d.r.ctx.Err() == nil
}

func (d *dispatcher) resolve(key Stream, model string) *streamRunner {
	r := d.r
	r.mu.Lock()
	wr := r.workers[key.Worker]
	r.mu.Unlock()
	if wr == nil {
		if model == "" {
			r.m.metrics.decodeErrors.WithLabelValues(d.source, "unknown_model").Inc()
			r.m.badLog.Warn(d.source+"/unknown_model", "dropping batch of an unknown worker that names no model", "worker", key.Worker)
			return nil
		}
		spec := workerspec.Spec{ID: key.Worker, Model: model}
		if d.patternReplay {
			spec.Replay = r.m.patternReplay(d.source, key.Worker)
		}
		if err := spec.Validate(); err != nil {
			r.m.metrics.decodeErrors.WithLabelValues(d.source, "bad_worker").Inc()
			r.m.badLog.Warn(d.source+"/bad_worker", "dropping batch of an unusable worker", "err", err)
			return nil
		}
		if !r.m.lockChange(r.ctx) {
			return nil
		}
		r.mu.Lock()
		wr = r.workers[key.Worker]
		r.mu.Unlock()
		if wr == nil {
			r.m.mu.Lock()
			if _, registered := r.m.workers[key.Worker]; !registered {
				if reason, err := r.m.admitDiscovered(key.Worker); err != nil {
					r.m.mu.Unlock()
					r.m.unlockChange()
					r.m.metrics.decodeErrors.WithLabelValues(d.source, reason).Inc()
					r.m.badLog.Warn(d.source+"/"+reason, "dropping batch of a new worker", "worker", key.Worker, "err", err)
					return nil
				}
				r.m.setEntry(spec, SourceDiscover)
			}
			entry := r.m.workers[key.Worker]
			r.m.mu.Unlock()
			r.m.updateWorkerGauge()
			r.m.log.Info("worker discovered", "worker", key.Worker, "model", model, "via", d.source)
			wr = r.startWorker(entry.spec, entry.source, nil)
		}
		r.m.unlockChange()
	}
	if key.DPRank >= wr.ranks {
		reason, why := "dp_size", "dropping batch of a dp rank beyond the worker's dp-size (register it with its dp-size)"
		if wr.source == SourceDiscover {
			reason, why = "rank_limit", "dropping batch of a discovered worker's dp rank beyond --max-discovered-dp-ranks"
		}
		r.m.metrics.decodeErrors.WithLabelValues(d.source, reason).Inc()
		r.m.badLog.Warn(d.source+"/"+reason, why, "worker", key.Worker, "dp_rank", key.DPRank, "ranks", wr.ranks)
		return nil
	}
	return r.stream(wr, key.DPRank)
}

// watchWorkersFile re-reads the workers file whenever its content changes.
func (r *run) watchWorkersFile() {
	t := time.NewTicker(r.m.cfg.WorkersFilePoll)
	defer t.Stop()
	for {
		select {
		case <-r.ctx.Done():
			return
		case <-t.C:
		}
		if !r.m.lockChange(r.ctx) {
			return
		}
		r.m.reloadWorkersFile()
		r.m.unlockChange()
	}
}

// reloadWorkersFile applies the workers file's content if it changed since last
// applied: file workers that left it are removed, new and changed ones (re)started.
// A file that cannot be read or parsed is logged and the workers stay as they are.
// Callers hold change.
func (m *Manager) reloadWorkersFile() {
	data, err := os.ReadFile(m.cfg.WorkersFile)
	if err != nil {
		m.badLog.Warn("workers-file", "cannot read the workers file; keeping the current workers", "path", m.cfg.WorkersFile, "err", err)
		return
	}
	if bytes.Equal(data, m.fileData) {
		return
	}
	specs, err := workerspec.ParseFile(data)
	if err != nil {
		m.badLog.Warn("workers-file", "invalid workers file; keeping the current workers", "path", m.cfg.WorkersFile, "err", err)
		return
	}
	m.fileData = data
	m.log.Info("workers file changed", "path", m.cfg.WorkersFile, "workers", len(specs))
	want := map[string]bool{}
	for _, w := range specs {
		want[w.ID] = true
	}
	m.mu.Lock()
	var gone []string
	for id, e := range m.workers {
		if e.source == SourceFile && !want[id] {
			gone = append(gone, id)
		}
	}
	m.mu.Unlock()
	for _, id := range gone {
		m.removeWorker(id)
	}
	for _, w := range specs {
		if err := m.putWorker(w, SourceFile); err != nil {
			m.log.Warn("workers file entry ignored", "worker", w.ID, "err", err)
		}
	}
}
