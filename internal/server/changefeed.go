package server

import (
	"slices"
	"sync/atomic"

	kvindexv1 "github.com/kvindex/kvindex/api/proto/kvindex/v1"
	"github.com/kvindex/kvindex/internal/ingest"
	"github.com/kvindex/kvindex/internal/kvblock"
	"github.com/kvindex/kvindex/internal/radix"
	"github.com/kvindex/kvindex/internal/workerspec"
)

// ChangeFeed turns applied stream batches into kvindex.v1.IndexChanges for the
// Watch streams. The apply path calls, for every batch of the raft log:
//
//	p := feed.Prepare(ix, &batch, index) // before applying: resolves removed blocks
//	res := applier.Apply(batch)
//	feed.Commit(p, ix, index, res.Applied)
//
// WorkerRemoved after removing a worker, WorkerDead after a worker was declared
// dead, WorkersChanged with the registry whenever it changes, and EntryApplied
// at the end of every log entry. The changes of one entry (its many batches)
// are published together at EntryApplied, so a Watch message never ends inside
// an entry: a client that resumes after the applied_index of the last change
// it got misses nothing of that entry. While nobody watches, Prepare returns nil at the cost of
// one atomic load and Commit does nothing; while somebody does, each stored or
// removed block costs a walk to the root of the index (O(depth)) to compute its
// sequence hash. That part must run on the apply goroutine, where the index is
// exactly as the batch left it; handing the changes to the subscribers (and
// keeping them for resuming Watches) does not: the fan-out (fanout.go) runs on a
// goroutine of its own, and the apply path only appends to its queue.
//
// Removed blocks are resolved before the batch is applied (afterwards they are
// gone) and stored ones after (only then is their place known), so a block
// stored and removed within one batch is reported by neither.
//
// Every change names its worker's model, resolved here from the registry as the
// log has it at that point (WorkersChanged), so a worker registered just before
// its first batch is never reported with an empty model.
//
// Concurrency: Prepare, Commit, WorkerRemoved, WorkerDead, WorkersChanged and
// EntryApplied are called from the apply goroutine only; Subscribe, Close and
// the Subscription methods from anywhere.
type ChangeFeed struct {
	names *namespaceNames
	// models maps registered workers to their models; replaced (never changed)
	// by WorkersChanged.
	models atomic.Pointer[map[string]string]
	fan    *fanout
	// staged holds the changes of the entry being applied, at stagedIndex,
	// until EntryApplied publishes them (apply goroutine only).
	staged      []*kvindexv1.IndexChange
	stagedIndex uint64
}

// DefaultWatchBuffer is how many log entries' changes a watcher may fall
// behind, and how many the feed keeps for resuming Watches, when NewChangeFeed
// is given 0. An entry carries at most --raft-batch-max-events (4096) block
// events, so the history holds at most about 4M changed blocks (tens of MB);
// at saturated ingest (a few hundred entries a second) that is seconds of
// history, and minutes at an ordinary fleet's rate.
const DefaultWatchBuffer = 1024

// NewChangeFeed returns a feed whose subscribers may fall buffer log entries
// behind before they are dropped, and which keeps the changes of the last
// buffer entries for subscribers that resume. Once somebody subscribed, its fan-out goroutine
// runs until Close.
func NewChangeFeed(buffer int) *ChangeFeed {
	if buffer <= 0 {
		buffer = DefaultWatchBuffer
	}
	f := &ChangeFeed{names: &namespaceNames{}, fan: newFanout(buffer)}
	f.models.Store(&map[string]string{})
	return f
}

// Names is the namespace naming the feed's changes use; the API adds to it
// what queries teach.
func (f *ChangeFeed) Names() *namespaceNames { return f.names }

// WorkersChanged takes the registry as the log has it now: the models of the
// workers, and the base namespace of each model, name the changes from here on.
func (f *ChangeFeed) WorkersChanged(list []workerspec.Spec) {
	m := make(map[string]string, len(list))
	for _, w := range list {
		m[w.ID] = w.Model
		if w.Model != "" {
			base := kvblock.Namespace{Model: w.Model}
			f.names.learn(base.ID(), base)
		}
	}
	f.models.Store(&m)
}

