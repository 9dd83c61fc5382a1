package radix

import (
	"encoding/binary"
	"fmt"
	"math/bits"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// refIndex is a deliberately naive index: every attached block is stored with its
// full path (namespace + keys) as a string, and Match scans everything. It follows
// the rules of doc.go literally.
type refIndex struct {
	maxDetached int
	workers     map[WorkerKey]*refWorker
}

type refWorker struct {
	blocks   map[uint64]refBlock
	detached map[uint64]detachedBlock
}

type refBlock struct {
	path  string
	tiers uint8
}

func newRef(maxDetached int) *refIndex {
	return &refIndex{maxDetached: maxDetached, workers: map[WorkerKey]*refWorker{}}
}

func pathOf(ns uint64, keys ...uint64) string {
	b := binary.LittleEndian.AppendUint64(nil, ns)
	for _, k := range keys {
		b = binary.LittleEndian.AppendUint64(b, k)
	}
	return string(b)
}

func keyBytes(k uint64) string { return string(binary.LittleEndian.AppendUint64(nil, k)) }

func (m *refIndex) stored(w WorkerKey, ns, parent uint64, hasParent bool, hashes, keys []uint64, tier Tier) StoreResult {
	var res StoreResult
	if len(hashes) == 0 {
		return res
	}
	ws := m.workers[w]
	if ws == nil {
		ws = &refWorker{blocks: map[uint64]refBlock{}, detached: map[uint64]detachedBlock{}}
		m.workers[w] = ws
	}
	bit := uint8(1) << tier
	path, attached := pathOf(ns), true
	if hasParent {
		b, ok := ws.blocks[parent]
		path, attached = b.path, ok
	}
	prev := parent
	for i, h := range hashes {
		if attached {
			p := path + keyBytes(keys[i])
			if b, ok := ws.blocks[h]; ok && b.path == p {
				if b.tiers&bit != 0 {
					res.Duplicate++
				} else {
					b.tiers |= bit
					ws.blocks[h] = b
					res.Attached++
				}
			} else {
				_, wasAttached := ws.blocks[h]
				_, wasDetached := ws.detached[h]
				if wasAttached || wasDetached {
					res.Replaced++
				}
				delete(ws.blocks, h)
				delete(ws.detached, h)
				ws.blocks[h] = refBlock{path: p, tiers: bit}
				res.Attached++
				res.Reattached += ws.settle()
			}
			path = p
		} else {
			if d, ok := ws.detached[h]; ok && d.parent == prev && d.key == keys[i] {
				if d.tiers&bit != 0 {
					res.Duplicate++
				} else {
					d.tiers |= bit
					ws.detached[h] = d
					res.Detached++
				}
			} else {
				_, wasAttached := ws.blocks[h]
				_, wasDetached := ws.detached[h]
				if wasAttached || wasDetached {
					res.Replaced++
				}
				delete(ws.blocks, h)
				delete(ws.detached, h)
				if len(ws.detached) >= m.maxDetached {
					res.Dropped++
				} else {
					ws.detached[h] = detachedBlock{parent: prev, key: keys[i], tiers: bit}
					res.Detached++
				}
			}
		}
		prev = h
	}
	return res
}

// settle attaches detached blocks whose parent is attached until none is left.
func (ws *refWorker) settle() int {
	n := 0
	for changed := true; changed; {
		changed = false
		for h, d := range ws.detached {
			if b, ok := ws.blocks[d.parent]; ok {
				ws.blocks[h] = refBlock{path: b.path + keyBytes(d.key), tiers: d.tiers}
				delete(ws.detached, h)
				n++
				changed = true
			}
		}
	}
	return n
}

func (m *refIndex) removed(w WorkerKey, hashes []uint64, tier Tier) RemoveResult {
	var res RemoveResult
	ws := m.workers[w]
	bit := uint8(1) << tier
	for _, h := range hashes {
		switch {
		case ws == nil:
			res.Unknown++
		case ws.blocks[h].tiers&bit != 0:
			b := ws.blocks[h]
			b.tiers &^= bit
			ws.blocks[h] = b
			if b.tiers == 0 {
				delete(ws.blocks, h)
			}
			res.Removed++
		case ws.detached[h].tiers&bit != 0:
			d := ws.detached[h]
			d.tiers &^= bit
			ws.detached[h] = d
			if d.tiers == 0 {
				delete(ws.detached, h)
			}
			res.Removed++
		default:
			res.Unknown++
		}
	}
	return res
}

func (m *refIndex) cleared(w WorkerKey) {
	if ws := m.workers[w]; ws != nil {
		ws.blocks = map[uint64]refBlock{}
		ws.detached = map[uint64]detachedBlock{}
	}
}

func (m *refIndex) removeWorker(name string) {
	for w := range m.workers {
		if w.Worker == name {
			delete(m.workers, w)
		}
	}
}

func (m *refIndex) match(ns uint64, keys []uint64, filter []string) []WorkerMatch {
	var out []WorkerMatch
	for w, ws := range m.workers {
		if filter != nil && !slices.Contains(filter, w.Worker) {
			continue
		}
		held := map[string]uint8{}
		for _, b := range ws.blocks {
			held[b.path] |= b.tiers
		}
		wm := WorkerMatch{Worker: w}
		for i := range keys {
			mask := held[pathOf(ns, keys[:i+1]...)]
			if mask == 0 {
				break
			}
			wm.Blocks++
			wm.PerTier[bits.TrailingZeros8(mask)]++
		}
		if wm.Blocks > 0 {
			out = append(out, wm)
		}
	}
	slices.SortFunc(out, func(a, b WorkerMatch) int { return a.Worker.compare(b.Worker) })
	return out
}

// stats computes the sizes Stats reports, from the paths.
func (m *refIndex) stats() Stats {
	var s Stats
	nodes, namespaces := map[string]bool{}, map[string]bool{}
	for _, ws := range m.workers {
		s.Workers++
		s.Detached += len(ws.detached)
		held := map[string]bool{}
		for _, b := range ws.blocks {
			held[b.path] = true
			for l := 16; l <= len(b.path); l += 8 {
				nodes[b.path[:l]] = true
			}
			namespaces[b.path[:8]] = true
		}
		s.Residencies += len(held)
	}
	s.Nodes, s.Namespaces = len(nodes), len(namespaces)
	return s
}

// heldPaths lists the key sequences of attached blocks, for prompts worth matching.
func (m *refIndex) heldPaths() []string {
	var out []string
	for _, ws := range m.workers {
		for _, b := range ws.blocks {
			out = append(out, b.path)
		}
	}
	slices.Sort(out)
	return out
}

// eventGen produces random event sequences over a small universe, so that paths,
// hashes and workers collide often: duplicates, aliases, orphans, moves.
type eventGen struct {
	rng     *rand.Rand
	names   []string
	ranks   int
	ns      []uint64
	keys    int // key alphabet size
	hashLog map[WorkerKey][]uint64
}

func newEventGen(seed uint64) *eventGen {
	return &eventGen{
		rng:     rand.New(rand.NewPCG(seed, seed^0x5eed)),
		names:   []string{"w-a", "w-b", "w-c", "w-d", "w-e"},
		ranks:   2,
		ns:      []uint64{0x11, 0x22, 0x33},
		keys:    5,
		hashLog: map[WorkerKey][]uint64{},
	}
}

func (g *eventGen) worker() WorkerKey {
	return WorkerKey{Worker: g.names[g.rng.IntN(len(g.names))], DPRank: uint32(g.rng.IntN(g.ranks))}
}

// engineHash mimics an engine: usually a function of parent hash and content, so
// the same block gets the same hash on every worker; sometimes arbitrary, which
// makes aliases and moves.
func (g *eventGen) engineHash(parent, key uint64) uint64 {
	if g.rng.IntN(10) == 0 {
		return uint64(g.rng.IntN(40))
	}
	h := parent*0x9E3779B97F4A7C15 ^ key*0xC2B2AE3D27D4EB4F
	return h ^ h>>29
}

// knownHash returns a hash the worker has been told about before, or a fresh one.
func (g *eventGen) knownHash(w WorkerKey) uint64 {
	if log := g.hashLog[w]; len(log) > 0 && g.rng.IntN(8) != 0 {
		return log[g.rng.IntN(len(log))]
	}
	return uint64(1000 + g.rng.IntN(1000))
}

type event struct {
	kind      string // stored, removed, cleared, remove-worker
	w         WorkerKey
	ns        uint64
	parent    uint64
	hasParent bool
	hashes    []uint64
	keys      []uint64
	tier      Tier
}

func (e event) String() string {
	return fmt.Sprintf("%s %v ns=%x parent=%x/%v hashes=%x keys=%x tier=%v", e.kind, e.w, e.ns, e.parent, e.hasParent, e.hashes, e.keys, e.tier)
}

func (g *eventGen) next() event { return g.nextFor(g.worker()) }

// nextFor returns a random event of worker w.
func (g *eventGen) nextFor(w WorkerKey) event {
	e := event{w: w, tier: Tier(g.rng.IntN(NumTiers))}
	switch r := g.rng.IntN(100); {
	case r < 62:
		e.kind = "stored"
		e.ns = g.ns[g.rng.IntN(len(g.ns))]
		prev := e.ns
		if g.rng.IntN(10) < 6 {
			e.parent, e.hasParent = g.knownHash(e.w), true
			prev = e.parent
		}
		for range 1 + g.rng.IntN(4) {
			k := uint64(1 + g.rng.IntN(g.keys))
			h := g.engineHash(prev, k)
			e.keys = append(e.keys, k)
			e.hashes = append(e.hashes, h)
			g.hashLog[e.w] = append(g.hashLog[e.w], h)
			prev = h
		}
	case r < 95:
		e.kind = "removed"
		for range 1 + g.rng.IntN(3) {
			e.hashes = append(e.hashes, g.knownHash(e.w))
		}
	case r < 98:
		e.kind = "cleared"
	default:
		e.kind = "remove-worker"
	}
	return e
}

func (g *eventGen) prompt(m *refIndex) (uint64, []uint64) {
	ns := g.ns[g.rng.IntN(len(g.ns))]
	var keys []uint64
	if paths := m.heldPaths(); len(paths) > 0 && g.rng.IntN(4) != 0 {
		p := paths[g.rng.IntN(len(paths))]
		ns = binary.LittleEndian.Uint64([]byte(p[:8]))
		for i := 8; i < len(p); i += 8 {
			keys = append(keys, binary.LittleEndian.Uint64([]byte(p[i:i+8])))
		}
		keys = keys[:1+g.rng.IntN(len(keys))] // a prefix of a stored chain
	}
	for range g.rng.IntN(3) {
		keys = append(keys, uint64(1+g.rng.IntN(g.keys)))
	}
	return ns, keys
}

func (g *eventGen) filter() []string {
	switch g.rng.IntN(5) {
	case 0:
		return []string{}
	case 1, 2:
		return []string{g.names[g.rng.IntN(len(g.names))], g.names[g.rng.IntN(len(g.names))], "no-such-worker"}
	}
	return nil
}

func apply(ix *Index, e event) (StoreResult, RemoveResult, error) {
	switch e.kind {
	case "stored":
		res, err := ix.Stored(e.w, e.ns, e.parent, e.hasParent, e.hashes, e.keys, e.tier)
		return res, RemoveResult{}, err
	case "removed":
		res, err := ix.Removed(e.w, e.hashes, e.tier)
		return StoreResult{}, res, err
	case "cleared":
		ix.Cleared(e.w)
	default:
		ix.RemoveWorker(e.w.Worker)
	}
	return StoreResult{}, RemoveResult{}, nil
}

func applyRef(m *refIndex, e event) (StoreResult, RemoveResult) {
	switch e.kind {
	case "stored":
		return m.stored(e.w, e.ns, e.parent, e.hasParent, e.hashes, e.keys, e.tier), RemoveResult{}
	case "removed":
		return StoreResult{}, m.removed(e.w, e.hashes, e.tier)
	case "cleared":
		m.cleared(e.w)
	default:
		m.removeWorker(e.w.Worker)
	}
	return StoreResult{}, RemoveResult{}
}

func sizes(s Stats) Stats { s.Counters = Counters{}; return s }

// TestIndexAgreesWithReferenceModel applies random event sequences to the index and
// the naive model and compares every result, Match answers after every step, and
// sizes and internal invariants along the way.
func TestIndexAgreesWithReferenceModel(t *testing.T) {
	const steps = 4000
	for seed := uint64(1); seed <= 8; seed++ {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			const maxDetached = 6
			g := newEventGen(seed)
			ix, ref := New(Config{MaxDetachedPerWorker: maxDetached}), newRef(maxDetached)
			var dst []WorkerMatch
			var history []string
			fail := func(format string, args ...any) {
				t.Helper()
				tail := history[max(0, len(history)-8):]
				t.Fatalf("seed %d step %d: %s\nlast events:\n  %s", seed, len(history), fmt.Sprintf(format, args...), strings.Join(tail, "\n  "))
			}
			for range steps {
				e := g.next()
				history = append(history, e.String())
				gotS, gotR, err := apply(ix, e)
				if err != nil {
					fail("%s: %v", e, err)
				}
				wantS, wantR := applyRef(ref, e)
				if gotS != wantS || gotR != wantR {
					fail("%s: result %+v %+v, model %+v %+v", e, gotS, gotR, wantS, wantR)
				}
				for range 4 {
					ns, keys := g.prompt(ref)
					filter := g.filter()
					dst = ix.Match(ns, keys, filter, dst)
					want := ref.match(ns, keys, filter)
					if !(len(dst) == 0 && len(want) == 0) && !reflect.DeepEqual(dst, want) {
						fail("Match(%x, %x, %q) = %+v, model %+v", ns, keys, filter, dst, want)
					}
				}
				if got, want := sizes(ix.Stats()), ref.stats(); got != want {
					fail("Stats %+v, model %+v", got, want)
				}
				if len(history)%100 == 0 {
					if err := checkInvariants(ix); err != nil {
						fail("invariant: %v", err)
					}
				}
			}
			if err := checkInvariants(ix); err != nil {
				fail("invariant: %v", err)
			}
			if s := ix.Stats(); s.StoredReplaced == 0 || s.DetachedReattached == 0 || s.StoredDropped == 0 || s.RemovedUnknown == 0 || s.StoredDuplicate == 0 {
				t.Errorf("seed %d did not exercise every path: %+v", seed, s)
			}
		})
	}
}

