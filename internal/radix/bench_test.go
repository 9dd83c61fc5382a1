package radix

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"
)

// The benchmark fleet: 64 workers; prompts of 128 blocks made of one of 64 shared
// 16-block system prompts plus 112 blocks of their own; each prompt is cached on 1
// (70%), 2 (20%) or 4 (10%) workers. 8920 prompts make 1.0M distinct blocks.
const (
	benchWorkers     = 64
	benchSystems     = 64
	benchSystemLen   = 16
	benchPromptLen   = 128
	benchPrompts     = 8920
	benchNS          = uint64(0xBE7C4)
	benchDecodeSteps = 8
)

type benchPrompt struct {
	keys, hashes []uint64
}

// benchUniverse generates n prompts; engine hashes are chained from keys, so the
// same block has the same engine hash on every worker, as with vLLM.
func benchUniverse(rng *rand.Rand, n int, shareSystem bool) []benchPrompt {
	systems := make([][]uint64, benchSystems)
	for i := range systems {
		systems[i] = make([]uint64, benchSystemLen)
		for j := range systems[i] {
			systems[i][j] = rng.Uint64()
		}
	}
	prompts := make([]benchPrompt, n)
	for i := range prompts {
		p := benchPrompt{keys: make([]uint64, benchPromptLen), hashes: make([]uint64, benchPromptLen)}
		for j := range p.keys {
			p.keys[j] = rng.Uint64()
		}
		if shareSystem {
			copy(p.keys, systems[rng.IntN(benchSystems)])
		}
		prev := uint64(0)
		for j, k := range p.keys {
			prev = (prev^k)*0x9E3779B97F4A7C15 + 1
			p.hashes[j] = prev
		}
		prompts[i] = p
	}
	return prompts
}

func benchWorker(i int) WorkerKey { return WorkerKey{Worker: fmt.Sprintf("worker-%02d", i)} }

// holdersPerPrompt returns how many workers cache one prompt: 1, 2 or 4.
func holdersPerPrompt(rng *rand.Rand) int {
	switch r := rng.IntN(10); {
	case r < 7:
		return 1
	case r < 9:
		return 2
	}
	return 4
}

func buildBenchIndex(tb testing.TB, prompts []benchPrompt, rng *rand.Rand, spread func(*rand.Rand) int) *Index {
	ix := New(Config{})
	for _, p := range prompts {
		for _, w := range rng.Perm(benchWorkers)[:spread(rng)] {
			if _, err := ix.Stored(benchWorker(w), benchNS, 0, false, p.hashes, p.keys, TierGPU); err != nil {
				tb.Fatal(err)
			}
		}
	}
	return ix
}

var matchFleet struct {
	once    sync.Once
	ix      *Index
	prompts []benchPrompt
	hot     benchPrompt // cached on all 64 workers
}

func loadMatchFleet(b *testing.B) {
	matchFleet.once.Do(func() {
		rng := rand.New(rand.NewPCG(1, 2))
		prompts := benchUniverse(rng, benchPrompts, true)
		ix := buildBenchIndex(b, prompts, rng, holdersPerPrompt)
		hot := benchUniverse(rng, 1, false)[0]
		for w := range benchWorkers {
			if _, err := ix.Stored(benchWorker(w), benchNS, 0, false, hot.hashes, hot.keys, Tier(w%NumTiers)); err != nil {
				b.Fatal(err)
			}
		}
		matchFleet.ix, matchFleet.prompts, matchFleet.hot = ix, prompts, hot
	})
}

// BenchmarkMatch: a 128-block prompt against 64 workers and 1.0M indexed blocks.
// "indexed" asks for prompts of the fleet (1-4 holders beyond the shared system
// prompt); "all-64" asks for a prompt every worker holds entirely (64 x 128 holder
// steps, the worst case); "miss" for a prompt nobody holds. Reports p50/p99 of
// single calls measured one by one.
func BenchmarkMatch(b *testing.B) {
	loadMatchFleet(b)
	s := matchFleet.ix.Stats()
	b.Logf("index: %d workers, %d nodes, %d residencies", s.Workers, s.Nodes, s.Residencies)
	miss := benchUniverse(rand.New(rand.NewPCG(9, 9)), 1, false)[0]
	for _, bc := range []struct {
		name   string
		prompt func(i int) []uint64
	}{
		{"indexed", func(i int) []uint64 { return matchFleet.prompts[(i*7919)%len(matchFleet.prompts)].keys }},
		{"all-64", func(int) []uint64 { return matchFleet.hot.keys }},
		{"miss", func(int) []uint64 { return miss.keys }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			ix := matchFleet.ix
			dst := make([]WorkerMatch, 0, benchWorkers)
			lat := make([]time.Duration, 0, b.N)
			matched := 0
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				keys := bc.prompt(i)
				t0 := time.Now()
				dst = ix.Match(benchNS, keys, nil, dst)
				lat = append(lat, time.Since(t0))
				matched += len(dst)
			}
			b.StopTimer()
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-ns")
			b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds()), "p99-ns")
			b.ReportMetric(float64(lat[len(lat)*999/1000].Nanoseconds()), "p99.9-ns")
			b.ReportMetric(float64(matched)/float64(b.N), "workers/match")
		})
	}
}