// model returns the model of a registered worker, "" when it is not registered.
func (f *ChangeFeed) model(worker string) string { return (*f.models.Load())[worker] }

// Subscribe starts a subscription to the changes of workers (all when empty) of
// model (all when empty). With resume, it first delivers the changes applied
// after index after, or fails with ErrWatchResumeUnavailable when this node no
// longer has (or never computed) every one of them.
func (f *ChangeFeed) Subscribe(workers []string, model string, after uint64, resume bool) (*Subscription, error) {
	return f.fan.subscribe(workers, model, after, resume)
}

// Close ends every subscription with err and stops the fan-out goroutine (a
// server shutting down ends its Watch streams so that a graceful stop does not
// wait for them). Changes committed afterwards are dropped.
func (f *ChangeFeed) Close(err error) { f.fan.close(err) }

// PreparedBatch is what Prepare resolved before a batch was applied.
type PreparedBatch struct {
	batch   *ingest.StreamBatch
	removed [][]*kvindexv1.IndexChange // per op: REMOVED changes resolved before applying
}

// Prepare resolves, before b is applied to ix at log index index, the
// sequence hashes of the blocks b removes. It returns nil when nobody watches.
func (f *ChangeFeed) Prepare(ix *radix.Index, b *ingest.StreamBatch, index uint64) *PreparedBatch {
	if !f.fan.recording(index) {
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

// Commit stages the changes of a prepared batch, applied at index index;
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
	f.stage(out, index)
}

// stage keeps changes of the entry at index for EntryApplied (raftstore calls
// it after every command entry, so nothing of an earlier entry is staged).
func (f *ChangeFeed) stage(changes []*kvindexv1.IndexChange, index uint64) {
	f.staged = append(f.staged, changes...)
	f.stagedIndex = index
}

// EntryApplied publishes the changes of the entry at index, all in one batch.
func (f *ChangeFeed) EntryApplied(index uint64) {
	if len(f.staged) == 0 || f.stagedIndex != index {
		return
	}
	f.fan.publish(f.staged, index)
	f.staged = nil // published: the fan-out keeps it
}

// WorkerRemoved stages the removal of every dp rank of worker at index.
func (f *ChangeFeed) WorkerRemoved(worker string, index uint64) {
	if !f.fan.recording(index) {
		return
	}
	f.stage([]*kvindexv1.IndexChange{{Worker: worker, Model: f.model(worker), Kind: kvindexv1.ChangeKind_CHANGE_KIND_WORKER_REMOVED}}, index)
}

// WorkerDead stages, at index, that worker's ranks lost their blocks: the
// worker was declared dead (CLEARED per rank that held a position).
func (f *ChangeFeed) WorkerDead(worker string, ranks []uint32, index uint64) {
	if !f.fan.recording(index) {
		return
	}
	out := make([]*kvindexv1.IndexChange, len(ranks))
	for i, r := range ranks {
		out[i] = f.change(ingest.Stream{Worker: worker, DPRank: r}, kvindexv1.ChangeKind_CHANGE_KIND_CLEARED, 0, 0)
	}
	f.stage(out, index)
}

// change starts a change of stream s; ns and tier matter for STORED and REMOVED.
func (f *ChangeFeed) change(s ingest.Stream, kind kvindexv1.ChangeKind, ns uint64, tier radix.Tier) *kvindexv1.IndexChange {
	c := &kvindexv1.IndexChange{Worker: s.Worker, DpRank: s.DPRank, Kind: kind, Model: f.model(s.Worker)}
	if kind == kvindexv1.ChangeKind_CHANGE_KIND_STORED || kind == kvindexv1.ChangeKind_CHANGE_KIND_REMOVED {
		c.Tier = tierProto(tier)
		c.NamespaceId = ns
		if n, ok := f.names.lookup(ns); ok {
			c.Model, c.LoraName, c.CacheSalt = n.Model, n.LoRA, n.CacheSalt
		}
	}
	return c
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
