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

	// The current run (see Match): its base node, the mark of the workers matching
	// through base, and the counts of the blocks after base. pairs[j] counts
	// positions 2j and 2j+1 of base's holder list (inline holders first), one
	// 32-bit half each, by fastest tier in fields of fieldBits; counted is the
	// number of blocks in them, at most maxCounted. Zero between runs.
	base     *node
	baseMore []uint32
	want     uint64
	pairs    []uint64
	counted  int
}

type matchSlot struct {
	mark    uint64
	allowed uint32 // epoch of the call whose filter admits this worker
	tiers   [NumTiers]int32
}

// fastestTier maps a residency's tier mask to the fastest tier in it (mask 0, an
// empty holder slot, to NumTiers: no caller looks it up). A table, because
// bits.TrailingZeros compiles to BSF for the baseline amd64 target, several
// times slower than this load in the loops below.
var fastestTier = [8]uint8{3, 0, 1, 0, 2, 0, 1, 0}

const (
	fieldBits  = 10
	maxCounted = 1<<fieldBits - 1 // blocks a run counts between two settles
	tierBits   = 7 | 7<<32        // the tier masks of two residencies read as one word
)

// pairTiers[pairIndex(w)] is the count increment for a word w of two residencies:
// one in the field of its fastest tier, in the half of its position; nothing for
// an empty slot.
var pairTiers = func() (t [64]uint64) {
	one := func(mask int) uint64 {
		if mask == 0 {
			return 0
		}
		return 1 << (fieldBits * fastestTier[mask])
	}
	for i := range t {
		t[i] = one(i>>3) | one(i&7)<<32
	}
	return t
}()

// pairIndex gathers the tier masks of the two residencies of w (bits 0-2 and
// 32-34) into 6 bits with one multiplication: low mask << 3 | high mask.
func pairIndex(w uint64) uint64 { return w & gather.mask * gather.mul >> 58 }

// gather holds pairIndex's constants in a variable, not constants: loaded once
// before a loop they stay in registers, where the compiler would rebuild two
// 64-bit immediates every iteration (a fifth of the loop's time).
var gather = struct{ mask, mul uint64 }{tierBits, 1<<61 | 1<<26}

// inlineWord reads a node's two inline holders as one word of the holder list.
func inlineWord(n *node) uint64 { return uint64(n.holders[0]) | uint64(n.holders[1])<<32 }

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
	cur := st.child(0, ns)
	if cur == 0 {
		return dst
	}
	// Marks of the workers still matching equal next. The base of a run is the
	// last node whose holders were stepped one by one; the nodes after it held by
	// the same workers, on any tiers, form the run. Every worker still matching
	// holds all of them, so a run only counts tiers by position in base's holder
	// list, in one branch-free pass per node, and marks move when it ends. A node
	// whose list is identical to the one before (a chain stored whole) costs one
	// comparison: repeats counts them, credited in one pass.
	var next uint64
	var last *node // the run's latest node whose list differs from its predecessor's
	var lastMore []uint32
	run, repeats := 0, 0
	for d, key := range keys {
		if cur = st.child(cur, key); cur == 0 {
			break
		}
		n := &st.nodes[cur]
		more := st.moreHolders(n)
		if d == 0 {
			next = uint64(sc.epoch)<<32 | 1
			sc.admit(n.holders, filter != nil, next, st.rank)
			for _, r := range more {
				sc.admit([2]uint32{r}, filter != nil, next, st.rank)
			}
			if len(sc.touched) == 0 {
				return dst
			}
			sc.base, sc.baseMore, sc.want = n, more, next
			continue
		}
		if last != nil && sameHolders(last, lastMore, n, more) {
			repeats++
			run++
			continue
		}
		if sc.countIfSameWorkers(n, more) {
			sc.countRepeats(last, lastMore, repeats)
			last, lastMore, repeats = n, more, 0
			run++
			continue
		}
		if run > 0 {
			sc.countRepeats(last, lastMore, repeats)
			sc.settle(run)
			next += uint64(run)
			run, repeats, last = 0, 0, nil
		}
		if !sc.step(n, more, next) {
			break
		}
		next++
		sc.base, sc.baseMore, sc.want = n, more, next
	}
	if run > 0 {
		sc.countRepeats(last, lastMore, repeats)
		sc.settle(run)
	}
	slices.Sort(sc.touched)
	for _, t := range sc.touched {
		s := &sc.slots[uint32(t)]
		m := WorkerMatch{Worker: st.workers[uint32(t)].key, Blocks: int(uint32(s.mark))}
		for i := range m.PerTier {
			m.PerTier[i] = int(s.tiers[i])
		}
		dst = append(dst, m)
	}
	sc.base, sc.baseMore = nil, nil
	return dst
}

// admit starts the count of the holders of the prompt's first block.
func (sc *matchScratch) admit(holders [2]uint32, filtered bool, mark uint64, rank []uint32) {
	for _, r := range holders {
		if r == 0 {
			return
		}
		wid := r >> 3
		s := &sc.slots[wid]
		if filtered && s.allowed != sc.epoch {
			continue
		}
		s.mark = mark
		s.tiers = [NumTiers]int32{}
		s.tiers[fastestTier[r&7]] = 1
		sc.touched = append(sc.touched, uint64(rank[wid])<<32|uint64(wid))
	}
}

