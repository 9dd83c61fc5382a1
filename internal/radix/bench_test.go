package radix

import (
	"bytes"
	"fmt"
	"io"
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
	hot     benchPrompt // cached on all 64 workers, stored whole by each
	mixed   benchPrompt // cached on all 64 workers, stored block by block in shuffled worker order
	varied  benchPrompt // cached on all 64 workers, worker w holding block i on tier (w+i)%3
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
		// Block by block, each block's holders stored in a different order: the
		// holder lists are kept sorted whatever the order, so this is one run of
		// identical nodes (Match counts repeats, not holders).
		mixed := benchUniverse(rng, 1, false)[0]
		for i, h := range mixed.hashes {
			for _, w := range rng.Perm(benchWorkers) {
				if _, err := ix.Stored(benchWorker(w), benchNS, mixed.hashes[max(i-1, 0)], i > 0, []uint64{h}, mixed.keys[i:i+1], Tier(w%NumTiers)); err != nil {
					b.Fatal(err)
				}
			}
		}
		// Tiers change from block to block: the holders stay the same but every
		// node's tier planes differ from its parent's, so each block is counted
		// (a few word operations per 64 holders), not repeated.
		varied := benchUniverse(rng, 1, false)[0]
		for w := range benchWorkers {
			for i, h := range varied.hashes {
				if _, err := ix.Stored(benchWorker(w), benchNS, varied.hashes[max(i-1, 0)], i > 0, []uint64{h}, varied.keys[i:i+1], Tier((w+i)%NumTiers)); err != nil {
					b.Fatal(err)
				}
			}
		}
		matchFleet.ix, matchFleet.prompts, matchFleet.hot, matchFleet.mixed, matchFleet.varied = ix, prompts, hot, mixed, varied
	})
}

// BenchmarkMatch: a 128-block prompt against 64 workers and 1.0M indexed blocks.
// "indexed" asks for prompts of the fleet (1-4 holders beyond the shared system
// prompt); "all-64" for a prompt every worker holds entirely; "all-64-shuffled"
// the same, stored in a different worker order at every block;
// "all-64-tiers-vary" the same with tiers changing from block to block, so that
// every block's tiers are counted: the worst case; "miss" for a prompt
// nobody holds. Reports p50/p99 of
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
		{"all-64-shuffled", func(int) []uint64 { return matchFleet.mixed.keys }},
		{"all-64-tiers-vary", func(int) []uint64 { return matchFleet.varied.keys }},
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

// eventLog is a pre-generated sequence of Stored and Removed events, free of
// pointers so the garbage collector does not scan it while the index is measured.
type eventLog struct {
	events       []applyEvent
	hashes, keys []uint64 // the events' blocks, by offset; keys unused for Removed
	blocks       int
}

type applyEvent struct {
	worker           int32
	store, hasParent bool
	parent           uint64
	off, n           int32
}

func (l *eventLog) add(worker int, store, hasParent bool, parent uint64, hashes, keys []uint64) {
	l.events = append(l.events, applyEvent{worker: int32(worker), store: store, hasParent: hasParent,
		parent: parent, off: int32(len(l.hashes)), n: int32(len(hashes))})
	l.hashes = append(l.hashes, hashes...)
	if keys == nil {
		keys = make([]uint64, len(hashes))
	}
	l.keys = append(l.keys, keys...)
	l.blocks += len(hashes)
}

