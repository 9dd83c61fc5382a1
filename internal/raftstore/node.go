package raftstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	"go.etcd.io/bbolt"

	"github.com/kvindex/kvindex/internal/ingest"
	"github.com/kvindex/kvindex/internal/radix"
	"github.com/kvindex/kvindex/internal/workerspec"
)

// ErrNotLeader: the operation needs the leader and this node is not it (or not
// yet: a new leader accepts batches only once its barrier has committed). It
// comes as a *NotLeaderError naming the leader when one is known, so the caller
// can forward.
var ErrNotLeader = errors.New("raftstore: not the leader")

// ErrShutdown: the node is shut down.
var ErrShutdown = errors.New("raftstore: node shut down")

// NotLeaderError is returned where the leader is needed. errors.Is(err,
// ErrNotLeader) holds; Cause, when set, says why (e.g. ErrSessionEnded).
type NotLeaderError struct {
	LeaderID       string // empty when no leader is known
	LeaderAddr     string // raft address
	LeaderGRPCAddr string // empty when the leader never published it
	Cause          error
}

func (e *NotLeaderError) Error() string {
	msg := "raftstore: not the leader"
	if e.LeaderID != "" {
		msg += fmt.Sprintf(" (leader is %s at %s)", e.LeaderID, cmp.Or(e.LeaderGRPCAddr, e.LeaderAddr))
	} else {
		msg += " (no leader known)"
	}
	if e.Cause != nil {
		msg += ": " + e.Cause.Error()
	}
	return msg
}

func (e *NotLeaderError) Is(target error) bool { return target == ErrNotLeader }
func (e *NotLeaderError) Unwrap() error        { return e.Cause }

// Node is one member of the replicated index: a raft node whose state machine is
// an ingest.Applier over a radix.Index plus the worker registry. See the package
// documentation for what it guarantees.
type Node struct {
	cfg       Config
	log       *slog.Logger
	applier   *ingest.Applier
	fsm       *fsm
	metrics   *metrics
	raft      *raft.Raft
	transport *raft.NetworkTransport
	store     *raftboltdb.BoltStore
	logs      raft.LogStore // store, behind the log cache when there is one
	inertTail atomic.Pointer[inertTail]
	snapshots *raft.FileSnapshotStore
	started   time.Time // when NewNode was called: the contact gauge's origin before any leader is heard

	sessMu      sync.Mutex
	sess        *session      // open session, nil when not leading; guarded by sessMu
	sessChanged chan struct{} // closed and replaced when sess changes; guarded by sessMu

	closing     chan struct{} // closed when shutdown starts
	raftStopped chan struct{} // closed when raft has shut down
	loopDone    chan struct{} // closed when leaderLoop has returned
	stopped     chan struct{} // closed when shutdown is complete
	// ctx ends when shutdown starts; the node's own waits on raft futures use it,
	// because raft leaves some futures unanswered when it shuts down.
	ctx       context.Context
	cancel    context.CancelFunc
	closeOnce sync.Once
	closeErr  error
}

// raftDB is the bolt file holding the raft log and stable store in DataDir.
const raftDB = "raft.db"

// boltLockTimeout bounds the wait for bolt's file lock on raftDB: it is held by
// whichever process has the data dir open, and bolt would wait for it forever.
const boltLockTimeout = 2 * time.Second

// ErrDataDirInUse: another process (or another Node of this one) holds the data
// dir's raft log open.
var ErrDataDirInUse = errors.New("raftstore: data dir in use")

func openBoltStore(dataDir string) (*raftboltdb.BoltStore, error) {
	path := filepath.Join(dataDir, raftDB)
	opts := *bbolt.DefaultOptions
	opts.Timeout = boltLockTimeout
	store, err := raftboltdb.New(raftboltdb.Options{Path: path, BoltOptions: &opts})
	if errors.Is(err, bbolt.ErrTimeout) {
		return nil, fmt.Errorf("%w: %s is locked after %v: is data dir %s in use by another process?",
			ErrDataDirInUse, path, boltLockTimeout, dataDir)
	}
	if err != nil {
		return nil, fmt.Errorf("raftstore: opening %s: %w", path, err)
	}
	return store, nil
}

