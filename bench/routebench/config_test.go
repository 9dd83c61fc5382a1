package routebench

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/server"
)

func TestParseFlags(t *testing.T) {
	env := func(m map[string]string) func(string) (string, bool) {
		return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
	}
	cases := []struct {
		name    string
		args    []string
		env     map[string]string
		check   func(Config) bool
		wantErr string
	}{
		{"defaults", nil, nil, func(c Config) bool {
			return c.Workers == 8 && len(c.Policies) == len(AllPolicies()) && !c.Offline && c.SLOTTFT == 500*time.Millisecond
		}, "offline only"}, // live mode cannot run sglang, llm-d, oracle
		{"offline defaults", []string{"--offline"}, nil, func(c Config) bool { return c.Offline }, ""},
		{"lists", []string{"--offline", "--trace", "chat, burst", "--policies", "kv-aware,oracle", "--rates", "5,10"}, nil,
			func(c Config) bool {
				return strings.Join(c.Traces, "|") == "chat|burst" && len(c.Policies) == 2 && len(c.Rates) == 2 && c.Rates[1] == 10
			}, ""},
		{"env fills, flag wins", []string{"--offline", "--workers", "3"}, map[string]string{"KVINDEX_ROUTEBENCH_WORKERS": "9", "KVINDEX_ROUTEBENCH_REQUESTS": "7"},
			func(c Config) bool { return c.Workers == 3 && c.Requests == 7 }, ""},
		{"quick", []string{"--quick"}, nil, func(c Config) bool {
			return c.Workers == 4 && c.Requests == 120 && c.TimeScale == 0.25 && strings.Join(c.Policies, ",") == "round-robin,kv-aware"
		}, ""},
		{"unknown policy", []string{"--offline", "--policies", "nope"}, nil, nil, "unknown policy"},
		{"bad workers", []string{"--offline", "--workers", "0"}, nil, nil, "--workers"},
		{"bad block size", []string{"--offline", "--block-size", "24"}, nil, nil, "--block-size"},
		{"bad rate", []string{"--offline", "--rate", "0"}, nil, nil, "--rate"},
		{"bad sweep rate", []string{"--offline", "--rates", "5,-1"}, nil, nil, "--rates"},
		{"negative delay", []string{"--offline", "--event-delay", "-1s"}, nil, nil, "--event-delay"},
		{"routers", []string{"--routers", "4", "--ledger=false", "--policies", "kv-aware"}, nil, func(c Config) bool { return c.Routers == 4 && !c.Ledger }, ""},
		{"routers offline", []string{"--offline", "--routers", "4", "--ledger=false"}, nil, func(c Config) bool { return c.Offline && c.Routers == 4 && !c.Ledger }, ""},
		{"ledger push", []string{"--offline", "--ledger-push", "40ms"}, nil, func(c Config) bool { return c.LedgerPush == 40*time.Millisecond }, ""},
		{"bad ledger push", []string{"--offline", "--ledger-push", "0s"}, nil, nil, "--ledger-push=0s"},
		{"no routers", []string{"--routers", "0", "--policies", "kv-aware"}, nil, nil, "--routers=0"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := ParseFlags(c.args, &strings.Builder{}, env(c.env))
			if c.wantErr != "" {
				if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("err %v, want ErrInvalidConfig mentioning %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !c.check(cfg) {
				t.Fatalf("config %+v", cfg)
			}
		})
	}
}

func TestHelpNamesEveryFlagAndItsVariable(t *testing.T) {
	var out strings.Builder
	_, err := ParseFlags([]string{"--help"}, &out, func(string) (string, bool) { return "", false })
	if err == nil {
		t.Fatal("--help returned no error")
	}
	for _, want := range []string{"--offline", "--trace", "--policies", "--slo-ttft", "--event-delay", "--quick", "--routers", "--ledger-push", "KVINDEX_ROUTEBENCH_WORKERS"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("--help does not mention %s", want)
		}
	}
}

func TestSummarize(t *testing.T) {
	ms := time.Millisecond
	outs := []outcome{
		{arrival: 0, promptTokens: 100, cachedTokens: 50, outputTokens: 10, ttft: 10 * ms, e2e: 100 * ms, workerID: "a"},
		{arrival: 0, promptTokens: 100, cachedTokens: 0, outputTokens: 10, ttft: 30 * ms, e2e: 200 * ms, workerID: "b"},
		{arrival: 50 * ms, failed: true},
	}
	busy := map[string]time.Duration{"a": time.Second, "b": 3 * time.Second}
	r := summarize("t", "p", "offline", 2, 16, 1, outs, busy, 20*ms)
	switch {
	case r.Requests != 3 || r.Failed != 1:
		t.Fatalf("requests %d failed %d", r.Requests, r.Failed)
	case r.HitRate != 0.25:
		t.Fatalf("hit rate %v", r.HitRate)
	case r.TTFTP50 != 10 || r.TTFTP99 != 30:
		t.Fatalf("ttft p50 %v p99 %v", r.TTFTP50, r.TTFTP99)
	case r.SLOAttainment != 0.5:
		t.Fatalf("slo attainment %v", r.SLOAttainment)
	case r.Imbalance != 1.5:
		t.Fatalf("imbalance %v", r.Imbalance)
	case r.Makespan != 0.2 || r.OutputTokS != 100:
		t.Fatalf("makespan %v, output tok/s %v", r.Makespan, r.OutputTokS)
	}
}

// TestLedgerPushIsTheIndexers: the simulated ledger pushes at the indexer's
// default --ledger-push-interval, so an offline run models the real routers.
func TestLedgerPushIsTheIndexers(t *testing.T) {
	if got, want := DefaultConfig().LedgerPush, server.DefaultConfig().LedgerPushInterval; got != want {
		t.Errorf("--ledger-push defaults to %v, the indexer pushes every %v", got, want)
	}
}