// applyEvent is one pre-generated Stored or Removed.
type applyEvent struct {
	w         WorkerKey
	parent    uint64
	hasParent bool
	hashes    []uint64
	keys      []uint64 // nil for Removed
}

// genApplyEvents simulates engines: each of 64 workers keeps a FIFO cache of
// capacity blocks; a request stores the prompt blocks the worker lacks (one event
// per run of missing blocks), then
// benchDecodeSteps single-block decode events; evictions go out in events of 8.
func genApplyEvents(rng *rand.Rand, requests, capacity int) (events []applyEvent, blockEvents int) {
	prompts := benchUniverse(rng, requests/2, true)
	type lru struct {
		held  map[uint64]bool
		order []uint64
	}
	workers := make([]lru, benchWorkers)
	for i := range workers {
		workers[i].held = map[uint64]bool{}
	}
	for r := range requests {
		wi := rng.IntN(benchWorkers)
		w, l := benchWorker(wi), &workers[wi]
		p := prompts[rng.IntN(len(prompts))]
		if r < len(prompts) {
			p = prompts[r] // every prompt is new once
		}
		// Store each run of blocks the worker lacks under the block before it.
		var stored []uint64
		for i := 0; i < len(p.hashes); {
			if l.held[p.hashes[i]] {
				i++
				continue
			}
			j := i
			for j < len(p.hashes) && !l.held[p.hashes[j]] {
				j++
			}
			ev := applyEvent{w: w, hashes: p.hashes[i:j], keys: p.keys[i:j]}
			if i > 0 {
				ev.parent, ev.hasParent = p.hashes[i-1], true
			}
			events = append(events, ev)
			stored = append(stored, ev.hashes...)
			i = j
		}
		parent := p.hashes[len(p.hashes)-1]
		for range benchDecodeSteps {
			h, k := rng.Uint64(), rng.Uint64()
			events = append(events, applyEvent{w: w, parent: parent, hasParent: true, hashes: []uint64{h}, keys: []uint64{k}})
			stored = append(stored, h)
			parent = h
		}
		for _, h := range stored {
			l.held[h] = true
			l.order = append(l.order, h)
		}
		blockEvents += len(stored)
		for len(l.held) > capacity {
			n := min(8, len(l.held)-capacity)
			gone := l.order[:n:n]
			l.order = l.order[n:]
			for _, h := range gone {
				delete(l.held, h)
			}
			events = append(events, applyEvent{w: w, hashes: gone})
			blockEvents += n
		}
	}
	return events, blockEvents
}

// BenchmarkApply: Stored/Removed block events applied by one goroutine, from
// empty to a steady state of 64 workers x 16384 cached blocks.
func BenchmarkApply(b *testing.B) {
	events, blockEvents := genApplyEvents(rand.New(rand.NewPCG(3, 4)), 40000, 16384)
	var stats Stats
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		ix := New(Config{})
		runtime.GC()
		b.StartTimer()
		for _, e := range events {
			var err error
			if e.keys != nil {
				_, err = ix.Stored(e.w, benchNS, e.parent, e.hasParent, e.hashes, e.keys, TierGPU)
			} else {
				_, err = ix.Removed(e.w, e.hashes, TierGPU)
			}
			if err != nil {
				b.Fatal(err)
			}
		}
		stats = ix.Stats()
	}
	b.StopTimer()
	if stats.StoredDetached != 0 || stats.RemovedUnknown != 0 {
		b.Fatalf("generator out of step with the index: %+v", stats)
	}
	b.ReportMetric(float64(blockEvents)*float64(b.N)/b.Elapsed().Seconds(), "block-events/s")
	b.ReportMetric(float64(len(events)), "events/op")
	b.ReportMetric(float64(blockEvents), "block-events/op")
	b.Logf("end state: %d nodes, %d residencies", stats.Nodes, stats.Residencies)
}

// BenchmarkMemory reports live heap per (block, worker) residency after GC, for
// the Match fleet ("mixed") and for blocks each held by exactly one worker
// ("unshared", the worst case: every residency pays for its node).
func BenchmarkMemory(b *testing.B) {
	for _, bc := range []struct {
		name   string
		share  bool
		spread func(*rand.Rand) int
	}{
		{"mixed", true, holdersPerPrompt},
		{"unshared", false, func(*rand.Rand) int { return 1 }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			for range b.N {
				rng := rand.New(rand.NewPCG(5, 6))
				prompts := benchUniverse(rng, benchPrompts, bc.share)
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				ix := buildBenchIndex(b, prompts, rng, bc.spread)
				runtime.GC()
				runtime.ReadMemStats(&after)
				s := ix.Stats()
				heap := float64(after.HeapAlloc - before.HeapAlloc)
				b.ReportMetric(heap/float64(s.Residencies), "B/residency")
				b.ReportMetric(heap/float64(s.Nodes), "B/node")
				b.ReportMetric(float64(s.Residencies), "residencies")
				runtime.KeepAlive(ix)
				runtime.KeepAlive(prompts)
			}
		})
	}
}