// NewNode opens (or creates) the node's state in cfg.DataDir and starts raft. A
// node whose DataDir holds state resumes from it (latest snapshot, then the log);
// a new node with cfg.Bootstrap starts a cluster of itself, one without waits to
// be added by a leader (Join).
func NewNode(cfg Config) (_ *Node, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	n := &Node{
		cfg: cfg, log: log, metrics: newMetrics(), started: time.Now(),
		sessChanged: make(chan struct{}), closing: make(chan struct{}), raftStopped: make(chan struct{}), loopDone: make(chan struct{}),
		stopped: make(chan struct{}),
	}
	n.ctx, n.cancel = context.WithCancel(context.Background())
	if cfg.Registerer != nil {
		if err := n.metrics.register(cfg.Registerer); err != nil {
			return nil, err
		}
	}
	var closers []io.Closer
	defer func() {
		if err != nil {
			for _, c := range slices.Backward(closers) {
				c.Close()
			}
		}
	}()
	if err := os.MkdirAll(cfg.DataDir, 0o750); err != nil {
		return nil, fmt.Errorf("raftstore: data dir: %w", err)
	}
	n.store, err = openBoltStore(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	closers = append(closers, n.store)
	n.logs = n.store
	if cfg.LogCacheSize > 0 {
		if n.logs, err = raft.NewLogCache(cfg.LogCacheSize, n.store); err != nil {
			return nil, fmt.Errorf("raftstore: log cache: %w", err)
		}
	}
	n.snapshots, err = raft.NewFileSnapshotStoreWithLogger(cfg.DataDir, cfg.SnapshotRetain, newHCLogger(log, "raft-snapshots"))
	if err != nil {
		return nil, fmt.Errorf("raftstore: snapshot store: %w", err)
	}
	layer := cfg.StreamLayer
	if layer == nil {
		if layer, err = NewTCPStreamLayer(cfg.RaftAddr, cfg.RaftAdvertise); err != nil {
			return nil, err
		}
	}
	n.transport = raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
		Stream: layer, MaxPool: cfg.TransportMaxPool, Timeout: cfg.TransportTimeout,
		Logger: newHCLogger(log, "raft-net"),
	})
	closers = append(closers, n.transport)

	n.applier = ingest.NewApplier(radix.New(cfg.Index))
	n.fsm = newFSM(n.applier, log, n.metrics, cfg.OnWorkersChanged, cfg.OnBatch)
	n.fsm.beforeBatch, n.fsm.onRemoved, n.fsm.onDead, n.fsm.afterEntry = cfg.BeforeBatch, cfg.OnWorkerRemoved, cfg.OnWorkerDead, cfg.AfterEntry
	rc := cfg.raftConfig()
	rc.Logger = newHCLogger(log, "raft")
	hasState, err := raft.HasExistingState(n.logs, n.store, n.snapshots)
	if err != nil {
		return nil, fmt.Errorf("raftstore: reading raft state: %w", err)
	}
	n.raft, err = raft.NewRaft(rc, n.fsm, n.logs, n.store, n.snapshots, n.transport)
	if err != nil {
		return nil, fmt.Errorf("raftstore: starting raft: %w", err)
	}
	if cfg.Registerer != nil {
		// Registered once raft exists: the collector reads it on every scrape.
		if err := cfg.Registerer.Register(newStateCollector(n)); err != nil {
			n.raft.Shutdown().Error() // before the deferred closes pull the store from under it
			return nil, fmt.Errorf("raftstore: registering raft state metrics: %w", err)
		}
	}
	if cfg.Bootstrap && !hasState {
		if err := n.Bootstrap(context.Background()); err != nil && !errors.Is(err, ErrHasState) {
			n.raft.Shutdown()
			return nil, err
		}
	}
	log.Info("raft node started", "raft_addr", n.transport.LocalAddr(), "data_dir", cfg.DataDir,
		"resumed", hasState, "bootstrap", cfg.Bootstrap && !hasState)
	go n.leaderLoop()
	go func() {
		select {
		case <-n.fsm.stopped:
			n.stop(false)
		case <-n.closing:
		}
	}()
	return n, nil
}

