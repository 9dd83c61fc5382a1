package fakeengine

import (
	"context"
	"slices"
	"testing"
	"time"
)

// TestSimRankMatchesALiveEngine runs the same requests one after the other through
// a started Engine and through a SimRank with the same configuration: cached
// tokens, simulated TTFT and E2E, and the cache contents must be the same, since
// both run the same rank code.
func TestSimRankMatchesALiveEngine(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(*Config)
	}{
		{"gpu only, eviction", func(*Config) {}},
		{"cpu tier", func(c *Config) { c.NumCPUBlocks = 16 }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig()
			tc.mutate(&cfg)
			live := startEngine(t, cfg)
			var batches int
			sim, err := NewSimRank(cfg, 0, func(seq int64, ev []Event) {
				if seq != int64(batches) || len(ev) == 0 {
					t.Errorf("batch %d has seq %d and %d events", batches, seq, len(ev))
				}
				batches++
			})
			if err != nil {
				t.Fatal(err)
			}
			reqs := []Request{
				{Prompt: seqPrompt(0, 40), MaxTokens: 5},
				{Prompt: seqPrompt(0, 60), MaxTokens: 3}, // shares 40 tokens
				{Prompt: seqPrompt(100, 90), MaxTokens: 8},
				{Prompt: seqPrompt(0, 41), MaxTokens: 2}, // may have been evicted
				{Prompt: seqPrompt(7, 120), MaxTokens: 4},
				{Prompt: seqPrompt(0, 40), MaxTokens: 5},
			}
			for i, req := range reqs {
				want, err := live.Generate(context.Background(), req)
				if err != nil {
					t.Fatal(err)
				}
				q, err := sim.Submit(req)
				if err != nil {
					t.Fatal(err)
				}
				var got Result
				for {
					_, _, ran := sim.Step()
					if !ran {
						t.Fatalf("request %d: the sim rank went idle before it finished", i)
					}
					if res, err, done := q.Done(); done {
						if err != nil {
							t.Fatal(err)
						}
						got = res
						break
					}
				}
				if got.CachedTokens != want.CachedTokens || got.SimTTFT != want.SimTTFT || got.SimE2E != want.SimE2E {
					t.Errorf("request %d: sim cached %d ttft %v e2e %v; live %d %v %v", i,
						got.CachedTokens, got.SimTTFT, got.SimE2E, want.CachedTokens, want.SimTTFT, want.SimE2E)
				}
				ft, ok := q.FirstToken()
				if !ok || ft <= 0 || ft > sim.Now() {
					t.Errorf("request %d: first token at %v (%v), clock %v", i, ft, ok, sim.Now())
				}
			}
			truth := live.CacheTruth()
			if !slices.EqualFunc(truth.Ranks[0].Blocks, sim.Blocks(), func(a, b CachedBlock) bool {
				return a.Hash == b.Hash && slices.Equal(a.Tiers, b.Tiers) && slices.Equal(a.TokenIDs, b.TokenIDs)
			}) {
				t.Errorf("cache contents differ: live %d blocks, sim %d", len(truth.Ranks[0].Blocks), len(sim.Blocks()))
			}
			if batches == 0 {
				t.Errorf("no event batch reached the sink")
			}
		})
	}
}

func TestSimRankClockAndCachedPrefix(t *testing.T) {
	cfg := testConfig()
	sim, err := NewSimRank(cfg, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	sim.Advance(time.Second)
	if sim.Now() != time.Second {
		t.Fatalf("idle rank's clock at %v after Advance(1s)", sim.Now())
	}
	req := Request{Prompt: seqPrompt(3, 21), MaxTokens: 2}
	if g, c := sim.CachedPrefix(req); g != 0 || c != 0 {
		t.Fatalf("empty cache: prefix %d+%d", g, c)
	}
	if _, err := sim.Submit(req); err != nil {
		t.Fatal(err)
	}
	sim.Advance(time.Hour) // busy: ignored
	if sim.Now() != time.Second {
		t.Fatalf("busy rank's clock moved by Advance")
	}
	for {
		d, _, ran := sim.Step()
		if !ran {
			break
		}
		if d <= 0 {
			t.Fatalf("step of %v", d)
		}
	}
	if n := sim.PendingPrefillTokens(); n != 0 {
		t.Fatalf("idle rank: %d pending prefill tokens", n)
	}
	if _, err := sim.Submit(Request{Prompt: seqPrompt(100, 30), MaxTokens: 2}); err != nil {
		t.Fatal(err)
	}
	if n := sim.PendingPrefillTokens(); n != 30 {
		t.Fatalf("one queued 30-token prompt: %d pending prefill tokens", n)
	}
	for {
		if _, _, ran := sim.Step(); !ran {
			break
		}
	}
	if g, c := sim.CachedPrefix(req); g != 5 || c != 0 { // 21 tokens, block 4: 5 full blocks
		t.Fatalf("after the request: prefix %d+%d, want 5+0", g, c)
	}
	if _, err := sim.Submit(Request{Prompt: make([]uint32, 0)}); err == nil {
		t.Fatal("empty prompt accepted")
	}
}
