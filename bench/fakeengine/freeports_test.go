package fakeengine

import (
	"fmt"
	"log/slog"
	"net"
	"testing"
)

func TestStartOnFreePortsBindsRankRAtBasePlusR(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Port = 0
	cfg.DataParallelSize = 3
	cfg.TimeScale = 0
	e, err := StartOnFreePorts(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	events, replay := e.EventEndpoints(), e.ReplayEndpoints()
	if len(events) != 3 || len(replay) != 3 {
		t.Fatalf("endpoints %v / %v, want 3 of each", events, replay)
	}
	var base int
	if _, err := fmt.Sscanf(events[0], "tcp://0.0.0.0:%d", &base); err != nil {
		if _, err := fmt.Sscanf(events[0], "tcp://*:%d", &base); err != nil {
			t.Fatalf("event endpoint %q: %v", events[0], err)
		}
	}
	for r := range 3 {
		for _, want := range []int{base + r, base + 3 + r} {
			// The port is taken by the engine: listening on it must fail.
			if l, err := net.Listen("tcp", fmt.Sprintf(":%d", want)); err == nil {
				l.Close()
				t.Errorf("rank %d: port %d is not bound by the engine (endpoints %v %v)", r, want, events, replay)
			}
		}
	}
}