// leaderPoll is how often the leader loop checks state it has no event for (a term
// change between two LeaderCh signals, a lost leadership whose signal was merged).
const leaderPoll = 50 * time.Millisecond

// leaderLoop opens a session each time this node leads and closes it when that ends.
func (n *Node) leaderLoop() {
	defer close(n.loopDone)
	tick := time.NewTicker(leaderPoll)
	defer tick.Stop()
	for {
		for n.raft.State() != raft.Leader {
			select {
			case <-n.raft.LeaderCh():
			case <-tick.C:
			case <-n.closing:
				return
			}
		}
		term := n.raft.CurrentTerm()
		start := time.Now()
		if err := n.await(n.ctx, n.raft.Barrier(0)); err != nil {
			n.log.Warn("leader barrier failed", "term", term, "err", err)
			select {
			case <-tick.C:
			case <-n.closing:
				return
			}
			continue
		}
		if n.raft.State() != raft.Leader || n.raft.CurrentTerm() != term {
			continue
		}
		s := newSession(n, term)
		// Counted before the session is published: a node that IsLeader has
		// counted it.
		n.metrics.leaderSessions.Inc()
		n.setSession(s)
		n.log.Info("leading: accepting stream batches", "term", term, "barrier", time.Since(start),
			"applied_index", n.AppliedIndex())
		n.publishOwnAddr(s.ctx)
		cause := n.awaitSessionEnd(s)
		n.setSession(nil)
		n.log.Info("stopped leading", "term", term, "cause", cause)
		s.close(cause)
	}
}

func (n *Node) awaitSessionEnd(s *session) error {
	tick := time.NewTicker(leaderPoll)
	defer tick.Stop()
	for {
		select {
		case <-n.raft.LeaderCh():
		case <-tick.C:
		case <-s.ctx.Done():
			return context.Cause(s.ctx)
		case <-n.closing:
			return ErrShutdown
		}
		if n.raft.State() != raft.Leader {
			return errors.New("leadership lost")
		}
		if t := n.raft.CurrentTerm(); t != s.term {
			return fmt.Errorf("term changed from %d to %d", s.term, t)
		}
	}
}

// publishOwnAddr records this node's gRPC address in the replicated member table
// when it is missing or stale (a node cannot write it before it is a leader).
func (n *Node) publishOwnAddr(ctx context.Context) {
	if n.cfg.GRPCAddr == "" || n.fsm.memberAddrs()[n.cfg.NodeID] == n.cfg.GRPCAddr {
		return
	}
	e := Entry{Type: EntryMemberAddr, ID: n.cfg.NodeID, GRPCAddr: n.cfg.GRPCAddr}
	if _, _, err := n.proposeEntry(ctx, &e); err != nil {
		n.log.Warn("publishing own gRPC address", "err", err)
	}
}

func (n *Node) setSession(s *session) {
	n.sessMu.Lock()
	n.sess = s
	close(n.sessChanged)
	n.sessChanged = make(chan struct{})
	n.sessMu.Unlock()
}

func (n *Node) session() (*session, <-chan struct{}) {
	n.sessMu.Lock()
	defer n.sessMu.Unlock()
	return n.sess, n.sessChanged
}

// Submit proposes b to the replicated log (ingest.Sink). It returns once b is in
// the entry being filled, not when it is committed: a proposal that fails ends the
// leader session instead (see RunWhileLeader). With a RunWhileLeader context it
// belongs to that session and fails once the session ended; with any other
// context it joins the current session. Errors: a *NotLeaderError (ErrNotLeader),
// ctx.Err() while waiting for room, ErrInvalidBatch for a batch the log cannot carry.
func (n *Node) Submit(ctx context.Context, b ingest.StreamBatch) error {
	s := sessionOf(ctx)
	if s == nil {
		s, _ = n.session()
	}
	if s == nil || s.n != n {
		return n.notLeader(nil)
	}
	return s.submit(ctx, &b)
}

