package router

import (
	"bytes"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/tokenize"
	"github.com/kvindex/kvindex/internal/tokenize/tokenizetest"
	"github.com/kvindex/kvindex/internal/workerspec"
)

func TestDefaultConfigIsValid(t *testing.T) {
	c := DefaultConfig()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
}

// Every bad value is refused with an error naming the flag and the value.
func TestConfigValidateNamesTheFlagAndTheBadValue(t *testing.T) {
	tests := []struct {
		mutate func(*Config)
		want   []string
	}{
		{func(c *Config) { c.Listen = "nocolon" }, []string{"--listen", "nocolon"}},
		{func(c *Config) { c.Indexer = []string{"bad-addr"} }, []string{"--indexer", "bad-addr"}},
		{func(c *Config) { c.WorkersFromIndexer = true }, []string{"--workers-from-indexer", "--indexer"}},
		{func(c *Config) {
			c.Workers = []workerspec.Spec{{ID: "dup", Model: "m"}, {ID: "dup", Model: "m"}}
		}, []string{"--worker", "dup"}},
		{func(c *Config) { c.IndexerTimeout = 0 }, []string{"--indexer-timeout", "0s"}},
		{func(c *Config) { c.LedgerInterval = 0 }, []string{"--ledger-interval", "0s"}},
		{func(c *Config) { c.RouterID = strings.Repeat("r", workerspec.MaxNameBytes+1) }, []string{"--router-id", "257"}},
		{func(c *Config) { c.PredictedTTL = -time.Second }, []string{"--router-predicted-ttl", "-1s"}},
		{func(c *Config) { c.BreakerCooldown = 0 }, []string{"--breaker-cooldown-s", "0s"}},
		{func(c *Config) { c.QueueTimeout = 0 }, []string{"--queue-timeout", "0s"}},
		{func(c *Config) { c.BodyReadTimeout = 0 }, []string{"--body-read-timeout", "0s"}},
		{func(c *Config) { c.ReservationTTL = 0 }, []string{"--reservation-ttl", "0s"}},
		{func(c *Config) { c.RequestIdleTimeout = -time.Second }, []string{"--request-idle-timeout", "-1s"}},
		{func(c *Config) { c.BlockSize = 0 }, []string{"--block-size", "0"}},
		{func(c *Config) { c.TokenizeCacheBytes = -1 }, []string{"--tokenize-cache-bytes", "-1"}},
		{func(c *Config) { c.ChatTemplateContentFormat = "parts" }, []string{"--chat-template-content-format", "parts"}},
		{func(c *Config) { c.Policy = "fastest" }, []string{"--router-policy", "fastest"}},
		{func(c *Config) { c.Mode = "sideways" }, []string{"--router-mode", "sideways"}},
		{func(c *Config) { c.Cost = "cheap" }, []string{"--router-cost", "cheap"}},
		{func(c *Config) { c.Temperature = -0.5 }, []string{"--router-temperature", "-0.5"}},
		{func(c *Config) { c.PrefillScale = 0 }, []string{"--prefill-scale", "0"}},
		{func(c *Config) { c.CreditHalfLife = -2 }, []string{"--credit-half-life-blocks", "-2"}},
		{func(c *Config) { c.SessionWeight = 1.5 }, []string{"--session-weight", "1.5"}},
		{func(c *Config) { c.OverlayMaxBlocks = 0 }, []string{"--overlay-max-blocks", "0"}},
		{func(c *Config) { c.RingVNodes = 5000 }, []string{"--ring-vnodes", "5000"}},
		{func(c *Config) { c.ExplicitKeyMaxLength = 0 }, []string{"--explicit-key-max-length=0"}},
		{func(c *Config) { c.SystemSegmentMaxLength = -3 }, []string{"--system-segment-max-length=-3"}},
		{func(c *Config) { c.DocumentSegmentMaxLength = 0 }, []string{"--document-segment-max-length=0"}},
		{func(c *Config) { c.MaxActivePrefillTokens = -1 }, []string{"--max-active-prefill-tokens", "-1"}},
		{func(c *Config) { c.MaxActiveDecodeBlocks = -7 }, []string{"--max-active-decode-blocks", "-7"}},
		{func(c *Config) { c.DefaultOutputTokens = 0 }, []string{"--default-output-tokens", "0"}},
		{func(c *Config) { c.PDMinUncachedTokens = -9 }, []string{"--pd-min-uncached-tokens", "-9"}},
		{func(c *Config) { c.BreakerFailureThreshold = -1 }, []string{"--breaker-failure-threshold", "-1"}},
		{func(c *Config) { c.BreakerCooldown, c.BreakerMaxCooldown = 10*time.Second, 5*time.Second },
			[]string{"--breaker-max-cooldown-s", "5s", "10s"}},
		{func(c *Config) { c.RequestMaxRetries = 17 }, []string{"--request-max-retries", "17"}},
		{func(c *Config) { c.MaxPending = -1 }, []string{"--max-pending", "-1"}},
		{func(c *Config) { c.QueueSize = -4 }, []string{"--queue-size", "-4"}},
		{func(c *Config) { c.MaxBodyBytes = 100 }, []string{"--max-body-bytes", "100"}},
		{func(c *Config) { c.LogLevel = "loud" }, []string{"loud"}},
		{func(c *Config) { c.LogFormat = "xml" }, []string{"xml"}},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.want, " "), func(t *testing.T) {
			c := DefaultConfig()
			tt.mutate(&c)
			err := c.Validate()
			if !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("Validate = %v, want an ErrInvalidConfig", err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

func envOf(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

// Flags beat KVINDEX_ROUTER_* variables, which beat the defaults.
func TestParseFlagsPrecedenceFlagsOverEnvOverDefaults(t *testing.T) {
	env := map[string]string{
		"KVINDEX_ROUTER_ROUTER_POLICY":      "round-robin",
		"KVINDEX_ROUTER_QUEUE_SIZE":         "7",
		"KVINDEX_ROUTER_BREAKER_COOLDOWN_S": "3",
		"KVINDEX_ROUTER_INDEXER":            "10.0.0.1:7070,10.0.0.2:7070",
		"KVINDEX_ROUTER_LEDGER":             "false",
	}
	tests := []struct {
		name     string
		args     []string
		env      map[string]string
		policy   string
		queue    int
		cooldown time.Duration
		indexer  string
		ledger   bool // on by default: a router with --indexer shares its load
	}{
		{"defaults", nil, nil, PolicyKVAware, 128, 5 * time.Second, "", true},
		{"env over defaults", nil, env, PolicyRoundRobin, 7, 3 * time.Second, "10.0.0.1:7070,10.0.0.2:7070", false},
		{"flags over env", []string{"--router-policy", "session", "--queue-size=2", "--breaker-cooldown-s", "9s", "--indexer", "127.0.0.1:1", "--ledger"},
			env, PolicySession, 2, 9 * time.Second, "127.0.0.1:1", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := ParseFlags(tt.args, &bytes.Buffer{}, envOf(tt.env))
			if err != nil {
				t.Fatal(err)
			}
			if c.Policy != tt.policy || c.QueueSize != tt.queue || c.BreakerCooldown != tt.cooldown || strings.Join(c.Indexer, ",") != tt.indexer ||
				c.Ledger != tt.ledger {
				t.Fatalf("got policy=%s queue=%d cooldown=%s indexer=%v ledger=%v, want %s %d %s %s %v",
					c.Policy, c.QueueSize, c.BreakerCooldown, c.Indexer, c.Ledger, tt.policy, tt.queue, tt.cooldown, tt.indexer, tt.ledger)
			}
			if c.MaxPending != 0 || c.RingVNodes != 160 {
				t.Fatalf("unset flags changed: max-pending=%d ring-vnodes=%d", c.MaxPending, c.RingVNodes)
			}
		})
	}
}

func TestParseFlagsRefusesBadValuesNamingThem(t *testing.T) {
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"bad env value", nil, map[string]string{"KVINDEX_ROUTER_QUEUE_SIZE": "many"}, "KVINDEX_ROUTER_QUEUE_SIZE"},
		{"invalid policy from env", nil, map[string]string{"KVINDEX_ROUTER_ROUTER_POLICY": "best"}, "--router-policy"},
		{"bad cooldown", []string{"--breaker-cooldown-s", "soon"}, nil, "soon"},
		{"cooldown beyond a duration's range", []string{"--breaker-cooldown-s", "1e12"}, nil, `"1e12" seconds is out of range`},
		{"cooldown NaN", []string{"--breaker-max-cooldown-s", "NaN"}, nil, `"NaN" seconds`},
		{"stray argument", []string{"extra"}, nil, "extra"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseFlags(tt.args, &bytes.Buffer{}, envOf(tt.env))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("ParseFlags = %v, want an error mentioning %q", err, tt.want)
			}
		})
	}
}

