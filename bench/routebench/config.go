package routebench

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/kvindex/kvindex/bench/traces"
	"github.com/kvindex/kvindex/internal/envflag"
)

// EnvPrefix is the prefix of routebench's environment variables: --workers is
// read from KVINDEX_ROUTEBENCH_WORKERS when the flag is not given.
const EnvPrefix = "KVINDEX_ROUTEBENCH_"

// ErrInvalidConfig is wrapped by every configuration error.
var ErrInvalidConfig = errors.New("invalid routebench configuration")

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, args...))
}

// Config is one bench run; DefaultConfig gives the defaults and Validate checks it.
type Config struct {
	// Offline runs the discrete-event simulator instead of the live fleet.
	Offline bool
	// Traces are trace specs: generator names or mooncake:FILE.
	Traces   []string
	Workers  int
	Policies []string
	Requests int
	// Rate is the arrival rate in requests/s; Poisson decides arrivals of a
	// Mooncake trace only when PoissonMooncake is set (else its timestamps).
	Rate            float64
	PoissonMooncake bool
	// Rates, when set, adds a sweep: every trace and policy also runs at each of
	// these rates (hit rate and TTFT vs request rate plots).
	Rates []float64
	Seed  uint64
	Out   string
	// SLOTTFT is the TTFT a request must meet to count in goodput.
	SLOTTFT time.Duration

	// Engine model: KV blocks per worker on the GPU; CPUBlocks on every other
	// worker (the CPU tier "on some").
	BlockSize int
	GPUBlocks int
	CPUBlocks int

	// EventDelay (offline) delays every KV event batch on its way to the index.
	EventDelay time.Duration
	// TruthLimit (offline): available/captured hit from the engines' true caches
	// is computed at every decision when Workers <= TruthLimit (it costs a cache
	// lookup per worker per request).
	TruthLimit int

	// Quick is the small live run of the test suite: chat trace, 4 workers,
	// round-robin and kv-aware, 120 requests, engines at --time-scale 0.25.
	Quick bool
	// BinDir holds fakeengine, indexer and router for live mode.
	BinDir string
	// TimeScale is the live engines' --time-scale.
	TimeScale float64
	// PrefillScale, when > 0, is the router's --prefill-scale for every kv-aware
	// variant (0: the router's default).
	PrefillScale float64
	// Routers is how many routers each policy run has (live: router processes;
	// offline: simulated routers, each with its own reservations, overlay and
	// session bindings); requests go to them in turn. Ledger says whether they
	// share load, decisions and session bindings through the indexer (--ledger);
	// offline, the ledger pushes every LedgerPush on the virtual clock.
	Routers    int
	Ledger     bool
	LedgerPush time.Duration
	// Progress draws a progress bar on stderr.
	Progress bool
	// Plots writes the PNG plots.
	Plots bool
}

// DefaultConfig returns the defaults documented by --help.
func DefaultConfig() Config {
	return Config{
		Traces:     []string{"chat"},
		Workers:    8,
		Policies:   AllPolicies(),
		Requests:   1000,
		Rate:       20,
		Seed:       1,
		Out:        "bench/out",
		SLOTTFT:    500 * time.Millisecond,
		BlockSize:  16,
		GPUBlocks:  4096,
		CPUBlocks:  8192,
		TruthLimit: 64,
		BinDir:     "bin",
		TimeScale:  1,
		Routers:    1,
		Ledger:     true,
		LedgerPush: 15 * time.Millisecond, // the indexer's --ledger-push-interval default
		Progress:   true,
		Plots:      true,
	}
}

// Validate reports the first bad value, naming its flag.
func (c *Config) Validate() error {
	switch {
	case len(c.Traces) == 0:
		return invalid("--trace is empty")
	case c.Workers <= 0:
		return invalid("--workers=%d must be > 0", c.Workers)
	case len(c.Policies) == 0:
		return invalid("--policies is empty")
	case c.Requests <= 0:
		return invalid("--requests=%d must be > 0", c.Requests)
	case !(c.Rate > 0):
		return invalid("--rate=%v must be > 0", c.Rate)
	case c.Out == "":
		return invalid("--out is empty")
	case c.SLOTTFT <= 0:
		return invalid("--slo-ttft=%v must be > 0", c.SLOTTFT)
	case c.BlockSize <= 0 || traces.MooncakeBlockTokens%c.BlockSize != 0:
		return invalid("--block-size=%d must divide 512", c.BlockSize)
	case c.GPUBlocks <= 0 || c.CPUBlocks < 0:
		return invalid("--gpu-blocks=%d must be > 0 and --cpu-blocks=%d >= 0", c.GPUBlocks, c.CPUBlocks)
	case c.EventDelay < 0:
		return invalid("--event-delay=%v must not be negative", c.EventDelay)
	case c.PrefillScale < 0:
		return invalid("--prefill-scale=%v must not be negative", c.PrefillScale)
	case c.Routers < 1 || c.Routers > 64:
		return invalid("--routers=%d must be between 1 and 64", c.Routers)
	case c.LedgerPush <= 0:
		return invalid("--ledger-push=%v must be > 0", c.LedgerPush)
	case c.TimeScale < 0:
		return invalid("--time-scale=%v must not be negative", c.TimeScale)
	}
	for _, r := range c.Rates {
		if !(r > 0) {
			return invalid("--rates: %v must be > 0", r)
		}
	}
	for _, p := range c.Policies {
		s, err := specFor(p)
		if err != nil {
			return err
		}
		if !c.Offline && s.liveArgs == nil {
			return invalid("policy %q runs offline only (--offline): the router has no such policy", p)
		}
	}
	return nil
}

