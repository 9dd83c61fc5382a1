package radix

import (
	"slices"
	"sync/atomic"
)

// WorkerMatch is one worker's cached prefix of a prompt.
type WorkerMatch struct {
	Worker WorkerKey
	// Blocks is the length of the longest prefix of the keys the worker holds
	// contiguously, on any tier.
	Blocks int
	// PerTier[t] counts the blocks of that prefix whose fastest held tier is t;
	// the counts sum to Blocks.
	PerTier [NumTiers]int
}

// matchScratch is per-call state, pooled. A slot is current for a call when its
// mark carries the call's epoch in the high 32 bits; the low 32 bits are the
// blocks matched so far. Epochs spare clearing the slots on every call.
type matchScratch struct {
	epoch   uint32
	slots   []matchSlot // by worker id
	touched []uint64    // rank<<32 | worker id of the workers that matched block 0

	// The current run (see Match): the worker ids of its base node (nil when the
	// base is not spilled: runs are only counted over spilled nodes), the mark of
	// the workers matching through base, and the counts of the blocks after base
	// by position in base's list. For word group j of the tier planes, counts
	// holds countLevels bit-sliced counters, level by level, each level a word
	// for the blocks whose fastest tier is the GPU and one for the CPU (bit i of
	// level k is bit k of position 64j+i's count); the disk takes the rest.
	// counted is the number of blocks in them, at most maxCounted. last is the
	// tier planes of the latest block counted, and repeats how many blocks after
	// it had the same planes, not yet in counts: a prompt cached whole has the
	// same planes block after block, and adding them once, repeats times, costs
	// less than adding every block. Zero between runs.
	baseIDs []uint32
	want    uint64
	counts  []uint64
	counted int
	last    []uint64
	repeats int
}

type matchSlot struct {
	mark    uint64
	allowed uint32 // epoch of the call whose filter admits this worker
	tiers   [NumTiers]int32
}

// fastestTier maps a tier mask to the fastest tier in it (mask 0, an empty
// holder slot, to NumTiers: no caller looks it up). A table, because
// bits.TrailingZeros compiles to BSF for the baseline amd64 target, slower than
// this load.
var fastestTier = [8]uint8{3, 0, 1, 0, 2, 0, 1, 0}

const (
	countLevels = 8                     // bits of a run's counts; settle's transposition takes 8
	maxCounted  = 1<<countLevels - 1    // blocks a run counts between two settles
	countWords  = 2 * countLevels       // counter words per word group: GPU and CPU by level
	_           = uint(8 - countLevels) // columnCounts needs countLevels <= 8
)

// Match returns, for namespace ns and a prompt's block keys, every worker holding a
// non-empty prefix of them, sorted by WorkerKey, appended to dst[:0]. filter, when
// not nil, restricts the answer to those worker names (all their dp ranks); an
// empty non-nil filter matches nobody. Match does not allocate when dst has room.
func (ix *Index) Match(ns uint64, keys []uint64, filter []string, dst []WorkerMatch) []WorkerMatch {
	dst = dst[:0]
	if len(keys) == 0 || (filter != nil && len(filter) == 0) {
		return dst
	}
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	st := &ix.st
	sc := ix.getScratch(len(st.workers))
	defer ix.scratch.put(sc)

	if filter != nil {
		for _, name := range filter {
			for _, wid := range st.byName[name] {
				sc.slots[wid].allowed = sc.epoch
			}
		}
	}
	cur, n := st.childOf(0, st.nodes.at(0), ns)
	if cur == 0 {
		return dst
	}
	// Marks of the workers still matching equal next. The base of a run is the
	// last node whose holders were stepped one by one; the spilled nodes after it
	// held by the same workers, on any tiers, form the run. Every worker still
	// matching holds all of them, so a run counts tiers by position in base's
	// holder list, a few word operations per node for 64 holders, and marks move
	// when it ends. Nodes with one or two holders are stepped: that costs as
	// little as counting.
	var next uint64
	run := 0
	for d, key := range keys {
		if cur, n = st.childOf(cur, n, key); cur == 0 {
			break
		}
		if d == 0 {
			next = uint64(sc.epoch)<<32 | 1
			sc.admit(st, n, filter != nil, next)
			if len(sc.touched) == 0 {
				return dst
			}
			sc.startRun(st, n, next)
			continue
		}
		if sc.baseIDs != nil && n.more != 0 {
			if s := &st.sets[n.more]; sameIDs(s.ids, sc.baseIDs) {
				sc.count(s.planes)
				run++
				continue
			}
		}
		if run > 0 {
			sc.settle(run)
			next += uint64(run)
			run = 0
		}
		if !sc.step(st, n, next) {
			break
		}
		next++
		sc.startRun(st, n, next)
	}
	if run > 0 {
		sc.settle(run)
	}
	sc.baseIDs = nil
	// The answer goes in WorkerKey order: the touched workers sorted by rank, or,
	// when they are a good part of all workers, the workers walked in order
	// (cheaper than sorting them: a prompt every worker holds touches them all).
	if len(st.order) > 8*len(sc.touched) {
		slices.Sort(sc.touched)
		for _, t := range sc.touched {
			dst = sc.appendMatch(dst, st, uint32(t))
		}
		return dst
	}
	for _, wid := range st.order {
		if uint32(sc.slots[wid].mark>>32) == sc.epoch {
			dst = sc.appendMatch(dst, st, wid)
		}
	}
	return dst
}

