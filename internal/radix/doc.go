// Package radix is the prefix index: which worker holds which prefix of which
// prompt, on which tier. It owns the tree of blocks, the per-worker tables of
// engine hashes, matching, and the snapshot format. It does no I/O beyond the
// io.Reader/io.Writer handed to ReadFrom/WriteTo, starts no goroutines, logs
// nothing and reads no clock; callers compute block keys (internal/kvblock) and
// namespace ids and pass them in. It imports nothing of this module.
//
// # Model
//
// A worker is a WorkerKey (name, dp rank). A block is a node of the tree, keyed by
// its local block key under its parent node; the first block of a prompt hangs
// under the root of its namespace (model, LoRA, cache salt), so namespaces never
// share nodes. Each node records which workers hold it and on which tiers (a
// worker may hold a block on GPU and CPU at once). Each worker has a table from its
// engine hashes to nodes, used to resolve parent hashes and removals. Engine hashes
// are opaque and private to a worker.
//
// # Events
//
// Stored(w, ns, parent, hasParent, hashes, keys, tier): hashes[0] goes under w's
// block parent when hasParent, else under the root of ns; hashes[i] goes under
// hashes[i-1]. ns is used only for a root block: a block under a parent belongs to
// the parent's namespace. len(hashes) != len(keys) or a bad tier is an error and
// nothing is applied.
//
//   - Duplicate: a hash the worker already holds at the same place (same parent
//     node and key, or the same detached parent and key) on the same tier changes
//     nothing and is counted. On a new tier, the tier is added.
//   - Moved: a hash the worker holds at a different place is dropped there (all
//     its tiers) and placed anew, counted as Replaced: the engine is the authority
//     on its own hashes.
//   - Unknown parent: when hasParent and the worker does not hold parent, the blocks
//     cannot be placed (their position in the tree is unknown), so they are kept
//     detached: not in the tree, invisible to Match, remembered per worker with
//     their parent hash, key and tiers. When the worker later stores the parent
//     hash at a known place, its detached descendants are attached (transitively)
//     and counted as Reattached. Removed and Cleared see detached blocks like any
//     other. At most Config.MaxDetachedPerWorker are kept per worker; beyond that a
//     block is counted as Dropped (and so are its descendants in the same call).
//   - Aliases: two engine hashes of one worker can land on the same node (equal
//     tokens with different extra keys, e.g. multimodal inputs). The node counts as
//     held on a tier while any of them holds it on that tier.
//
// ApplyOps(w, ops) applies a batch of those writes for one worker, each exactly as
// its method would, refusing bad ops one by one; it is how an ingest batch is
// applied (see its doc for what it saves).
//
// Removed(w, hashes, tier) drops tier from each hash; a hash left with no tier
// leaves the worker table. A hash unknown to the worker, or not held on that tier,
// is counted as Unknown and changes nothing (never an error). Cleared(w) drops all
// of w's blocks, attached and detached; w stays known (Stats.Workers).
// RemoveWorker(name) clears and forgets every dp rank of name.
//
// # Eviction order and inner nodes
//
// Engines evict in LRU order, not leaf-first, so a worker may hold a block without
// its parent. Such a block cannot match (a match is a contiguous prefix) but comes
// back into reach when the parent is stored again. When the last holder of an inner
// node leaves, the node is kept as long as it has children, so descendants that
// other workers (or the same one) still hold are not lost; a node with neither
// holders nor children is freed, and so, recursively, are its ancestors that are
// left empty. (Dynamo prunes the subtree instead.)
//
// # Match
//
// Match(ns, keys, filter) walks from the namespace root along keys and returns,
// per worker, Blocks = the length of the longest prefix of keys the worker holds
// contiguously on any tier, and PerTier[t] = how many of those blocks have t as
// their fastest held tier (GPU < CPU < Disk), so PerTier sums to Blocks. Only
// workers with Blocks > 0 are returned, sorted by WorkerKey. Cost: O(depth x
// holders of the visited nodes) at worst. A node keeps up to two holders
// inline; beyond two it keeps their worker ids in one array and their tiers in
// bit planes apart from them (holders.go). A run of such nodes held by the same
// workers, however their tiers vary, costs per node one comparison of the
// worker ids (a memequal) and a few word operations per 64 holders to count the
// fastest tiers by position, in bit-sliced counters read once at the end of the
// run; a node whose tiers equal its predecessor's costs the comparison alone (a
// prompt cached whole). It does not allocate when dst has room.
//
// # Snapshots and digest
//
// WriteTo writes a versioned, checksummed, canonical snapshot (workers, nodes and
// hashes in sorted order, see snapshot.go); ReadFrom replaces the content with
// one, or returns an error and changes nothing. Snapshot takes a consistent copy
// of the content (the node arena's chunks and the worker tables' shards) that writes
// the same bytes later, with no lock held: WriteTo and Digest are Snapshot
// followed by writing it. Digest is SHA-256 of that canonical
// form, so it depends only on the logical content (workers, their blocks with
// tiers, their detached blocks), never on insertion order or memory layout.
// Counters are not part of it.
//
// # Concurrency
//
// An Index is safe for concurrent use. Writes (Stored, Removed, Cleared,
// ApplyOps, RemoveWorker, ReadFrom's final swap) take an exclusive lock and are
// applied one at a time, in call order; they are meant to come from one apply
// loop. Match, Stats and Snapshot (so WriteTo and Digest) take a shared lock and
// run in parallel with each other; Snapshot holds it only while it copies (about
// 20 ms for 1M nodes), writing the snapshot holds no lock. Results never reflect a
// half-applied call (an ApplyOps batch is one call).
package radix
