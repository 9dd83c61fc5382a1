// Package fakeenginetest starts fake engines for other packages' tests: the one
// small, fast configuration they share and the start/cleanup boilerplate. Its
// functions are safe for concurrent use by parallel tests.
package fakeenginetest

import (
	"log/slog"
	"testing"

	"github.com/kvindex/kvindex/bench/fakeengine"
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