// FuzzIndexAgreesWithReferenceModel decodes the input into events over a tiny
// universe (3 bytes each) and compares the index with the model after each.
func FuzzIndexAgreesWithReferenceModel(f *testing.F) {
	f.Add([]byte{0x00, 0x11, 0x22, 0x40, 0x13, 0x25, 0x80, 0x11, 0x02, 0xc0, 0x00, 0x00})
	f.Add([]byte{0x41, 0x31, 0x07, 0x01, 0x11, 0x09, 0x81, 0x31, 0x00, 0x01, 0x21, 0x01})
	f.Fuzz(func(t *testing.T, data []byte) {
		const maxDetached = 3
		ix, ref := New(Config{MaxDetachedPerWorker: maxDetached}), newRef(maxDetached)
		workers := []WorkerKey{wA, wA1, wB}
		for i := 0; i+3 <= len(data) && i < 300; i += 3 {
			a, b, c := data[i], data[i+1], data[i+2]
			e := event{w: workers[int(a&3)%len(workers)], tier: Tier(int(a>>2&3) % NumTiers), ns: uint64(1 + a>>4&1)}
			switch a >> 6 {
			case 0, 1: // stored: b = parent hash (0: none) and length, c = keys
				e.kind = "stored"
				e.parent, e.hasParent = uint64(b&7), b&7 != 0
				for k := range 1 + int(b>>3&3) {
					e.keys = append(e.keys, uint64(c>>(2*k)&3))
					e.hashes = append(e.hashes, uint64(1+(int(b>>5)+int(c>>(2*k)&3)+k)%7))
				}
			case 2:
				e.kind = "removed"
				e.hashes = []uint64{uint64(b & 7), uint64(c & 7)}
			default:
				e.kind = []string{"cleared", "remove-worker"}[b&1]
			}
			gotS, gotR, err := apply(ix, e)
			wantS, wantR := applyRef(ref, e)
			if err != nil || gotS != wantS || gotR != wantR {
				t.Fatalf("%s: %+v %+v %v, model %+v %+v", e, gotS, gotR, err, wantS, wantR)
			}
			for ns := uint64(1); ns <= 2; ns++ {
				keys := []uint64{uint64(c & 3), uint64(c >> 2 & 3), uint64(c >> 4 & 3), uint64(c >> 6)}
				got, want := ix.Match(ns, keys, nil, nil), ref.match(ns, keys, nil)
				if len(got)+len(want) > 0 && !reflect.DeepEqual(got, want) {
					t.Fatalf("after %s: Match(%d, %v) = %+v, model %+v", e, ns, keys, got, want)
				}
			}
		}
		if err := checkInvariants(ix); err != nil {
			t.Fatal(err)
		}
	})
}
