package server

import (
	"slices"
	"sync"
	"sync/atomic"

	kvindexv1 "github.com/kvindex/kvindex/api/proto/kvindex/v1"
	"github.com/kvindex/kvindex/internal/ingest"
	"github.com/kvindex/kvindex/internal/kvblock"
	"github.com/kvindex/kvindex/internal/radix"
)

// ChangeFeed turns applied stream batches into kvindex.v1.IndexChanges and fans
// them out to Watch subscribers. The apply path calls, for every batch:
//
//	p := feed.Prepare(ix, &batch) // before applying: resolves removed blocks
//	res := applier.Apply(batch)
//	feed.Commit(p, appliedIndex, res.Applied)
//
// and WorkerRemoved after removing a worker. While nobody watches, Prepare
// returns nil at the cost of one atomic load and Commit does nothing; while
// somebody does, each stored or removed block costs a walk to the root of the
// index (O(depth)) to compute its sequence hash, on the apply goroutine.
//
// Removed blocks are resolved before the batch is applied (afterwards they are
// gone) and stored ones after (only then is their place known), so a block
// stored and removed within one batch is reported by neither.
//
// Prepare, Commit and WorkerRemoved are called from the apply goroutine only;
// Subscribe and the Subscription methods from anywhere.
type ChangeFeed struct {
	buffer int
	naming atomic.Pointer[feedNaming]

	active atomic.Int32
	mu     sync.Mutex
	subs   map[*Subscription]struct{} // guarded by mu
}

// DefaultWatchBuffer is how many batches of changes a watcher may fall behind
// when NewChangeFeed is given 0.
const DefaultWatchBuffer = 4096

// NewChangeFeed returns a feed whose subscribers may fall buffer batches behind
// before they are dropped. NewAPI names it (see name) before it serves.
func NewChangeFeed(buffer int) *ChangeFeed {
	if buffer <= 0 {
		buffer = DefaultWatchBuffer
	}
	f := &ChangeFeed{buffer: buffer, subs: map[*Subscription]struct{}{}}
	f.name(&namespaceNames{}, func(string) string { return "" })
	return f
}

// feedNaming is how changes are named: model gives a worker's model ("" when
// unknown; for filtering and the model field) and must not block; names
// resolves namespace ids.
type feedNaming struct {
	names *namespaceNames
	model func(worker string) string
}

// name sets how changes are named. It may be called while batches are applied
// (a raft node replays its log before its API exists).
func (f *ChangeFeed) name(names *namespaceNames, model func(worker string) string) {
	f.naming.Store(&feedNaming{names: names, model: model})
}

func (f *ChangeFeed) model(worker string) string { return f.naming.Load().model(worker) }

// Subscription is one Watch: batches of changes in applied order on C until it
// is closed, by Close or because it fell behind (Err is then ErrWatchLagging).
type Subscription struct {
	c       chan []*kvindexv1.IndexChange
	workers []string // sorted; nil for all
	model   string
	feed    *ChangeFeed
	closed  bool // guarded by feed.mu
	err     atomic.Pointer[error]
}

// Subscribe starts a subscription to the changes of workers (all when empty) of
// model (all when empty).
func (f *ChangeFeed) Subscribe(workers []string, model string) *Subscription {
	s := &Subscription{c: make(chan []*kvindexv1.IndexChange, f.buffer), model: model, feed: f}
	if len(workers) > 0 {
		s.workers = slices.Clone(workers)
		slices.Sort(s.workers)
	}
	f.mu.Lock()
	f.subs[s] = struct{}{}
	f.active.Store(int32(len(f.subs)))
	f.mu.Unlock()
	return s
}

// C delivers batches of changes; it is closed when the subscription ends.
func (s *Subscription) C() <-chan []*kvindexv1.IndexChange { return s.c }

// Err is why the subscription ended: nil after Close, ErrWatchLagging when the
// subscriber fell behind.
func (s *Subscription) Err() error {
	if p := s.err.Load(); p != nil {
		return *p
	}
	return nil
}