var _ ingest.Sink = (*Node)(nil)

// Flush waits until every batch submitted before the call (in ctx's session, or
// the current one) is applied on this node, proposing the entry being filled at
// once. Submit returns before its batch is even proposed, so a registry change
// or a read that must follow some batches waits for Flush first. Errors as Submit.
func (n *Node) Flush(ctx context.Context) error {
	s := sessionOf(ctx)
	if s == nil {
		s, _ = n.session()
	}
	if s == nil || s.n != n {
		return n.notLeader(nil)
	}
	return s.flush(ctx)
}

// restartPause is how long RunWhileLeader waits before running fn again when fn
// returned although leadership went on.
const restartPause = time.Second

// RunWhileLeader runs fn each time this node leads, until ctx ends. fn gets a
// context that ends when the leadership session ends (leadership lost, a proposal
// failed, shutdown) or ctx ends; fn must return soon after, since the next session
// (here or on another node) waits for it. When fn starts, every entry committed
// before is applied, so Applier().Cursor is where each stream resumes; Submit
// with fn's context. If fn returns while the session goes on, it is run again
// after a pause. RunWhileLeader returns when ctx ends or the node shuts down,
// after fn returned.
func (n *Node) RunWhileLeader(ctx context.Context, fn func(leaderCtx context.Context)) {
	for {
		s, changed := n.session()
		if s != nil && s.join() {
			lctx, cancel := context.WithCancelCause(s.ctx)
			stop := context.AfterFunc(ctx, func() { cancel(context.Cause(ctx)) })
			fn(lctx)
			stop()
			cancel(nil)
			s.fns.Done()
			select {
			case <-s.ctx.Done():
			case <-ctx.Done():
				return
			case <-time.After(restartPause):
			}
			continue
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return
		case <-n.closing:
			return
		}
	}
}

// Applier is the state machine's applier: its Cursor is the ingest.CursorSource a
// leader's ingest resumes from. Apply on it only through the log.
func (n *Node) Applier() *ingest.Applier { return n.applier }

// IndexCopy copies the index between two applied entries and returns the copy
// with the applied index it is the state of (dumps, digests). Apply waits for
// the copy, as it would for radix's own read lock; whatever is done with the
// copy afterwards holds no lock.
func (n *Node) IndexCopy() (*radix.Snapshot, uint64) {
	n.fsm.applying.RLock()
	defer n.fsm.applying.RUnlock()
	return n.Index().Snapshot(), n.AppliedIndex()
}

// Index is the replicated index, for local reads.
func (n *Node) Index() *radix.Index { return n.applier.Index() }

// ID is this node's id.
func (n *Node) ID() string { return n.cfg.NodeID }

// RaftAddr is the raft address this node advertises.
func (n *Node) RaftAddr() string { return string(n.transport.LocalAddr()) }

// IsLeader reports whether this node leads and accepts stream batches (its
// leader barrier has committed).
func (n *Node) IsLeader() bool {
	s, _ := n.session()
	return s != nil && s.ctx.Err() == nil && n.raft.State() == raft.Leader
}

// Leader returns the leader's id and raft address, empty when none is known.
func (n *Node) Leader() (id, raftAddr string) {
	addr, lid := n.raft.LeaderWithID()
	return string(lid), string(addr)
}

func (n *Node) notLeader(cause error) error {
	e := &NotLeaderError{Cause: cause}
	e.LeaderID, e.LeaderAddr = n.Leader()
	if e.LeaderID != "" {
		e.LeaderGRPCAddr = n.fsm.memberAddrs()[e.LeaderID]
	}
	return e
}

// Err is why the node stopped on its own (ErrFSMStopped), or nil.
func (n *Node) Err() error { return n.fsm.err() }

// Done is closed when the node has shut down (Shutdown, or on its own: see Err).
func (n *Node) Done() <-chan struct{} { return n.stopped }

