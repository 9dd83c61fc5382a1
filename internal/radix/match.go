package radix

import (
	"math/bits"
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
}

type matchSlot struct {
	mark    uint64
	allowed uint32   // epoch of the call whose filter admits this worker
	tiers   [4]int32 // [NumTiers] rounded up so a 2-bit index needs no bounds check
}

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
	// Marks of the workers still matching equal next. stepped is the last node
	// whose holders were examined; run counts the nodes after it with an identical
	// holder list (same workers, tiers and order: chains stored together), which
	// advance exactly the same workers and are credited in one pass.
	var next uint64
	var stepped uint32
	run := uint64(0)
	for d, key := range keys {
		if cur = st.child(cur, key); cur == 0 {
			break
		}
		n := &st.nodes[cur]
		if d == 0 {
			next = uint64(sc.epoch)<<32 | 1
			sc.admit(n.holders, filter != nil, next, st.rank)
			for _, r := range st.moreHolders(n) {
				sc.admit([2]uint32{r}, filter != nil, next, st.rank)
			}
			if len(sc.touched) == 0 {
				return dst
			}
			stepped = cur
			continue
		}
		if st.sameHolders(stepped, cur) {
			run++
			continue
		}
		if run > 0 {
			sc.credit(&st.nodes[stepped], st.moreHolders(&st.nodes[stepped]), next, run)
			next += run
			run = 0
		}
		if !sc.step(n, st.moreHolders(n), next) {
			break
		}
		next++
		stepped = cur
	}
	if run > 0 {
		sc.credit(&st.nodes[stepped], st.moreHolders(&st.nodes[stepped]), next, run)
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
		s.tiers = [4]int32{}
		s.tiers[bits.TrailingZeros32(r)&3] = 1
		sc.touched = append(sc.touched, uint64(rank[wid])<<32|uint64(wid))
	}
}

// step advances, by one block of node n, the holders still matching (mark ==
// want); it reports whether any did. This loop is where a Match over many
// holders spends its time.
func (sc *matchScratch) step(n *node, more []uint32, want uint64) bool {
	slots := sc.slots // a local slice keeps base and length in registers
	advanced := 0
	for _, r := range n.holders {
		if s := &slots[r>>3]; s.mark == want && r != 0 {
			s.mark = want + 1
			s.tiers[bits.TrailingZeros32(r)&3]++
			advanced++
		}
	}
	for _, r := range more {
		if s := &slots[r>>3]; s.mark == want {
			s.mark = want + 1
			s.tiers[bits.TrailingZeros32(r)&3]++
			advanced++
		}
	}
	return advanced != 0
}

// credit advances by run blocks the holders of n still matching (mark == want).
func (sc *matchScratch) credit(n *node, more []uint32, want, run uint64) {
	for _, r := range n.holders {
		sc.creditOne(r, want, run)
	}
	for _, r := range more {
		sc.creditOne(r, want, run)
	}
}

func (sc *matchScratch) creditOne(r uint32, want, run uint64) {
	s := &sc.slots[r>>3]
	if s.mark == want && r != 0 {
		s.mark += run
		s.tiers[bits.TrailingZeros32(r)&3] += int32(run)
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