// listFlag is a comma-separated list flag.
type listFlag struct{ v *[]string }

func (l listFlag) String() string {
	if l.v == nil {
		return ""
	}
	return strings.Join(*l.v, ",")
}

func (l listFlag) Set(s string) error {
	*l.v = nil
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			*l.v = append(*l.v, p)
		}
	}
	return nil
}

type ratesFlag struct{ v *[]float64 }

func (r ratesFlag) String() string {
	if r.v == nil {
		return ""
	}
	var parts []string
	for _, x := range *r.v {
		parts = append(parts, strconv.FormatFloat(x, 'g', -1, 64))
	}
	return strings.Join(parts, ",")
}

func (r ratesFlag) Set(s string) error {
	*r.v = nil
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p == "" {
			continue
		}
		x, err := strconv.ParseFloat(p, 64)
		if err != nil {
			return err
		}
		*r.v = append(*r.v, x)
	}
	return nil
}

// ParseFlags fills a Config from args and KVINDEX_ROUTEBENCH_* (flags win).
func ParseFlags(args []string, out io.Writer, lookup func(string) (string, bool)) (Config, error) {
	c := DefaultConfig()
	fs := flag.NewFlagSet("routebench", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.BoolVar(&c.Offline, "offline", c.Offline, "run the discrete-event simulator (one process, virtual clock) instead of the live fleet")
	fs.Var(listFlag{&c.Traces}, "trace", "comma-separated traces: "+strings.Join(traces.Names(), ", ")+", or mooncake:FILE")
	fs.IntVar(&c.Workers, "workers", c.Workers, "engines in the fleet (one data-parallel rank each)")
	fs.Var(listFlag{&c.Policies}, "policies", "comma-separated policies: "+strings.Join(AllPolicies(), ", ")+" (sglang-cache-aware, llm-d-weighted and oracle offline only)")
	fs.IntVar(&c.Requests, "requests", c.Requests, "requests per trace")
	fs.Float64Var(&c.Rate, "rate", c.Rate, "arrival rate, requests/s")
	fs.BoolVar(&c.PoissonMooncake, "poisson", c.PoissonMooncake, "Mooncake traces: Poisson arrivals at --rate instead of the file's timestamps")
	fs.Var(ratesFlag{&c.Rates}, "rates", "comma-separated extra rates for the hit rate and TTFT vs request rate sweep (empty: no sweep)")
	fs.Uint64Var(&c.Seed, "seed", c.Seed, "seed of the traces and of every random choice")
	fs.StringVar(&c.Out, "out", c.Out, "directory for results.csv and the PNG plots")
	fs.DurationVar(&c.SLOTTFT, "slo-ttft", c.SLOTTFT, "TTFT SLO for goodput")
	fs.IntVar(&c.BlockSize, "block-size", c.BlockSize, "engines' KV block size in tokens")
	fs.IntVar(&c.GPUBlocks, "gpu-blocks", c.GPUBlocks, "GPU KV blocks per engine (small, so eviction matters)")
	fs.IntVar(&c.CPUBlocks, "cpu-blocks", c.CPUBlocks, "CPU-tier KV blocks on every other engine (0: none)")
	fs.DurationVar(&c.EventDelay, "event-delay", c.EventDelay, "offline: delay of the KV events on their way to the index")
	fs.IntVar(&c.TruthLimit, "truth-limit", c.TruthLimit, "offline: compute available/captured hit from the true caches up to this many workers")
	fs.BoolVar(&c.Quick, "quick", c.Quick, "small live run (chat, 4 workers, round-robin and kv-aware, 120 requests, --time-scale 0.25; under 2 minutes)")
	fs.StringVar(&c.BinDir, "bin-dir", c.BinDir, "live: directory holding the fakeengine, indexer and router binaries")
	fs.Float64Var(&c.TimeScale, "time-scale", c.TimeScale, "live: engines' --time-scale (simulated to wall time)")
	fs.Float64Var(&c.PrefillScale, "prefill-scale", c.PrefillScale, "router --prefill-scale for the kv-aware variants (0: the router's default)")
	fs.IntVar(&c.Routers, "routers", c.Routers, "routers per policy run, requests sent to them in turn (live: router processes; offline: simulated routers, each with its own load, overlay and sessions)")
	fs.BoolVar(&c.Ledger, "ledger", c.Ledger, "the routers share load, decisions and session bindings through the indexer's ledger (router --ledger; offline: simulated pushes)")
	fs.DurationVar(&c.LedgerPush, "ledger-push", c.LedgerPush, "offline: how often the simulated ledger pushes each router the others' load and decisions (the indexer's --ledger-push-interval)")
	fs.BoolVar(&c.Progress, "progress", c.Progress, "draw a progress bar on stderr")
	fs.BoolVar(&c.Plots, "plots", c.Plots, "write the PNG plots")
	fs.Usage = envflag.Usage(fs, EnvPrefix, "usage: routebench [--offline] --trace NAME|mooncake:FILE --workers N --policies p1,p2,... [--requests N] [--rate R] [--seed S] --out DIR")
	if err := envflag.Parse(fs, EnvPrefix, args, lookup); err != nil {
		return Config{}, err
	}
	if c.Quick {
		c.ApplyQuick()
	}
	return c, c.Validate()
}

// ApplyQuick sets the quick run's trace, fleet and policies.
func (c *Config) ApplyQuick() {
	c.Traces = []string{"chat"}
	c.Workers = 4
	c.Policies = []string{"round-robin", "kv-aware"}
	c.Requests = 120
	c.Rate = 20
	c.Rates = nil
	c.GPUBlocks = 2048
	c.TimeScale = 0.25
}