// step advances, by one block of node n, the holders still matching (mark ==
// want); it reports whether any did.
func (sc *matchScratch) step(n *node, more []uint32, want uint64) bool {
	slots := sc.slots // a local slice keeps base and length in registers
	advanced := 0
	for _, r := range n.holders {
		if s := &slots[r>>3]; s.mark == want && r != 0 {
			s.mark = want + 1
			s.tiers[fastestTier[r&7]]++
			advanced++
		}
	}
	for _, r := range more {
		if s := &slots[r>>3]; s.mark == want {
			s.mark = want + 1
			s.tiers[fastestTier[r&7]]++
			advanced++
		}
	}
	return advanced != 0
}

// countIfSameWorkers counts one block of node n in the run when n is held by the
// same workers as the run's base, on any tiers, and reports whether it is. One
// pass, two holders a word, compares the lists and counts: with tiers varying
// from block to block this loop is where Match spends its time. A list that turns
// out to differ is uncounted again, a second pass only at the end of a run.
func (sc *matchScratch) countIfSameWorkers(n *node, more []uint32) bool {
	b, bMore := sc.base, sc.baseMore
	if len(more) != len(bMore) || n.holders[0] == 0 || (n.holders[1] == 0) != (b.holders[1] == 0) {
		return false
	}
	if sc.counted == maxCounted {
		sc.settle(0)
	}
	inline := inlineWord(n)
	diff := inline ^ inlineWord(b)
	pairs := sc.pairs[:1+(len(more)+1)/2]
	pairs[0] += pairTiers[pairIndex(inline)]
	words, bWords := asWords(more), asWords(bMore)
	bWords = bWords[:len(words)]
	acc := pairs[1:][:len(words)]
	mask, mul := gather.mask, gather.mul // pairIndex, in registers
	for i, w := range words {
		acc[i] += pairTiers[w&mask*mul>>58]
		diff |= w ^ bWords[i]
	}
	if len(more)%2 == 1 {
		w := uint64(more[len(more)-1])
		diff |= w ^ uint64(bMore[len(bMore)-1])
		pairs[len(pairs)-1] += pairTiers[pairIndex(w)]
	}
	if diff&^tierBits != 0 {
		sc.add(n, more, ^uint64(0)) // times -1: the counts wrap back exactly
		return false
	}
	sc.counted++
	return true
}

// countRepeats counts in the run times more blocks with the holders of node n.
func (sc *matchScratch) countRepeats(n *node, more []uint32, times int) {
	for times > 0 {
		if sc.counted == maxCounted {
			sc.settle(0)
		}
		k := min(times, maxCounted-sc.counted)
		sc.add(n, more, uint64(k))
		sc.counted += k
		times -= k
	}
}

// add counts times blocks of node n, held by the run's workers, in the run.
func (sc *matchScratch) add(n *node, more []uint32, times uint64) {
	pairs := sc.pairs[:1+(len(more)+1)/2]
	pairs[0] += pairTiers[pairIndex(inlineWord(n))] * times
	words := asWords(more)
	acc := pairs[1:][:len(words)]
	mask, mul := gather.mask, gather.mul // pairIndex, in registers
	for i, w := range words {
		acc[i] += pairTiers[w&mask*mul>>58] * times
	}
	if len(more)%2 == 1 {
		pairs[len(pairs)-1] += pairTiers[pairIndex(uint64(more[len(more)-1]))] * times
	}
}

// settle credits the run's counts to the holders of its base still matching
// (mark == want), moves their marks by advance blocks and clears the counts.
func (sc *matchScratch) settle(advance int) {
	b, bMore := sc.base, sc.baseMore
	pairs := sc.pairs[:1+(len(bMore)+1)/2]
	sc.take(inlineWord(b), pairs[0], advance)
	words := asWords(bMore)
	for i, w := range words {
		sc.take(w, pairs[1+i], advance)
	}
	if len(bMore)%2 == 1 {
		sc.take(uint64(bMore[len(bMore)-1]), pairs[len(pairs)-1], advance)
	}
	clear(pairs)
	sc.counted = 0
}

// take credits one word of counts to its (up to) two holders.
func (sc *matchScratch) take(holders, counts uint64, advance int) {
	sc.takeOne(uint32(holders), uint32(counts), advance)
	sc.takeOne(uint32(holders>>32), uint32(counts>>32), advance)
}

func (sc *matchScratch) takeOne(r, counts uint32, advance int) {
	if s := &sc.slots[r>>3]; s.mark == sc.want && r != 0 {
		s.mark += uint64(advance)
		s.tiers[0] += int32(counts & maxCounted)
		s.tiers[1] += int32(counts >> fieldBits & maxCounted)
		s.tiers[2] += int32(counts >> (2 * fieldBits))
	}
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
		sc.pairs = make([]uint64, 2+len(sc.slots)/2)
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