// Close ends the subscription.
func (s *Subscription) Close() { s.end(nil) }

func (s *Subscription) end(err error) {
	f := s.feed
	f.mu.Lock()
	defer f.mu.Unlock()
	s.endLocked(err)
}

// endLocked ends s; the caller holds feed.mu.
func (s *Subscription) endLocked(err error) {
	if s.closed {
		return
	}
	s.closed = true
	if err != nil {
		s.err.Store(&err)
	}
	delete(s.feed.subs, s)
	s.feed.active.Store(int32(len(s.feed.subs)))
	close(s.c)
}

func (s *Subscription) wants(c *kvindexv1.IndexChange, model string) bool {
	if s.workers != nil {
		if _, found := slices.BinarySearch(s.workers, c.Worker); !found {
			return false
		}
	}
	return s.model == "" || s.model == model
}

// CloseAll ends every subscription with err (a server shutting down ends its
// Watch streams so that a graceful stop does not wait for them).
func (f *ChangeFeed) CloseAll(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for s := range f.subs {
		s.endLocked(err)
	}
}

// PreparedBatch is what Prepare resolved before a batch was applied.
type PreparedBatch struct {
	batch   *ingest.StreamBatch
	removed [][]*kvindexv1.IndexChange // per op: REMOVED changes resolved before applying
}

// Prepare resolves, before b is applied to ix, the sequence hashes of the
// blocks b removes. It returns nil when nobody watches.
func (f *ChangeFeed) Prepare(ix *radix.Index, b *ingest.StreamBatch) *PreparedBatch {
	if f.active.Load() == 0 {
		return nil
	}
	p := &PreparedBatch{batch: b, removed: make([][]*kvindexv1.IndexChange, len(b.Ops))}
	var path []uint64
	for i := range b.Ops {
		op := &b.Ops[i]
		if op.Kind != ingest.OpRemoved {
			continue
		}
		var cur *kvindexv1.IndexChange
		for _, h := range op.Hashes {
			var ns uint64
			var ok bool
			ns, path, ok = ix.BlockPath(b.Stream, h, path[:0])
			if !ok {
				continue
			}
			if cur == nil || cur.NamespaceId != ns {
				cur = f.change(b.Stream, kvindexv1.ChangeKind_CHANGE_KIND_REMOVED, ns, op.Tier)
				p.removed[i] = append(p.removed[i], cur)
			}
			cur.SequenceHashes = append(cur.SequenceHashes, chainTip(path))
		}
	}
	return p
}

// Commit publishes the changes of a prepared batch, applied at index applied;
// applied is false when the applier dropped the batch as already applied.
func (f *ChangeFeed) Commit(p *PreparedBatch, ix *radix.Index, index uint64, applied bool) {
	if p == nil || !applied {
		return
	}
	b := p.batch
	var out []*kvindexv1.IndexChange
	if b.Reset {
		out = append(out, f.change(b.Stream, kvindexv1.ChangeKind_CHANGE_KIND_CLEARED, 0, 0))
	}
	var path []uint64
	for i := range b.Ops {
		op := &b.Ops[i]
		switch op.Kind {
		case ingest.OpRemoved:
			out = append(out, p.removed[i]...)
		case ingest.OpCleared:
			out = append(out, f.change(b.Stream, kvindexv1.ChangeKind_CHANGE_KIND_CLEARED, 0, 0))
		case ingest.OpStored:
			if len(op.Hashes) == 0 {
				continue
			}
			var ns uint64
			var ok bool
			if ns, path, ok = ix.BlockPath(b.Stream, op.Hashes[0], path[:0]); !ok {
				continue // detached: the index could not place the blocks
			}
			c := f.change(b.Stream, kvindexv1.ChangeKind_CHANGE_KIND_STORED, ns, op.Tier)
			chain := kvblock.AppendChainHashes(make([]uint64, 0, len(path)+len(op.Keys)), path)
			if len(chain) > 1 {
				parent := chain[len(chain)-2]
				c.ParentSequenceHash = &parent
			}
			seq := chain[len(chain)-1]
			c.SequenceHashes = append(make([]uint64, 0, len(op.Keys)), seq)
			for _, k := range op.Keys[1:] {
				seq = kvblock.NextChainHash(seq, k)
				c.SequenceHashes = append(c.SequenceHashes, seq)
			}
			c.LocalHashes = slices.Clone(op.Keys)
			out = append(out, c)
		}
	}
	f.publish(out, index)
}

