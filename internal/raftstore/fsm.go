package raftstore

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"

	"github.com/kvindex/kvindex/internal/ingest"
	"github.com/kvindex/kvindex/internal/workerspec"
)

// maxTombstones bounds how many unregistered worker ids the FSM remembers (see
// fsm.tombstones); beyond it the oldest is forgotten. Every replica applies the
// same entries, so they forget the same ones.
const maxTombstones = 4096

// ErrFSMStopped: the FSM met an entry it cannot apply (corrupt, or of an unknown
// type not marked ignorable) and applies nothing more; the node shuts down.
var ErrFSMStopped = errors.New("raftstore: state machine stopped")

// BatchOutcome says what the FSM did with one StreamBatch of a committed entry.
type BatchOutcome uint8

const (
	// BatchApplied: the batch was new for its stream and was applied.
	BatchApplied BatchOutcome = iota + 1
	// BatchDuplicate: the batch was at or behind its stream's cursor and was dropped.
	BatchDuplicate
	// BatchOfRemovedWorker: the batch's worker was unregistered since, so it was
	// dropped (it was in flight when the worker left).
	BatchOfRemovedWorker
	// BatchFenced: the batch's stream is fenced (its worker was declared dead,
	// or unregistered since the batch was submitted) and the batch does not
	// start a fresh stream, so it was dropped.
	BatchFenced
)

func (o BatchOutcome) String() string {
	switch o {
	case BatchApplied:
		return "applied"
	case BatchDuplicate:
		return "duplicate"
	case BatchOfRemovedWorker:
		return "removed-worker"
	case BatchFenced:
		return "fenced"
	}
	return fmt.Sprintf("outcome(%d)", uint8(o))
}

// BatchObserver is told about every StreamBatch of every committed entry, in log
// order, on the apply goroutine, after it was applied or dropped. It must be quick
// and must not call back into the Node (the apply loop waits for it). The
// batch's Ops and their Hashes and Keys are cut from slabs shared by the whole
// entry: an observer that keeps any of them past the call copies it (keeping
// one would hold the entry's slabs).
type BatchObserver func(index uint64, b *ingest.StreamBatch, outcome BatchOutcome, res ingest.ApplyResult)

// ApplyResult is what applying one entry did; the node that proposed the entry
// gets it from raft's ApplyFuture.Response.
type ApplyResult struct {
	Applied, Duplicates, OfRemovedWorkers, Fenced int // stream batches by outcome
	OpErrors                                      int // ops the index refused (see ingest.ApplyResult)
	// Err is the outcome of a registry entry (ErrWorkerExists, ErrUnknownWorker),
	// ErrInvalidEntry for an entry refused as a no-op, or ErrFSMStopped.
	Err error
}

// fsm is the replicated state: the index and stream cursors (the Applier), the
// worker registry, the ids of recently unregistered workers and the members' gRPC
// addresses. raft calls Apply, Snapshot and Restore from one goroutine; the read
// methods may run concurrently with them.
type fsm struct {
	applier   *ingest.Applier
	log       *slog.Logger
	onWorkers func([]workerspec.Spec)
	onBatch   BatchObserver
	// beforeBatch, onRemoved, onDead and afterEntry are Config.BeforeBatch,
	// Config.OnWorkerRemoved, Config.OnWorkerDead and Config.AfterEntry (set
	// by NewNode after newFSM; nil when unused).
	beforeBatch func(index uint64, b *ingest.StreamBatch)
	onRemoved   func(index uint64, id string)
	onDead      func(index uint64, id string, ranks []uint32)
	afterEntry  func(index uint64)
	metrics     *metrics

	mu      sync.RWMutex
	workers map[string]workerspec.Spec // guarded by mu
	// tombstones holds the ids of unregistered workers with the log index of their
	// removal. Batches of such a worker still in the pipeline when it was removed are
	// committed after the removal and would bring its blocks back; they are dropped
	// instead, until the id is registered again.
	tombstones map[string]uint64 // guarded by mu
	members    map[string]string // node id -> gRPC address; guarded by mu
	// dead holds the registered workers declared dead (EntryWorkerDead) with
	// the log index of that entry, until their health endpoint answers again
	// (EntryWorkerAlive) or one of their streams starts afresh (a batch gets
	// through the fence). Only the apply goroutine writes it.
	dead map[string]uint64 // guarded by mu

	// lastIndex is the last command entry whose Apply has returned, or the one a
	// restored snapshot was taken after. raft's own AppliedIndex runs ahead of it:
	// raft counts an entry applied once it is queued for this FSM.
	lastIndex atomic.Uint64
	// applying is held (locked) by Apply and Restore while they change the
	// state, and read-locked by IndexCopy, so that a copy of the index and
	// lastIndex are taken between two entries and describe the same state.
	applying  sync.RWMutex
	appliedMu sync.Mutex
	appliedCh chan struct{} // closed and replaced when lastIndex moves; guarded by appliedMu
	// detachedWarned: when each worker's detached blocks were last logged
	// (warnDetached); only the apply goroutine uses it.
	detachedWarned map[string]time.Time
	// scratch is the decoding memory Apply reuses from entry to entry (only
	// the apply goroutine uses it; the hooks' contract, BatchObserver's, keeps
	// them from holding a batch's lists past the call).
	scratch decodeScratch
	stopErr atomic.Pointer[error]
	stopped chan struct{} // closed when the FSM stops
}