func (l *eventLog) apply(ix *Index, workers []WorkerKey) error {
	for _, e := range l.events {
		hashes := l.hashes[e.off : e.off+e.n]
		var err error
		if e.store {
			_, err = ix.Stored(workers[e.worker], benchNS, e.parent, e.hasParent, hashes, l.keys[e.off:e.off+e.n], TierGPU)
		} else {
			_, err = ix.Removed(workers[e.worker], hashes, TierGPU)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// applyBatched applies the log with ApplyOps, one batch per run of consecutive
// events of one worker (a request's events in genApplyEvents), as ingest hands
// over the events of one engine batch.
func (l *eventLog) applyBatched(ix *Index, workers []WorkerKey) error {
	var ops []Op
	for start := 0; start < len(l.events); {
		w := l.events[start].worker
		ops = ops[:0]
		end := start
		for ; end < len(l.events) && l.events[end].worker == w; end++ {
			e := l.events[end]
			op := Op{Kind: OpRemoved, Hashes: l.hashes[e.off : e.off+e.n], Tier: TierGPU}
			if e.store {
				op = Op{Kind: OpStored, Namespace: benchNS, Parent: e.parent, HasParent: e.hasParent,
					Hashes: op.Hashes, Keys: l.keys[e.off : e.off+e.n], Tier: TierGPU}
			}
			ops = append(ops, op)
		}
		if res := ix.ApplyOps(workers[w], ops); res.Err != nil {
			return res.Err
		}
		start = end
	}
	return nil
}

// batches counts the batches applyBatched makes.
func (l *eventLog) batches() int {
	n := 0
	for i, e := range l.events {
		if i == 0 || e.worker != l.events[i-1].worker {
			n++
		}
	}
	return n
}

// oneBlockEach returns the same blocks with one block per event, the worst case
// for per-call costs (locking, worker lookup, no overlap of cache misses).
func (l *eventLog) oneBlockEach() *eventLog {
	out := &eventLog{hashes: l.hashes, keys: l.keys, blocks: l.blocks}
	for _, e := range l.events {
		parent, hasParent := e.parent, e.hasParent
		for i := e.off; i < e.off+e.n; i++ {
			one := applyEvent{worker: e.worker, store: e.store, off: i, n: 1}
			if e.store {
				one.parent, one.hasParent = parent, hasParent
				parent, hasParent = l.hashes[i], true
			}
			out.events = append(out.events, one)
		}
	}
	return out
}

// genApplyEvents simulates engines: each of 64 workers keeps a FIFO cache of
// capacity blocks; a request stores the prompt blocks the worker lacks (one event
// per run of missing blocks), then benchDecodeSteps single-block decode events;
// evictions go out in events of 8.
func genApplyEvents(rng *rand.Rand, requests, capacity int) *eventLog {
	prompts := benchUniverse(rng, requests/2, true)
	type fifo struct {
		held  map[uint64]bool
		order []uint64
	}
	workers := make([]fifo, benchWorkers)
	for i := range workers {
		workers[i].held = map[uint64]bool{}
	}
	log := &eventLog{}
	for r := range requests {
		w := rng.IntN(benchWorkers)
		f := &workers[w]
		p := prompts[rng.IntN(len(prompts))]
		if r < len(prompts) {
			p = prompts[r] // every prompt is new once
		}
		// Store each run of blocks the worker lacks under the block before it.
		var stored []uint64
		for i := 0; i < len(p.hashes); {
			if f.held[p.hashes[i]] {
				i++
				continue
			}
			j := i
			for j < len(p.hashes) && !f.held[p.hashes[j]] {
				j++
			}
			var parent uint64
			if i > 0 {
				parent = p.hashes[i-1]
			}
			log.add(w, true, i > 0, parent, p.hashes[i:j], p.keys[i:j])
			stored = append(stored, p.hashes[i:j]...)
			i = j
		}
		parent := p.hashes[len(p.hashes)-1]
		for range benchDecodeSteps {
			h, k := rng.Uint64(), rng.Uint64()
			log.add(w, true, true, parent, []uint64{h}, []uint64{k})
			stored = append(stored, h)
			parent = h
		}
		for _, h := range stored {
			f.held[h] = true
			f.order = append(f.order, h)
		}
		for len(f.held) > capacity {
			n := min(8, len(f.held)-capacity)
			for _, h := range f.order[:n] {
				delete(f.held, h)
			}
			log.add(w, false, false, 0, f.order[:n], nil)
			f.order = f.order[n:]
		}
	}
	return log
}

// BenchmarkApply: Stored/Removed block events applied by one goroutine, from
// empty to a steady state of 64 workers x 16384 cached blocks. "fleet" has the
// generator's events (~10 blocks each on average); "one-block" the same blocks one
// per event. Each is applied one call per event, and "batched": with ApplyOps,
// one call per request's events.
func BenchmarkApply(b *testing.B) {
	fleet := genApplyEvents(rand.New(rand.NewPCG(3, 4)), 40000, 16384)
	oneBlock := fleet.oneBlockEach()
	workers := make([]WorkerKey, benchWorkers)
	for i := range workers {
		workers[i] = benchWorker(i)
	}
	for _, bc := range []struct {
		name    string
		log     *eventLog
		batched bool
	}{
		{"fleet", fleet, false},
		{"one-block", oneBlock, false},
		{"fleet-batched", fleet, true},
		{"one-block-batched", oneBlock, true},
	} {
		b.Run(bc.name, func(b *testing.B) {
			apply := bc.log.apply
			if bc.batched {
				apply = bc.log.applyBatched
				b.ReportMetric(float64(bc.log.blocks)/float64(bc.log.batches()), "block-events/batch")
			}
			var stats Stats
			for range b.N {
				b.StopTimer()
				ix := New(Config{})
				runtime.GC()
				b.StartTimer()
				if err := apply(ix, workers); err != nil {
					b.Fatal(err)
				}
				stats = ix.Stats()
			}
			b.StopTimer()
			if stats.StoredDetached != 0 || stats.RemovedUnknown != 0 || stats.StoredDuplicate != 0 {
				b.Fatalf("generator out of step with the index: %+v", stats)
			}
			b.ReportMetric(float64(bc.log.blocks)*float64(b.N)/b.Elapsed().Seconds(), "block-events/s")
			b.ReportMetric(float64(len(bc.log.events)), "events/op")
			b.ReportMetric(float64(bc.log.blocks), "block-events/op")
		})
	}
}

// BenchmarkMemory reports live heap per (block, worker) residency after GC, for
// the Match fleet ("mixed"), for blocks each held by exactly one worker
// ("unshared": every residency pays for its node) and for the end state of
// BenchmarkApply's churn ("after-churn": tables and arena sized by their peak).
func BenchmarkMemory(b *testing.B) {
	workers := make([]WorkerKey, benchWorkers)
	for i := range workers {
		workers[i] = benchWorker(i)
	}
	fleet := func(share bool, spread func(*rand.Rand) int) func(b *testing.B) (func() *Index, any) {
		return func(b *testing.B) (func() *Index, any) {
			rng := rand.New(rand.NewPCG(5, 6))
			prompts := benchUniverse(rng, benchPrompts, share)
			return func() *Index { return buildBenchIndex(b, prompts, rng, spread) }, prompts
		}
	}
	for _, bc := range []struct {
		name    string
		prepare func(b *testing.B) (build func() *Index, input any)
	}{
		{"mixed", fleet(true, holdersPerPrompt)},
		{"unshared", fleet(false, func(*rand.Rand) int { return 1 })},
		{"after-churn", func(b *testing.B) (func() *Index, any) {
			log := genApplyEvents(rand.New(rand.NewPCG(3, 4)), 40000, 16384)
			return func() *Index {
				ix := New(Config{})
				if err := log.apply(ix, workers); err != nil {
					b.Fatal(err)
				}
				return ix
			}, log
		}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			for range b.N {
				build, input := bc.prepare(b)
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				ix := build()
				runtime.GC()
				runtime.ReadMemStats(&after)
				s := ix.Stats()
				heap := float64(after.HeapAlloc - before.HeapAlloc)
				b.ReportMetric(heap/float64(s.Residencies), "B/residency")
				b.ReportMetric(heap/float64(s.Nodes), "B/node")
				b.ReportMetric(float64(s.Residencies), "residencies")
				runtime.KeepAlive(ix)
				runtime.KeepAlive(input)
			}
		})
	}
}

// BenchmarkSnapshot writes and restores the Match fleet (1.0M nodes, 64 workers).
// "Snapshot" is the copy WriteTo takes under the read lock, the time writers
// wait; "writer-stall" measures that wait from a writer's side: the longest a
// write (a Removed of an unknown hash) takes while WriteTo runs.
func BenchmarkSnapshot(b *testing.B) {
	loadMatchFleet(b)
	ix := matchFleet.ix
	var buf bytes.Buffer
	if _, err := ix.WriteTo(&buf); err != nil {
		b.Fatal(err)
	}
	b.Run("Snapshot", func(b *testing.B) {
		for range b.N {
			runtime.KeepAlive(ix.Snapshot())
		}
	})
	b.Run("WriteTo", func(b *testing.B) {
		for range b.N {
			if _, err := ix.WriteTo(io.Discard); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(buf.Len())/(1<<20), "MiB")
	})
	b.Run("writer-stall", func(b *testing.B) {
		var worst time.Duration
		for range b.N {
			done := make(chan error)
			go func() {
				_, err := ix.WriteTo(io.Discard)
				done <- err
			}()
			for writing := true; writing; {
				select {
				case err := <-done:
					if err != nil {
						b.Fatal(err)
					}
					writing = false
				default:
					t0 := time.Now()
					if _, err := ix.Removed(benchWorker(0), []uint64{0}, TierGPU); err != nil {
						b.Fatal(err)
					}
					worst = max(worst, time.Since(t0))
				}
			}
		}
		b.ReportMetric(float64(worst.Microseconds())/1000, "max-stall-ms")
	})
	b.Run("ReadFrom", func(b *testing.B) {
		for range b.N {
			if _, err := New(Config{}).ReadFrom(bytes.NewReader(buf.Bytes())); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkGrowth fills an empty index with 3M residencies of fresh 16-block
// prompts over 16 workers and reports the longest single Stored call: the
// longest every Match waits behind the write lock while the index grows to a
// size it has not had before (the node arena, edge table and the workers' block
// tables all grow on the way).
func BenchmarkGrowth(b *testing.B) {
	const total, chain, workers = 3_000_000, 16, 16
	var worst time.Duration
	for range b.N {
		ix := New(Config{})
		rng := rand.New(rand.NewPCG(1, 2))
		hashes, keys := make([]uint64, chain), make([]uint64, chain)
		for n := 0; n < total; n += chain {
			for i := range chain {
				hashes[i], keys[i] = rng.Uint64(), rng.Uint64()
			}
			t0 := time.Now()
			if _, err := ix.Stored(benchWorker(rng.IntN(workers)), benchNS, 0, false, hashes, keys, TierGPU); err != nil {
				b.Fatal(err)
			}
			worst = max(worst, time.Since(t0))
		}
	}
	b.ReportMetric(float64(worst.Microseconds())/1000, "max-stall-ms")
}
