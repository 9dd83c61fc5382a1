package fakeengine

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
)

// TestEventStreamReconstructsCacheContents drives a small two-tier cache with
// concurrent requests sharing prefixes, applies every published event to a model
// of the cache, and checks that the model equals what the engine really holds.
func TestEventStreamReconstructsCacheContents(t *testing.T) {
	cfg := testConfig()
	cfg.NumGPUBlocks = 24
	cfg.NumCPUBlocks = 10
	cfg.MaxNumSeqs = 3
	cfg.MaxNumBatchedTokens = 16 // forces chunked prefill
	cfg.LoRAModules = []string{"sql"}
	e := startEngine(t, cfg)
	sub := subscribe(t, e, 0)

	rng := rand.New(rand.NewPCG(1, 2))
	prefixes := [][]uint32{seqPrompt(0, 24), seqPrompt(40, 16), seqPrompt(90, 32)}
	var reqs []Request
	for i := range 60 {
		pre := prefixes[rng.IntN(len(prefixes))]
		p := slices.Clone(pre[:min(len(pre), 4+rng.IntN(20))])
		p = append(p, seqPrompt(150+i, 1+rng.IntN(10))...)
		r := Request{Prompt: p, MaxTokens: 1 + rng.IntN(6)}
		if i%7 == 0 {
			r.Model = "sql"
		}
		if i%11 == 0 {
			r.CacheSalt = "s"
		}
		reqs = append(reqs, r)
	}
	var wg sync.WaitGroup
	var cached atomic.Int64
	errs := make(chan error, len(reqs))
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < len(reqs); i += 4 {
				res, err := e.Generate(context.Background(), reqs[i])
				if err != nil {
					errs <- err
				}
				cached.Add(int64(res.CachedTokens))
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	type block struct {
		parent *uint64
		tokens []uint32
		tiers  []string
	}
	model := map[uint64]*block{}
	last := uint64(e.CacheTruth().Ranks[0].LastSeq)
	removals, cpuStores := 0, 0
	for sub.lastSeq < last {
		f := sub.next()
		if f.seq != sub.lastSeq+1 {
			t.Fatalf("seq %d after %d", f.seq, sub.lastSeq)
		}
		sub.lastSeq = f.seq
		for _, ev := range decodeBatch(t, f.payload).events {
			medium, _ := ev.medium.(string)
			switch ev.kind {
			case "BlockStored":
				parent := ev.parent
				for i, h := range ev.hashes {
					b, ok := model[h]
					if !ok {
						b = &block{parent: parent, tokens: ev.tokens[i*4 : (i+1)*4]}
						model[h] = b
					}
					if slices.Contains(b.tiers, medium) {
						t.Fatalf("seq %d: %d stored twice on %s", f.seq, h, medium)
					}
					b.tiers = append(b.tiers, medium)
					if medium == MediumCPU {
						cpuStores++
					}
					hh := h
					parent = &hh
				}
			case "BlockRemoved":
				for _, h := range ev.hashes {
					b, ok := model[h]
					if !ok || !slices.Contains(b.tiers, medium) {
						t.Fatalf("seq %d: removal of %d from %s, which does not hold it", f.seq, h, medium)
					}
					b.tiers = slices.DeleteFunc(b.tiers, func(s string) bool { return s == medium })
					if len(b.tiers) == 0 {
						delete(model, h)
					}
					removals++
				}
			default:
				t.Fatalf("unexpected %s", ev.kind)
			}
		}
	}
	if removals == 0 || cpuStores == 0 || cached.Load() == 0 {
		t.Fatalf("workload had %d removals, %d CPU stores, %d cached tokens; it must exercise all three", removals, cpuStores, cached.Load())
	}
	truth := e.CacheTruth().Ranks[0].Blocks
	if len(truth) != len(model) {
		t.Fatalf("events describe %d blocks, engine holds %d", len(model), len(truth))
	}
	for _, tb := range truth {
		b, ok := model[tb.Hash]
		if !ok {
			t.Fatalf("engine holds %d, which no event announced", tb.Hash)
		}
		gotTiers, wantTiers := slices.Sorted(slices.Values(b.tiers)), slices.Sorted(slices.Values(tb.Tiers))
		if !slices.Equal(gotTiers, wantTiers) || !slices.Equal(b.tokens, tb.TokenIDs) ||
			(b.parent == nil) != (tb.ParentHash == nil) || (b.parent != nil && *b.parent != *tb.ParentHash) {
			got, _ := json.Marshal(b)
			t.Fatalf("block %d: events say tiers %v tokens %v (%s), engine says %+v", tb.Hash, b.tiers, b.tokens, got, tb)
		}
	}
}