var _ raft.FSM = (*fsm)(nil)

func newFSM(applier *ingest.Applier, log *slog.Logger, m *metrics, onWorkers func([]workerspec.Spec), onBatch BatchObserver) *fsm {
	return &fsm{
		applier: applier, log: log, metrics: m, onWorkers: onWorkers, onBatch: onBatch,
		workers: map[string]workerspec.Spec{}, tombstones: map[string]uint64{}, members: map[string]string{}, dead: map[string]uint64{},
		stopped: make(chan struct{}), appliedCh: make(chan struct{}), detachedWarned: map[string]time.Time{},
	}
}

// detachedWarnEvery is how often a worker's detached blocks are logged at most.
const detachedWarnEvery = time.Minute

// warnDetached logs, at most once per detachedWarnEvery per worker, that a
// batch stored blocks under a parent the worker never reported: such blocks
// cannot match, and a worker whose blocks all detach scores nothing (an engine
// that sends a made-up root parent, or a stream joined mid-chain).
func (f *fsm) warnDetached(s ingest.Stream, out ingest.ApplyResult) {
	now := time.Now()
	if last, ok := f.detachedWarned[s.Worker]; ok && now.Sub(last) < detachedWarnEvery {
		return
	}
	if len(f.detachedWarned) >= maxTombstones {
		clear(f.detachedWarned)
	}
	f.detachedWarned[s.Worker] = now
	f.log.Warn("blocks stored under a parent the worker never reported are kept detached and cannot match",
		"worker", s.Worker, "dp_rank", s.DPRank, "blocks", out.Detached, "missing_parent", fmt.Sprintf("%#x", out.DetachedParent),
		"every", detachedWarnEvery)
}

func (f *fsm) setApplied(index uint64) {
	f.lastIndex.Store(index)
	f.appliedMu.Lock()
	close(f.appliedCh)
	f.appliedCh = make(chan struct{})
	f.appliedMu.Unlock()
}

// appliedChanged is closed the next time lastIndex moves.
func (f *fsm) appliedChanged() <-chan struct{} {
	f.appliedMu.Lock()
	defer f.appliedMu.Unlock()
	return f.appliedCh
}

// Apply applies one committed entry.
func (f *fsm) Apply(l *raft.Log) any {
	f.applying.Lock()
	defer f.applying.Unlock()
	if err := f.err(); err != nil {
		return ApplyResult{Err: err}
	}
	if l.Index <= f.lastIndex.Load() {
		// Applied already: raft replays the entries after a snapshot older
		// than this state, which Restore kept (see there).
		return ApplyResult{}
	}
	var res ApplyResult
	e, err := decodeEntry(l.Data, &f.scratch)
	switch {
	case err == nil:
		res = f.apply(l.Index, &e)
	case errors.Is(err, ErrUnknownEntryType) && e.Ignorable:
		f.metrics.ignoredEntries.Inc()
		f.log.Warn("skipping log entry of unknown ignorable type", "index", l.Index, "type", e.Type)
	case errors.Is(err, ErrInvalidEntry):
		// Well formed, but beyond the format's limits: written by a version
		// that did not check them (an unregister of an over-long id).
		// Stopping would stop every replica, and again at every restart,
		// since the entry stays in the log; the entry changes nothing instead.
		f.metrics.refusedEntries.Inc()
		f.log.Warn("refusing log entry beyond the format's limits: applied as a no-op", "index", l.Index, "type", e.Type, "err", err)
		res.Err = fmt.Errorf("log index %d: %w", l.Index, err)
	default:
		return ApplyResult{Err: f.stop(fmt.Errorf("log index %d: %w", l.Index, err))}
	}
	if f.afterEntry != nil {
		f.afterEntry(l.Index)
	}
	f.setApplied(l.Index)
	return res
}

