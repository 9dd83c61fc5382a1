// Package fakeenginetest starts fake engines for other packages' tests (the one
// small, fast configuration they share and the start/cleanup boilerplate) and
// compares an index with what the engines really cache. Its
// functions are safe for concurrent use by parallel tests.
package fakeenginetest

import (
	"bytes"
	"log/slog"
	"testing"

	"github.com/kvindex/kvindex/bench/fakeengine"
	"github.com/kvindex/kvindex/internal/radix"
)

// Config is a small engine that never sleeps (time scale 0), uses blocks of 4
// tokens and 32 GPU blocks (so evictions come quickly), and binds its HTTP, PUB and
// ROUTER sockets to free loopback ports. Tests adjust it before Start.
func Config() fakeengine.Config {
	c := fakeengine.DefaultConfig()
	c.Port = 0
	c.KVEventsEndpoint = "tcp://127.0.0.1:*"
	c.KVEventsReplayEndpoint = "tcp://127.0.0.1:*"
	c.TimeScale = 0
	c.BlockSize = 4
	c.NumGPUBlocks = 32
	return c
}

// Start starts an engine from cfg and closes it when t ends. An engine with
// several data-parallel ranks binds consecutive free ports (fakeengine.StartOnFreePorts),
// since rank r must publish on port+r.
func Start(t testing.TB, cfg fakeengine.Config) *fakeengine.Engine {
	t.Helper()
	log := slog.New(slog.DiscardHandler)
	var e *fakeengine.Engine
	var err error
	if cfg.DataParallelSize > 1 {
		e, err = fakeengine.StartOnFreePorts(cfg, log)
	} else if e, err = fakeengine.New(cfg, log); err == nil {
		if err = e.Start(); err != nil {
			e.Close()
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := e.Close(); err != nil {
			t.Errorf("engine close: %v", err)
		}
	})
	return e
}

// AssertIndexHoldsTruth checks that ix holds exactly the (worker, dp rank, engine
// block, tier) entries the engines cache, engines keyed by the worker id the index
// knows them by: on a copy of ix it removes every entry an engine reports (each must
// be there), then expects the copy to be empty (nothing extra). It returns how many
// entries it compared and fails the test when the engines cache nothing, since the
// comparison would then prove nothing.
func AssertIndexHoldsTruth(t testing.TB, ix *radix.Index, engines map[string]*fakeengine.Engine) int {
	t.Helper()
	var buf bytes.Buffer
	if _, err := ix.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	cp := radix.New(radix.Config{})
	if _, err := cp.ReadFrom(&buf); err != nil {
		t.Fatal(err)
	}
	tiers := map[string]radix.Tier{"GPU": radix.TierGPU, "CPU": radix.TierCPU, "DISK": radix.TierDisk}
	compared, missing := 0, 0
	for name, e := range engines {
		for _, rt := range e.CacheTruth().Ranks {
			for _, b := range rt.Blocks {
				for _, tierName := range b.Tiers {
					tier, known := tiers[tierName]
					if !known {
						t.Fatalf("%s/%d block %x: unknown tier %q in the engine's truth", name, rt.DPRank, b.Hash, tierName)
					}
					res, err := cp.Removed(radix.WorkerKey{Worker: name, DPRank: rt.DPRank}, []uint64{b.Hash}, tier)
					if err != nil || res.Removed != 1 {
						if missing++; missing <= 10 {
							t.Errorf("%s/%d: block %x on %s is cached by the engine but not indexed", name, rt.DPRank, b.Hash, tierName)
						}
					}
					compared++
				}
			}
		}
	}
	if compared == 0 {
		t.Fatal("the engines cache nothing: the comparison would prove nothing")
	}
	if st := cp.Stats(); st.Residencies != 0 || st.Detached != 0 {
		t.Errorf("the index holds %d blocks (%d detached) that no engine caches", st.Residencies, st.Detached)
	}
	return compared
}