func (sc *matchScratch) appendMatch(dst []WorkerMatch, st *state, wid uint32) []WorkerMatch {
	s := &sc.slots[wid]
	return append(dst, WorkerMatch{
		Worker:  st.workers[wid].key,
		Blocks:  int(uint32(s.mark)),
		PerTier: [NumTiers]int{int(s.tiers[0]), int(s.tiers[1]), int(s.tiers[2])},
	})
}

// admit starts the count of the holders of the prompt's first block.
func (sc *matchScratch) admit(st *state, n *node, filtered bool, mark uint64) {
	if n.more == 0 {
		for _, r := range n.holders {
			if r != 0 {
				sc.admitOne(r>>3, uint8(r&7), filtered, mark, st.rank)
			}
		}
		return
	}
	s := &st.sets[n.more]
	for i, wid := range s.ids {
		sc.admitOne(wid, s.mask(i), filtered, mark, st.rank)
	}
}

func (sc *matchScratch) admitOne(wid uint32, mask uint8, filtered bool, mark uint64, rank []uint32) {
	s := &sc.slots[wid]
	if filtered && s.allowed != sc.epoch {
		return
	}
	s.mark = mark
	s.tiers = [NumTiers]int32{}
	s.tiers[fastestTier[mask]] = 1
	sc.touched = append(sc.touched, uint64(rank[wid])<<32|uint64(wid))
}

// startRun makes node n, just stepped, the base of a run.
func (sc *matchScratch) startRun(st *state, n *node, want uint64) {
	sc.baseIDs, sc.want = nil, want
	if n.more != 0 {
		sc.baseIDs = st.sets[n.more].ids
	}
}

// step advances, by one block of node n, the holders still matching (mark ==
// want); it reports whether any did.
func (sc *matchScratch) step(st *state, n *node, want uint64) bool {
	slots := sc.slots // a local slice keeps base and length in registers
	advanced := 0
	if n.more == 0 {
		for _, r := range n.holders {
			if s := &slots[r>>3]; s.mark == want && r != 0 {
				s.mark = want + 1
				s.tiers[fastestTier[r&7]]++
				advanced++
			}
		}
		return advanced != 0
	}
	set := &st.sets[n.more]
	for i, wid := range set.ids {
		if s := &slots[wid]; s.mark == want {
			s.mark = want + 1
			s.tiers[fastestTier[set.mask(i)]]++
			advanced++
		}
	}
	return advanced != 0
}

// count counts one block with tier planes planes in the run: per word group,
// the plane of the holders whose fastest tier is the GPU and that of those
// whose fastest is the CPU go into the bit-sliced counters. With tiers varying
// from block to block this is where Match spends its time.
func (sc *matchScratch) count(planes []uint64) {
	if sc.counted == maxCounted {
		sc.settle(0)
	}
	sc.counted++
	if slices.Equal(planes, sc.last) {
		sc.repeats++
		return
	}
	if sc.repeats > 0 {
		sc.addRepeats()
	}
	for g := range len(planes) / NumTiers {
		p := planes[NumTiers*g:][:NumTiers]
		addPlanes((*[countWords]uint64)(sc.counts[countWords*g:]), 0, p[TierGPU], p[TierCPU]&^p[TierGPU])
	}
	sc.last = planes
}

// addRepeats adds the repeated planes of the latest block to the counts, at the
// levels of the bits of repeats.
func (sc *matchScratch) addRepeats() {
	for g := range len(sc.last) / NumTiers {
		p := sc.last[NumTiers*g:][:NumTiers]
		c := (*[countWords]uint64)(sc.counts[countWords*g:])
		for level, times := 0, sc.repeats; times != 0; level, times = level+1, times>>1 {
			if times&1 != 0 {
				addPlanes(c, 2*level, p[TierGPU], p[TierCPU]&^p[TierGPU])
			}
		}
	}
	sc.repeats = 0
}