// apply applies decoded entry e, committed at index.
func (f *fsm) apply(index uint64, e *Entry) ApplyResult {
	var res ApplyResult
	switch e.Type {
	case EntryStreamBatches:
		res = f.applyBatches(index, e.Batches)
	case EntryRegisterWorker:
		res.Err = f.register(e.Worker)
	case EntryUnregisterWorker:
		res.Err = f.unregister(e.ID, index, false)
	case EntryUnregisterFenced:
		res.Err = f.unregister(e.ID, index, true)
	case EntryReplaceWorker:
		res.Err = f.replace(e.Expected, e.Worker)
	case EntryWorkerDead:
		res.Err = f.setDead(e.ID, index, true)
	case EntryWorkerAlive:
		res.Err = f.setDead(e.ID, index, false)
	case EntryMemberAddr:
		f.mu.Lock()
		f.members[e.ID] = e.GRPCAddr
		f.mu.Unlock()
	case EntryMemberRemoved:
		f.mu.Lock()
		delete(f.members, e.ID)
		f.mu.Unlock()
	}
	return res
}

func (f *fsm) applyBatches(index uint64, batches []ingest.StreamBatch) ApplyResult {
	var res ApplyResult
	revived := false
	for i := range batches {
		b := &batches[i]
		var out ingest.ApplyResult
		outcome := BatchDuplicate
		// Only this goroutine writes tombstones and dead, so it may read them unlocked.
		if _, removed := f.tombstones[b.Stream.Worker]; removed {
			outcome = BatchOfRemovedWorker
			res.OfRemovedWorkers++
		} else {
			if f.beforeBatch != nil {
				f.beforeBatch(index, b)
			}
			out = f.applier.Apply(*b)
			switch {
			case out.Applied:
				outcome = BatchApplied
				res.Applied++
				if _, dead := f.dead[b.Stream.Worker]; dead {
					// It publishes again, as a fresh stream (the fence let
					// only that through): it lives.
					f.mu.Lock()
					delete(f.dead, b.Stream.Worker)
					f.mu.Unlock()
					revived = true
				}
			case out.Fenced:
				outcome = BatchFenced
				res.Fenced++
			default:
				res.Duplicates++
			}
			res.OpErrors += out.OpErrors
			if out.Detached > 0 {
				f.warnDetached(b.Stream, out)
			}
			if out.FirstErr != nil {
				f.log.Debug("index refused ops of a batch", "index", index, "ops", out.OpErrors, "first", out.FirstErr)
			}
		}
		if f.onBatch != nil {
			f.onBatch(index, b, outcome, out)
		}
	}
	f.metrics.batchesApplied.Add(float64(res.Applied))
	f.metrics.batchesDuplicate.Add(float64(res.Duplicates))
	f.metrics.batchesRemovedWorker.Add(float64(res.OfRemovedWorkers))
	f.metrics.batchesFenced.Add(float64(res.Fenced))
	f.metrics.opErrors.Add(float64(res.OpErrors))
	if revived {
		f.notifyWorkers(f.Workers())
	}
	return res
}

// register adds w; the entry decoder has already checked what checkWorker checks.
func (f *fsm) register(w workerspec.Spec) error {
	f.mu.Lock()
	old, exists := f.workers[w.ID]
	switch {
	case exists && sameWorker(&old, &w):
		f.mu.Unlock()
		return nil
	case exists:
		f.mu.Unlock()
		return fmt.Errorf("%w: %q", ErrWorkerExists, w.ID)
	}
	f.workers[w.ID] = w
	delete(f.tombstones, w.ID)
	list := f.workerListLocked()
	f.mu.Unlock()
	f.notifyWorkers(list)
	return nil
}

// replace swaps a registered worker's spec for w if it is still expected; a
// worker already registered as w is left alone (a retried replace). The
// worker's blocks stay: the spec changes, the engine does not.
func (f *fsm) replace(expected, w workerspec.Spec) error {
	f.mu.Lock()
	cur, exists := f.workers[w.ID]
	switch {
	case exists && sameWorker(&cur, &w):
		f.mu.Unlock()
		return nil
	case !exists:
		f.mu.Unlock()
		return fmt.Errorf("%w: %q", ErrUnknownWorker, w.ID)
	case !sameWorker(&cur, &expected):
		f.mu.Unlock()
		return fmt.Errorf("%w: %q", ErrWorkerChanged, w.ID)
	}
	f.workers[w.ID] = w
	list := f.workerListLocked()
	f.mu.Unlock()
	f.notifyWorkers(list)
	return nil
}