// The breaker flags take seconds as seeds/000 gives them, or a Go duration.
func TestBreakerCooldownFlagsAcceptSecondsAndDurations(t *testing.T) {
	for _, tt := range []struct {
		v    string
		want time.Duration
	}{{"5", 5 * time.Second}, {"5s", 5 * time.Second}, {"0.2", 200 * time.Millisecond}, {"200ms", 200 * time.Millisecond}, {"1m", time.Minute}} {
		c, err := ParseFlags([]string{"--breaker-cooldown-s", tt.v, "--breaker-max-cooldown-s", tt.v}, &bytes.Buffer{}, envOf(nil))
		if err != nil {
			t.Fatalf("%q: %v", tt.v, err)
		}
		if c.BreakerCooldown != tt.want || c.BreakerMaxCooldown != tt.want {
			t.Errorf("--breaker-cooldown-s/--breaker-max-cooldown-s %q = %s/%s, want %s", tt.v, c.BreakerCooldown, c.BreakerMaxCooldown, tt.want)
		}
	}
}

// --help lists every registered flag with its environment variable.
func TestHelpListsEveryFlag(t *testing.T) {
	var out bytes.Buffer
	_, err := ParseFlags([]string{"--help"}, &out, envOf(nil))
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("--help: %v, want flag.ErrHelp", err)
	}
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	c := DefaultConfig()
	registerFlags(fs, &c)
	n := 0
	fs.VisitAll(func(f *flag.Flag) {
		n++
		if !strings.Contains(out.String(), "--"+f.Name+" ") {
			t.Errorf("--help does not list --%s", f.Name)
		}
		env := EnvPrefix + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if !strings.Contains(out.String(), "$"+env) {
			t.Errorf("--help does not name %s for --%s", env, f.Name)
		}
	})
	// The flags the issue and seeds name are all registered.
	for _, name := range []string{"listen", "indexer", "indexer-timeout", "worker", "workers-file", "workers-from-indexer",
		"router-policy", "router-mode", "router-cost", "router-temperature", "router-predicted-ttl", "approx-ttl",
		"max-active-prefill-tokens", "max-active-decode-blocks", "reservation-ttl", "scrape-engine-metrics",
		"pd-min-uncached-tokens", "breaker-failure-threshold", "breaker-cooldown-s", "breaker-max-cooldown-s",
		"request-max-retries", "first-byte-timeout", "request-idle-timeout", "max-pending", "queue-size", "queue-timeout",
		"explicit-key-max-length", "system-segment-max-length", "document-segment-max-length", "max-body-bytes", "log-level"} {
		if fs.Lookup(name) == nil {
			t.Errorf("flag --%s is not registered", name)
		}
	}
	if n < 40 {
		t.Fatalf("only %d flags registered", n)
	}
}