// WorkerRemoved publishes the removal of every dp rank of worker at index.
func (f *ChangeFeed) WorkerRemoved(worker string, index uint64) {
	if f.active.Load() == 0 {
		return
	}
	f.publish([]*kvindexv1.IndexChange{{Worker: worker, Kind: kvindexv1.ChangeKind_CHANGE_KIND_WORKER_REMOVED}}, index)
}

// change starts a change of stream s; ns and tier matter for STORED and REMOVED.
func (f *ChangeFeed) change(s ingest.Stream, kind kvindexv1.ChangeKind, ns uint64, tier radix.Tier) *kvindexv1.IndexChange {
	c := &kvindexv1.IndexChange{Worker: s.Worker, DpRank: s.DPRank, Kind: kind}
	if kind == kvindexv1.ChangeKind_CHANGE_KIND_STORED || kind == kvindexv1.ChangeKind_CHANGE_KIND_REMOVED {
		c.Tier = tierProto(tier)
		c.NamespaceId = ns
		c.Model = f.model(s.Worker)
		if n, ok := f.naming.Load().names.lookup(ns); ok {
			c.Model, c.LoraName, c.CacheSalt = n.Model, n.LoRA, n.CacheSalt
		}
	}
	return c
}

func (f *ChangeFeed) publish(changes []*kvindexv1.IndexChange, index uint64) {
	if len(changes) == 0 {
		return
	}
	for _, c := range changes {
		c.AppliedIndex = index
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for s := range f.subs {
		var mine []*kvindexv1.IndexChange
		for _, c := range changes {
			model := c.Model
			if model == "" {
				model = f.model(c.Worker)
			}
			if s.wants(c, model) {
				mine = append(mine, c)
			}
		}
		if len(mine) == 0 {
			continue
		}
		select {
		case s.c <- mine:
		default:
			// The subscriber is buffer batches behind: end it rather than block
			// the apply loop or drop changes silently.
			s.endLocked(ErrWatchLagging)
		}
	}
}

// chainTip returns the sequence hash of the last block of a path of local keys.
func chainTip(path []uint64) uint64 {
	seq := path[0]
	for _, k := range path[1:] {
		seq = kvblock.NextChainHash(seq, k)
	}
	return seq
}

func tierProto(t radix.Tier) kvindexv1.Tier {
	switch t {
	case radix.TierGPU:
		return kvindexv1.Tier_TIER_GPU
	case radix.TierCPU:
		return kvindexv1.Tier_TIER_CPU
	case radix.TierDisk:
		return kvindexv1.Tier_TIER_DISK
	}
	return kvindexv1.Tier_TIER_UNSPECIFIED
}

// namespaceNames remembers the names of namespace ids the server has seen
// named: the base namespace of each registered model and every namespace a
// query asked about. The ids themselves are one-way hashes.
type namespaceNames struct {
	m     sync.Map // uint64 -> kvblock.Namespace
	count atomic.Int64
}

// maxNamedNamespaces bounds namespaceNames: cache salts may be per tenant.
const maxNamedNamespaces = 1 << 14

func (n *namespaceNames) learn(id uint64, ns kvblock.Namespace) {
	if _, known := n.m.Load(id); known || n.count.Load() >= maxNamedNamespaces {
		return
	}
	if _, loaded := n.m.LoadOrStore(id, ns); !loaded {
		n.count.Add(1)
	}
}

func (n *namespaceNames) lookup(id uint64) (kvblock.Namespace, bool) {
	v, ok := n.m.Load(id)
	if !ok {
		return kvblock.Namespace{}, false
	}
	return v.(kvblock.Namespace), true
}