// AppliedIndex is the last log index applied on this node: Index() holds every
// entry up to it and none after.
//
// raft's own AppliedIndex is not that: raft counts an entry applied once it is
// queued for the FSM, before Apply has run. This node's FSM records the last
// command entry Apply returned from; raft's other entries (no-ops, barriers,
// configuration changes) never reach Apply and change nothing in the FSM, so the
// applied index extends over those of them that follow it, up to raft's.
func (n *Node) AppliedIndex() uint64 {
	applied, queued := n.fsm.lastIndex.Load(), n.raft.AppliedIndex()
	if applied >= queued {
		return applied
	}
	from := applied
	if t := n.inertTail.Load(); t != nil && t.applied == applied && t.through <= queued {
		if t.queued == queued && t.final {
			return t.through
		}
		from = t.through
	}
	t := n.scanInertTail(applied, from, queued)
	n.inertTail.Store(t)
	return t.through
}

// inertTail says that the log entries after applied up to through are not
// commands: applying them changed nothing in the FSM.
type inertTail struct {
	applied, queued, through uint64
	final                    bool // through is as far as the log allows up to queued
}

// maxInertScan bounds the log entries one AppliedIndex call reads: a longer run
// of non-command entries is gone through over several calls.
const maxInertScan = 64

// scanInertTail extends the run of non-command entries after from, up to queued.
// Entries before the log's first index were compacted after a snapshot that
// covers them, so the FSM holds them already.
func (n *Node) scanInertTail(applied, from, queued uint64) *inertTail {
	t := &inertTail{applied: applied, queued: queued, through: from}
	if first, err := n.logs.FirstIndex(); err == nil && first > t.through+1 {
		t.through = min(first-1, queued)
	}
	var l raft.Log
	for range maxInertScan {
		if t.through == queued {
			t.final = true
			return t
		}
		if err := n.logs.GetLog(t.through+1, &l); err != nil {
			return t
		}
		if l.Type == raft.LogCommand {
			t.final = true
			return t
		}
		t.through++
	}
	return t
}

// inertPoll is how often WaitApplied looks again when what it waits for may be
// only entries raft applies without the FSM, of which it hears nothing.
const inertPoll = 5 * time.Millisecond

// WaitApplied waits until this node has applied index (read-your-writes on any
// replica: pass the index a write returned).
func (n *Node) WaitApplied(ctx context.Context, index uint64) error {
	var poll *time.Ticker
	for {
		changed := n.fsm.appliedChanged()
		if n.AppliedIndex() >= index {
			return nil
		}
		if poll == nil {
			poll = time.NewTicker(inertPoll)
			defer poll.Stop()
		}
		select {
		case <-changed:
		case <-poll.C:
		case <-ctx.Done():
			return ctx.Err()
		case <-n.closing:
			return ErrShutdown
		}
	}
}

// LinearizableBarrier returns once this node's state reflects every write committed
// before the call, as proved by this node being the leader (raft's read-index:
// the commit index, then a heartbeat round confirming leadership, then waiting for
// apply). A local read after it is linearizable. Only the leader can do it.
func (n *Node) LinearizableBarrier(ctx context.Context) error {
	s, _ := n.session()
	if s == nil {
		return n.notLeader(nil)
	}
	// The session's barrier committed an entry of this term, so the commit index
	// covers everything committed before the call.
	readIndex := n.raft.CommitIndex()
	if err := n.await(ctx, n.raft.VerifyLeader()); err != nil {
		return err
	}
	return n.WaitApplied(ctx, readIndex)
}

