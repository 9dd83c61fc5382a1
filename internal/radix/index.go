package radix

import (
	"errors"
	"fmt"
	"strconv"
	"sync"
)

// Tier is a storage tier of a cached block, fastest first.
type Tier uint8

// The tiers, in order of speed: a block held on several tiers counts for the fastest.
const (
	TierGPU Tier = iota
	TierCPU
	TierDisk
)

// NumTiers is the number of tiers; valid tiers are 0..NumTiers-1.
const NumTiers = 3

func (t Tier) String() string {
	switch t {
	case TierGPU:
		return "gpu"
	case TierCPU:
		return "cpu"
	case TierDisk:
		return "disk"
	}
	return "tier(" + strconv.Itoa(int(t)) + ")"
}

func (t Tier) bit() uint8 { return 1 << t }

// WorkerKey identifies one holder of blocks: a worker and one of its data-parallel ranks.
type WorkerKey struct {
	Worker string
	DPRank uint32
}

func (k WorkerKey) compare(o WorkerKey) int {
	switch {
	case k.Worker < o.Worker:
		return -1
	case k.Worker > o.Worker:
		return 1
	case k.DPRank < o.DPRank:
		return -1
	case k.DPRank > o.DPRank:
		return 1
	}
	return 0
}

// Config tunes an Index. The zero value is ready to use.
type Config struct {
	// MaxDetachedPerWorker bounds the detached blocks kept per worker (blocks whose
	// parent the worker never reported). 0 means DefaultMaxDetachedPerWorker.
	MaxDetachedPerWorker int
}

// DefaultMaxDetachedPerWorker is the detached-block bound used when Config leaves it 0.
const DefaultMaxDetachedPerWorker = 1 << 14

// maxWorkers is the number of worker ids a residency can encode (29 bits).
const maxWorkers = 1 << 29

var (
	// ErrLengthMismatch: Stored got a different number of engine hashes and local keys.
	ErrLengthMismatch = errors.New("radix: engine hashes and local keys differ in length")
	// ErrInvalidTier: a tier outside 0..NumTiers-1.
	ErrInvalidTier = errors.New("radix: invalid tier")
	// ErrTooManyWorkers: more distinct workers than a residency can encode.
	ErrTooManyWorkers = errors.New("radix: too many workers")
	// ErrCorruptSnapshot: ReadFrom found input that is not a valid snapshot.
	ErrCorruptSnapshot = errors.New("radix: corrupt snapshot")
)

// StoreResult says what one Stored call did, block by block. Every block lands in
// exactly one of Attached, Duplicate, Detached and Dropped; Replaced and Reattached
// count side effects.
type StoreResult struct {
	Attached   int // placed in the tree (new, or a new tier of a block already there)
	Duplicate  int // already held at the same place on that tier: nothing changed
	Detached   int // parent unknown to the worker: kept detached until the parent arrives
	Dropped    int // parent unknown and the worker's detached bound is reached
	Replaced   int // the worker already had this engine hash elsewhere: old placement dropped
	Reattached int // detached blocks that became reachable because this call stored their parent
}

// RemoveResult says what one Removed call did.
type RemoveResult struct {
	Removed int // a tier was dropped from a block the worker held
	Unknown int // hash unknown to the worker, or not held on that tier: nothing changed
}

// Counters accumulate StoreResult and RemoveResult over the life of the Index value
// (they survive ReadFrom, they are not part of a snapshot or the Digest).
type Counters struct {
	StoredAttached, StoredDuplicate, StoredDetached, StoredDropped uint64
	StoredReplaced, DetachedReattached                             uint64
	RemovedBlocks, RemovedUnknown                                  uint64
}

// Stats is a point-in-time summary of an Index.
type Stats struct {
	Workers     int // known (worker, dp rank) holders, with or without blocks
	Namespaces  int // namespace roots in the tree
	Nodes       int // block nodes, including holder-less ones kept for their children
	Residencies int // (block node, worker) pairs with at least one tier
	Detached    int // detached blocks over all workers
	Counters
}

// Index is the prefix index. Writes (Stored, Removed, Cleared, ApplyOps,
// RemoveWorker, ReadFrom) are serialised by a mutex; Match, Stats and Snapshot
// (WriteTo, Digest) may run concurrently with each other. See the package
// documentation for the semantics.
type Index struct {
	cfg     Config // immutable
	mu      sync.RWMutex
	st      state // guarded by mu
	scratch scratchPool
}

// New returns an empty Index.
func New(cfg Config) *Index {
	return &Index{cfg: cfg, st: newState(cfg)}
}

