package fakeengine

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestValidateNamesTheBadValue(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*Config)
		want   string
	}{
		{"block size", func(c *Config) { c.BlockSize = 0 }, "--block-size=0"},
		{"gpu blocks", func(c *Config) { c.NumGPUBlocks = -1 }, "--num-gpu-blocks=-1"},
		{"cpu blocks", func(c *Config) { c.NumCPUBlocks = -3 }, "--num-cpu-blocks=-3"},
		{"wire", func(c *Config) { c.KVEventsWire = "json" }, `--kv-events-wire="json"`},
		{"layout", func(c *Config) { c.ReplayLayout = "v2" }, `--replay-layout="v2"`},
		{"role", func(c *Config) { c.Role = "router" }, `--role="router"`},
		{"time scale", func(c *Config) { c.TimeScale = -1 }, "--time-scale=-1"},
		{"dp size", func(c *Config) { c.DataParallelSize = 0 }, "--data-parallel-size=0"},
		{"port", func(c *Config) { c.Port = 70000 }, "--port=70000"},
		{"endpoint scheme", func(c *Config) { c.KVEventsEndpoint = "udp://x:1" }, `--kv-events-endpoint="udp://x:1"`},
		{"endpoint port", func(c *Config) { c.KVEventsEndpoint = "tcp://*:http" }, `--kv-events-endpoint="tcp://*:http"`},
		{"replay must bind", func(c *Config) { c.KVEventsReplayEndpoint = "tcp://10.0.0.1:5558" }, `--kv-events-replay-endpoint="tcp://10.0.0.1:5558"`},
		{"replay needs events", func(c *Config) { c.KVEventsEndpoint = ""; c.KVEventsReplayEndpoint = "tcp://*:5558" }, "needs --kv-events-endpoint"},
		{"replay steps", func(c *Config) { c.ReplayBufferSteps = 0 }, "--replay-buffer-steps=0"},
		{"first seq", func(c *Config) { c.KVEventsFirstSeq = 2 }, "--kv-events-first-seq=2"},
		{"batched tokens", func(c *Config) { c.MaxNumBatchedTokens = 10 }, "--max-num-batched-tokens=10"},
		{"negative timing", func(c *Config) { c.Timing.PrefillPerToken = -time.Microsecond }, "--prefill-per-token=-1µs"},
		{"fail rate", func(c *Config) { c.Faults.FailRate = 1.5 }, "--fault-fail-rate=1.5"},
		{"fail status", func(c *Config) { c.Faults.FailStatus = 404 }, "--fault-fail-status=404"},
		{"tokenizer model", func(c *Config) { c.Tokenizers.Set("other=/x") }, `names model "other"`},
		{"lora same as model", func(c *Config) { c.LoRAModules = []string{c.Model} }, "--lora-modules"},
		{"log level", func(c *Config) { c.LogLevel = "loud" }, `--log-level="loud"`},
		{"fleet topic", func(c *Config) { c.Fleet = 2; c.KVEventsTopic = "kv" }, `--kv-events-topic="kv"`},
		{"fleet port clash", func(c *Config) {
			c.Fleet = 2
			c.Port = 8000
			c.KVEventsEndpoint = "tcp://*:5557"
			c.KVEventsReplayEndpoint = "tcp://*:5558"
		}, "port 5558"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := DefaultConfig()
			tt.mutate(&c)
			err := c.Validate()
			if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Validate() = %v, want ErrInvalidConfig naming %q", err, tt.want)
			}
		})
	}
	c := DefaultConfig()
	if err := c.Validate(); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
}