// unregister removes worker id and its blocks at log index index, and keeps
// its id as a tombstone (see fsm.tombstones). With fence (EntryUnregisterFenced)
// its streams' cursors stay, fenced at index, as FenceWorker leaves a dead
// worker's: a batch of the worker proposed before the removal can still commit
// after the worker is registered again (Submit returns before its batch is
// proposed, admin entries are proposed at once), and with no cursor left it
// would be applied and set its stream's cursor back to the old registration's
// epoch, behind which every batch of the new registration's stream, started
// without a cursor at epoch 0, was then dropped as a duplicate. Fenced, the old
// batch is dropped, and ingest starts the new stream afresh in an epoch above
// the old one (checkFence). Without fence (EntryUnregisterWorker, written by
// older builds) the cursors go, as they did when the entry was written. A
// forgotten tombstone takes its worker's cursors with it, so they stay bounded.
func (f *fsm) unregister(id string, index uint64, fence bool) error {
	f.mu.Lock()
	if _, ok := f.workers[id]; !ok {
		f.mu.Unlock()
		return fmt.Errorf("%w: %q", ErrUnknownWorker, id)
	}
	delete(f.workers, id)
	delete(f.dead, id)
	f.tombstones[id] = index
	forgotten := ""
	if len(f.tombstones) > maxTombstones {
		oldest, at := "", uint64(0)
		for w, i := range f.tombstones {
			if oldest == "" || i < at || (i == at && w < oldest) {
				oldest, at = w, i
			}
		}
		delete(f.tombstones, oldest)
		forgotten = oldest
	}
	list := f.workerListLocked()
	f.mu.Unlock()
	if fence {
		f.applier.FenceWorker(id, index)
	} else {
		f.applier.RemoveWorker(id)
	}
	if forgotten != "" {
		// Not registered, so it holds no block: only its fenced cursors go.
		f.applier.RemoveWorker(forgotten)
	}
	if f.onRemoved != nil {
		f.onRemoved(index, id)
	}
	f.notifyWorkers(list)
	return nil
}

func (f *fsm) notifyWorkers(list []workerspec.Spec) {
	if f.onWorkers != nil {
		f.onWorkers(list)
	}
}

// workerListLocked returns the registry sorted by id, as copies.
func (f *fsm) workerListLocked() []workerspec.Spec {
	out := make([]workerspec.Spec, 0, len(f.workers))
	for _, w := range f.workers {
		out = append(out, cloneWorker(w))
	}
	slices.SortFunc(out, func(a, b workerspec.Spec) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

// Workers returns the registry sorted by id.
func (f *fsm) Workers() []workerspec.Spec {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.workerListLocked()
}

// Worker returns the registered worker id.
func (f *fsm) Worker(id string) (workerspec.Spec, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	w, ok := f.workers[id]
	return cloneWorker(w), ok
}

// memberAddrs returns a copy of the members' gRPC addresses.
func (f *fsm) memberAddrs() map[string]string {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return maps.Clone(f.members)
}

func (f *fsm) stop(err error) error {
	err = fmt.Errorf("%w: %w", ErrFSMStopped, err)
	if f.stopErr.CompareAndSwap(nil, &err) {
		f.log.Error("state machine stopped: this node cannot apply the log any further", "err", err)
		close(f.stopped)
	}
	return *f.stopErr.Load()
}

func (f *fsm) err() error {
	if p := f.stopErr.Load(); p != nil {
		return *p
	}
	return nil
}

// Snapshot captures the state for raft. The index is serialised here, on the apply
// goroutine, so that it matches the cursors and registry captured with it; Persist
// then only copies bytes while Apply goes on.
func (f *fsm) Snapshot() (raft.FSMSnapshot, error) {
	if err := f.err(); err != nil {
		return nil, err
	}
	s, err := f.capture()
	if err != nil {
		return nil, err
	}
	return s, nil
}

// Restore replaces the whole state with a snapshot's. The snapshot's applied index
// becomes lastIndex; raft's index for the snapshot may be later, past entries that
// never reach Apply (see Node.AppliedIndex). A version 1 snapshot has none, so
// lastIndex stays 0 until the next command entry.
//
// A snapshot older than the state (its applied index below lastIndex) is not
// restored: hashicorp/raft installs whatever snapshot a leader sends, and a
// leader that lost track of a follower (a retried InstallSnapshot, a new
// leader backing off) can send one the follower has already applied past.
// Restoring it would take the state, and AppliedIndex, back in time until
// raft replays the later entries, which it does only once the commit index
// moves again; Apply skips those replayed entries instead, as applied. A
// version 1 snapshot does not say what it applied, so it is always restored.
func (f *fsm) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	f.applying.Lock()
	defer f.applying.Unlock()
	st, err := readSnapshot(rc, f.applier.Index(), f.lastIndex.Load())
	if errors.Is(err, errSnapshotBehind) {
		f.log.Info("kept the state: the snapshot sent is older", "snapshot_applied", st.applied, "applied", f.lastIndex.Load())
		return nil
	}
	if err != nil {
		return err
	}
	f.applier.SetCursors(st.cursors)
	f.mu.Lock()
	f.workers, f.tombstones, f.members, f.dead = st.workers, st.tombstones, st.members, st.dead
	list := f.workerListLocked()
	f.mu.Unlock()
	f.setApplied(st.applied)
	f.notifyWorkers(list)
	return nil
}