// await waits for f, or ctx. Raft errors meaning this node no longer leads become
// a *NotLeaderError.
func (n *Node) await(ctx context.Context, f raft.Future) error {
	// The waiter below must end with the node even when ctx ends first and raft
	// never answers f (a VerifyLeader or Apply pending at shutdown).
	answerOnStop(f, n.raftStopped)
	done := make(chan error, 1)
	go func() { done <- f.Error() }()
	var err error
	select {
	case err = <-done:
	case <-ctx.Done():
		return ctx.Err()
	}
	switch {
	case err == nil:
		return nil
	case errors.Is(err, raft.ErrNotLeader), errors.Is(err, raft.ErrLeadershipLost),
		errors.Is(err, raft.ErrLeadershipTransferInProgress):
		return n.notLeader(err)
	case errors.Is(err, raft.ErrRaftShutdown):
		return fmt.Errorf("%w: %w", ErrShutdown, err)
	}
	return err
}

// proposeEntry appends e to the log on the leader and waits until it is applied
// here; it returns the FSM's result and the entry's index.
func (n *Node) proposeEntry(ctx context.Context, e *Entry) (ApplyResult, uint64, error) {
	if n.raft.State() != raft.Leader {
		return ApplyResult{}, 0, n.notLeader(nil)
	}
	data, err := EncodeEntry(nil, e)
	if err != nil {
		return ApplyResult{}, 0, err
	}
	// An entry every replica's decoder refuses must never reach the log: once
	// committed it stays there. Decoding it first makes sure, whatever the
	// encoder missed (admin entries are few and small; stream batches do not
	// come this way).
	if _, err := DecodeEntry(data); err != nil {
		return ApplyResult{}, 0, fmt.Errorf("%w: not proposing a %v entry the log would refuse: %w", ErrInvalidEntry, e.Type, err)
	}
	f := n.raft.Apply(data, 0)
	if err := n.await(ctx, f); err != nil {
		return ApplyResult{}, 0, err
	}
	r, _ := f.Response().(ApplyResult)
	return r, f.Index(), r.Err
}

// RegisterWorker adds w to the replicated registry (leader only) and returns the
// log index at which it was applied. w must pass ingest's WorkerSpec.Validate.
// Registering an id again with an equal spec succeeds; with another spec it fails
// with ErrWorkerExists.
func (n *Node) RegisterWorker(ctx context.Context, w workerspec.Spec) (uint64, error) {
	if err := w.Validate(); err != nil {
		return 0, err
	}
	if err := checkWorker(&w); err != nil {
		return 0, err
	}
	_, index, err := n.proposeEntry(ctx, &Entry{Type: EntryRegisterWorker, Worker: w})
	return index, err
}

// ReplaceWorker replaces the registered spec of w.ID with w if it is still
// expected, in one log entry (leader only): a compare-and-set, so that two
// callers extending the same worker (say, registering its dp ranks one by one)
// cannot undo each other. The worker's blocks stay. It fails with
// ErrWorkerChanged when another spec is registered (read it again and retry),
// ErrUnknownWorker when none is; replacing with the spec already registered
// succeeds.
func (n *Node) ReplaceWorker(ctx context.Context, expected, w workerspec.Spec) (uint64, error) {
	if err := w.Validate(); err != nil {
		return 0, err
	}
	_, index, err := n.proposeEntry(ctx, &Entry{Type: EntryReplaceWorker, Expected: expected, Worker: w})
	return index, err
}

// UnregisterWorker removes worker id from the registry and its blocks from the
// index, on every replica (leader only). Batches of the worker still in flight are
// dropped when they commit, even after the worker is registered again: its
// streams stay fenced until each starts afresh. Unknown ids fail with
// ErrUnknownWorker.
func (n *Node) UnregisterWorker(ctx context.Context, id string) (uint64, error) {
	_, index, err := n.proposeEntry(ctx, &Entry{Type: EntryUnregisterFenced, ID: id})
	return index, err
}

// MarkWorkerDead declares worker id dead (leader only): on every replica its
// blocks leave the index and its streams are fenced until each starts afresh
// (see dead.go). It returns the log index of the declaration; a worker already
// dead succeeds, an unknown one fails with ErrUnknownWorker.
func (n *Node) MarkWorkerDead(ctx context.Context, id string) (uint64, error) {
	_, index, err := n.proposeEntry(ctx, &Entry{Type: EntryWorkerDead, ID: id})
	return index, err
}