// addPlanes adds gpu and cpu, one bit per position, to their bit-sliced
// counters from word from on: a ripple carry that stops when no position
// carries any more (one loop for both, one mispredicted exit). The counts stay
// below 1<<countLevels (maxCounted), so it never carries out of the last level.
func addPlanes(levels *[countWords]uint64, from int, gpu, cpu uint64) {
	for k := from; gpu|cpu != 0 && k < countWords; k += 2 {
		levels[k], gpu = levels[k]^gpu, levels[k]&gpu
		levels[k+1], cpu = levels[k+1]^cpu, levels[k+1]&cpu
	}
}

// settle credits the run's counts to the holders of its base still matching
// (mark == want), moves their marks by advance blocks and clears the counts.
func (sc *matchScratch) settle(advance int) {
	sc.addRepeats()
	sc.last = nil
	ids := sc.baseIDs
	counted := int32(sc.counted)
	for g := range planeGroups(len(ids)) {
		c := (*[countWords]uint64)(sc.counts[countWords*g:])
		var gpu, cpu [8]uint64
		for k := range countLevels {
			gpu[k], cpu[k] = c[2*k], c[2*k+1]
		}
		gpu, cpu = columnCounts(gpu), columnCounts(cpu)
		for i, wid := range ids[64*g : min(len(ids), 64*g+64)] {
			s := &sc.slots[wid]
			if s.mark != sc.want {
				continue
			}
			s.mark += uint64(advance)
			onGPU := int32(gpu[i/8] >> (8 * (i % 8)) & 0xFF)
			onCPU := int32(cpu[i/8] >> (8 * (i % 8)) & 0xFF)
			s.tiers[TierGPU] += onGPU
			s.tiers[TierCPU] += onCPU
			s.tiers[TierDisk] += counted - onGPU - onCPU
		}
		clear(c[:])
	}
	sc.counted = 0
}

// columnCounts turns bit-sliced counters of 64 positions into plain ones: byte
// i%8 of out[i/8] is position i's count. That is a transposition of the 8x64
// bit matrix of levels (level k of position i is bit i of levels[k]): first
// of its 8x8 bytes (word k, byte q becomes word q, byte k), then of the bits
// within each word.
func columnCounts(out [8]uint64) [8]uint64 {
	for _, s := range [...]struct {
		rows  int
		shift uint
		mask  uint64
	}{{1, 8, 0x00FF00FF00FF00FF}, {2, 16, 0x0000FFFF0000FFFF}, {4, 32, 0x00000000FFFFFFFF}} {
		for k := range out {
			if k&s.rows == 0 {
				a, b := out[k], out[k+s.rows]
				t := (a>>s.shift ^ b) & s.mask
				out[k], out[k+s.rows] = a^t<<s.shift, b^t
			}
		}
	}
	for q, x := range out {
		out[q] = transpose8(x)
	}
	return out
}

// transpose8 transposes the 8x8 bit matrix x (byte r is row r, bit c of it
// column c). Hacker's Delight, 7-3.
func transpose8(x uint64) uint64 {
	t := (x ^ x>>7) & 0x00AA00AA00AA00AA
	x ^= t ^ t<<7
	t = (x ^ x>>14) & 0x0000CCCC0000CCCC
	x ^= t ^ t<<14
	t = (x ^ x>>28) & 0x00000000F0F0F0F0
	return x ^ t ^ t<<28
}

// scratchPool keeps a few matchScratch for reuse. Unlike sync.Pool it never drops
// them at random (the race detector's sync.Pool does), so Match stays
// allocation-free in every build.
type scratchPool struct {
	free [8]atomic.Pointer[matchScratch]
}

func (p *scratchPool) put(sc *matchScratch) {
	for i := range p.free {
		if p.free[i].CompareAndSwap(nil, sc) {
			return
		}
	}
}

func (ix *Index) getScratch(workers int) *matchScratch {
	var sc *matchScratch
	for i := range ix.scratch.free {
		if sc = ix.scratch.free[i].Swap(nil); sc != nil {
			break
		}
	}
	if sc == nil {
		sc = &matchScratch{}
	}
	if len(sc.slots) < workers {
		sc.slots = make([]matchSlot, workers+workers/4)
		sc.counts = make([]uint64, countWords*planeGroups(len(sc.slots)))
		sc.epoch = 0
	}
	sc.epoch++
	if sc.epoch == 0 { // wrapped: old marks could collide with new epochs
		clear(sc.slots)
		sc.epoch = 1
	}
	sc.touched = sc.touched[:0]
	return sc
}