// --chat-template-content-format (or its variable) reaches the tokenizers: with openai
// a template gets content as a list of text parts, with auto one that never loops over
// content gets it as a string, as vLLM gives them.
func TestChatTemplateContentFormatReachesTheTokenizers(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"tokenizer.json", "tokenizer_config.json"} {
		if err := os.Symlink(filepath.Join(tokenizetest.Dir(t), "qwen3", name), filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "chat_template.jinja"), []byte("{{ messages[0].content | tojson }}"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{nil, nil, `"hi"`},
		{[]string{"--chat-template-content-format", "openai"}, nil, `[{"type": "text", "text": "hi"}]`},
		{nil, map[string]string{"KVINDEX_ROUTER_CHAT_TEMPLATE_CONTENT_FORMAT": "openai"}, `[{"type": "text", "text": "hi"}]`},
	} {
		cfg, err := ParseFlags(append([]string{"--tokenizer", "m=" + dir}, tt.args...), &bytes.Buffer{}, envOf(tt.env))
		if err != nil {
			t.Fatal(err)
		}
		r, err := New(cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		tok, err := r.tokenizers.Lookup("m")
		if err != nil {
			t.Fatal(err)
		}
		got, err := tok.ApplyChatTemplate([]tokenize.Message{{Role: "user", Content: "hi"}}, tokenize.ChatOptions{})
		r.close()
		if err != nil || got != tt.want {
			t.Errorf("args %v env %v: rendered %q, %v; want %q", tt.args, tt.env, got, err, tt.want)
		}
	}
}