// MarkWorkerAlive ends worker id's death (leader only): its health endpoint
// answers again. A worker not dead succeeds, an unknown one fails with
// ErrUnknownWorker.
func (n *Node) MarkWorkerAlive(ctx context.Context, id string) (uint64, error) {
	_, index, err := n.proposeEntry(ctx, &Entry{Type: EntryWorkerAlive, ID: id})
	return index, err
}

// DeadWorkers returns the registered workers declared dead, each with the log
// index of its declaration, as this replica has applied them.
func (n *Node) DeadWorkers() map[string]uint64 { return n.fsm.Dead() }

// Workers returns the registry, sorted by id.
func (n *Node) Workers() []workerspec.Spec { return n.fsm.Workers() }

// Worker returns the registered worker id.
func (n *Node) Worker(id string) (workerspec.Spec, bool) { return n.fsm.Worker(id) }

// Snapshot takes a raft snapshot of this node now (compacting its log) and
// returns the log index it covers and its size in bytes. With nothing new since
// the last snapshot it returns that one.
func (n *Node) Snapshot(ctx context.Context) (index uint64, size int64, err error) {
	f := n.raft.Snapshot()
	err = n.await(ctx, f)
	if errors.Is(err, raft.ErrNothingNewToSnapshot) {
		metas, lerr := n.snapshots.List()
		if lerr != nil || len(metas) == 0 {
			return 0, 0, errors.Join(err, lerr)
		}
		return metas[0].Index, metas[0].Size, nil
	}
	if err != nil {
		return 0, 0, fmt.Errorf("raftstore: snapshot: %w", err)
	}
	meta, rc, err := f.Open()
	if err != nil {
		return 0, 0, fmt.Errorf("raftstore: opening the new snapshot: %w", err)
	}
	rc.Close()
	return meta.Index, meta.Size, nil
}

// Shutdown stops the node. A leader first hands leadership to another voter
// (bounded by ctx), so the cluster does not wait an election timeout; then the
// leader session ends (RunWhileLeader functions return), raft stops, and the
// transport and stores are closed. It is safe to call more than once.
func (n *Node) Shutdown(ctx context.Context) error {
	if n.raft.State() == raft.Leader && n.otherVoters() {
		if err := n.await(ctx, n.raft.LeadershipTransfer()); err != nil {
			n.log.Warn("leadership transfer before shutdown failed", "err", err)
		}
	}
	return n.stop(false)
}

// Kill stops the node as a crash would: its transport closes first and
// leadership is not handed over, so the other members notice only by missing
// heartbeats. The data dir stays as it is, for a restart. For fault drills and
// tests; Shutdown is the orderly stop.
func (n *Node) Kill() error { return n.stop(true) }

func (n *Node) otherVoters() bool {
	f := n.raft.GetConfiguration()
	if f.Error() != nil {
		return false
	}
	for _, s := range f.Configuration().Servers {
		if s.Suffrage == raft.Voter && string(s.ID) != n.cfg.NodeID {
			return true
		}
	}
	return false
}

// stop shuts everything down; abrupt closes the transport first, so that peers
// see the node vanish as if it crashed.
func (n *Node) stop(abrupt bool) error {
	n.closeOnce.Do(func() {
		close(n.closing)
		n.cancel()
		var errs []error
		// closeTransport also closes the pooled outbound connections, which
		// raft's NetworkTransport.Close leaves open: until they close, each
		// peer's handler goroutine for them stays blocked reading.
		closeTransport := func() {
			errs = append(errs, n.transport.Close())
			n.transport.CloseStreams()
		}
		if abrupt {
			closeTransport()
		}
		errs = append(errs, n.raft.Shutdown().Error())
		close(n.raftStopped)
		<-n.loopDone
		if !abrupt {
			closeTransport()
		}
		errs = append(errs, n.store.Close())
		n.closeErr = errors.Join(errs...)
		n.log.Info("raft node stopped", "abrupt", abrupt)
		close(n.stopped)
	})
	return n.closeErr
}