// Stored records that worker w now holds engineHashes on tier. engineHashes[0]'s
// parent is the worker's block parent (when hasParent) or the root of namespace ns;
// engineHashes[i]'s parent is engineHashes[i-1]. localKeys[i] is the block key of
// engineHashes[i]. On an error nothing is applied.
func (ix *Index) Stored(w WorkerKey, ns uint64, parent uint64, hasParent bool, engineHashes, localKeys []uint64, tier Tier) (StoreResult, error) {
	if err := checkStored(engineHashes, localKeys, tier); err != nil || len(engineHashes) == 0 {
		return StoreResult{}, err
	}
	ix.mu.Lock()
	defer ix.mu.Unlock()
	wid, err := ix.st.internWorker(w)
	if err != nil {
		return StoreResult{}, err
	}
	ix.st.prefetch(ix.st.workers[wid], engineHashes, false)
	return ix.st.stored(wid, ns, parent, hasParent, engineHashes, localKeys, tier.bit()), nil
}

func checkStored(hashes, keys []uint64, tier Tier) error {
	if len(hashes) != len(keys) {
		return fmt.Errorf("%w: %d hashes, %d keys", ErrLengthMismatch, len(hashes), len(keys))
	}
	if tier >= NumTiers {
		return fmt.Errorf("%w: %d", ErrInvalidTier, tier)
	}
	return nil
}

// Removed records that worker w dropped engineHashes from tier.
func (ix *Index) Removed(w WorkerKey, engineHashes []uint64, tier Tier) (RemoveResult, error) {
	if tier >= NumTiers {
		return RemoveResult{}, fmt.Errorf("%w: %d", ErrInvalidTier, tier)
	}
	ix.mu.Lock()
	defer ix.mu.Unlock()
	wid, ok := ix.st.workerIDs[w]
	if !ok {
		return ix.st.removedByUnknown(engineHashes), nil
	}
	ix.st.prefetch(ix.st.workers[wid], engineHashes, true)
	return ix.st.removed(wid, engineHashes, tier.bit()), nil
}

// Cleared drops every block of worker w; w stays known. An unknown w is a no-op.
func (ix *Index) Cleared(w WorkerKey) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if wid, ok := ix.st.workerIDs[w]; ok {
		ix.st.clearWorker(wid)
	}
}

// RemoveWorker drops every block of every dp rank of worker and forgets them.
func (ix *Index) RemoveWorker(worker string) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	for _, wid := range append([]uint32(nil), ix.st.byName[worker]...) {
		ix.st.clearWorker(wid)
		ix.st.forgetWorker(wid)
	}
}

// Stats returns current sizes and the cumulative counters.
func (ix *Index) Stats() Stats {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	st := &ix.st
	return Stats{
		Workers:     len(st.workerIDs),
		Namespaces:  st.namespaces,
		Nodes:       st.blockNodes,
		Residencies: st.residencies,
		Detached:    st.detached,
		Counters:    st.counters,
	}
}

// stored applies one Stored call of worker wid; mask is a single tier bit.
func (st *state) stored(wid uint32, ns, parent uint64, hasParent bool, hashes, keys []uint64, mask uint8) StoreResult {
	ws := st.workers[wid]
	var res StoreResult
	var at uint32 // the node of the previous block, while attached
	attached := true
	if hasParent {
		e, ok := ws.blocks.get(parent)
		at, attached = e.node, ok
	} else {
		at = st.childOrCreate(0, ns)
	}
	prev := parent
	for i, h := range hashes {
		if attached {
			at = st.storeAttached(wid, at, h, keys[i], mask, &res)
		} else {
			st.storeDetached(wid, prev, h, keys[i], mask, &res)
		}
		prev = h
	}
	c := &st.counters
	c.StoredAttached += uint64(res.Attached)
	c.StoredDuplicate += uint64(res.Duplicate)
	c.StoredDetached += uint64(res.Detached)
	c.StoredDropped += uint64(res.Dropped)
	c.StoredReplaced += uint64(res.Replaced)
	c.DetachedReattached += uint64(res.Reattached)
	return res
}

// removed applies one Removed call of worker wid; bit is a single tier bit.
func (st *state) removed(wid uint32, hashes []uint64, bit uint8) RemoveResult {
	var res RemoveResult
	ws := st.workers[wid]
	for _, h := range hashes {
		if e, ok := ws.blocks.get(h); ok && e.tiers&bit != 0 {
			st.dropEntryTiers(wid, h, e, bit)
			res.Removed++
		} else if d, ok := ws.detached[h]; ok && d.tiers&bit != 0 {
			st.dropDetachedTiers(ws, h, d, bit)
			res.Removed++
		} else {
			res.Unknown++
		}
	}
	st.counters.RemovedBlocks += uint64(res.Removed)
	st.counters.RemovedUnknown += uint64(res.Unknown)
	return res
}

// removedByUnknown counts a Removed call of a worker the index does not know.
func (st *state) removedByUnknown(hashes []uint64) RemoveResult {
	st.counters.RemovedUnknown += uint64(len(hashes))
	return RemoveResult{Unknown: len(hashes)}
}