func TestParseFlagsPrecedence(t *testing.T) {
	env := map[string]string{"KVINDEX_FAKEENGINE_BLOCK_SIZE": "32", "KVINDEX_FAKEENGINE_ROLE": "decode", "KVINDEX_FAKEENGINE_TIME_SCALE": "0.5"}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	cfg, err := ParseFlags([]string{"--role=prefill", "--lora-modules", "a,b", "--kv-events-wire", "array", "--step-base=2ms"}, &bytes.Buffer{}, lookup)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.BlockSize != 32 || cfg.Role != RolePrefill || cfg.TimeScale != 0.5 || cfg.KVEventsWire != WireArray ||
		len(cfg.LoRAModules) != 2 || cfg.Timing.StepBase != 2*time.Millisecond || cfg.NumGPUBlocks != DefaultConfig().NumGPUBlocks {
		t.Fatalf("config %+v: want env block size and time scale, flag role/wire/loras/step, default blocks", cfg)
	}
	if _, err := ParseFlags([]string{"--block-size=0"}, &bytes.Buffer{}, lookup); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("invalid flag value: %v", err)
	}
	env["KVINDEX_FAKEENGINE_PORT"] = "eighty"
	if _, err := ParseFlags(nil, &bytes.Buffer{}, lookup); err == nil || !strings.Contains(err.Error(), "KVINDEX_FAKEENGINE_PORT") {
		t.Fatalf("bad env value: %v, want an error naming the variable", err)
	}
}

func TestHelpDocumentsEveryInterfaceFlag(t *testing.T) {
	var out bytes.Buffer
	if _, err := ParseFlags([]string{"--help"}, &out, func(string) (string, bool) { return "", false }); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("--help: %v", err)
	}
	// The flags docs/design.md promises other tools.
	for _, name := range []string{"model", "host", "port", "block-size", "num-gpu-blocks", "num-cpu-blocks",
		"kv-events-endpoint", "kv-events-topic", "kv-events-wire", "kv-events-replay-endpoint", "replay-layout",
		"replay-buffer-steps", "data-parallel-size", "role", "time-scale", "tokenizer", "fleet", "base-port"} {
		if !strings.Contains(out.String(), "--"+name+" ") {
			t.Errorf("--help lacks --%s", name)
		}
	}
}

func TestFleetLayout(t *testing.T) {
	c := DefaultConfig()
	c.Fleet = 3
	c.BasePort = 9000
	c.DataParallelSize = 2
	c.KVEventsEndpoint = "tcp://*:5557"
	c.KVEventsReplayEndpoint = "tcp://*:6557"
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	members := c.FleetMembers()
	for i, m := range members {
		wantEvents := "tcp://*:" + strconv.Itoa(5557+2*i)
		wantReplay := "tcp://*:" + strconv.Itoa(6557+2*i)
		if m.Port != 9000+i || m.KVEventsEndpoint != wantEvents || m.KVEventsReplayEndpoint != wantReplay || m.Fleet != 0 {
			t.Errorf("member %d: port %d events %s replay %s, want %d %s %s", i, m.Port, m.KVEventsEndpoint, m.KVEventsReplayEndpoint, 9000+i, wantEvents, wantReplay)
		}
	}
	c.KVEventsEndpoint = "tcp://indexer:5557"
	c.KVEventsReplayEndpoint = ""
	for i, m := range c.FleetMembers() {
		if m.KVEventsEndpoint != "tcp://indexer:5557" {
			t.Errorf("member %d connects to %s, want the shared indexer endpoint", i, m.KVEventsEndpoint)
		}
	}
}

func TestFleetRunsIndependentEngines(t *testing.T) {
	c := testConfig()
	c.Fleet = 2
	f, err := NewFleet(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Start(); err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	es := f.Engines()
	if len(es) != 2 || es[0].Addr() == es[1].Addr() || es[0].Topic() == es[1].Topic() || es[0].EventEndpoints()[0] == es[1].EventEndpoints()[0] {
		t.Fatalf("fleet engines share an address, topic or endpoint")
	}
	for _, e := range es {
		resp, err := http.Get(e.URL() + "/health")
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("%s health: %v", e.Addr(), err)
		}
		resp.Body.Close()
	}
	if _, err := es[0].Generate(context.Background(), Request{Prompt: seqPrompt(0, 9), MaxTokens: 1}); err != nil {
		t.Fatal(err)
	}
	if a, b := len(es[0].CacheTruth().Ranks[0].Blocks), len(es[1].CacheTruth().Ranks[0].Blocks); a != 2 || b != 0 {
		t.Fatalf("engine caches hold %d and %d blocks, want 2 and 0", a, b)
	}
}

func TestRunServesUntilCancelled(t *testing.T) {
	c := testConfig()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, c, nil) }()
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v after cancel, want nil", err)
	}
}
