package fakeengine

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/kvindex/kvindex/internal/envflag"
	"github.com/kvindex/kvindex/internal/logging"
	"github.com/kvindex/kvindex/internal/tokenize"
)

// ErrInvalidConfig is wrapped by every configuration error; the message names the
// flag and the bad value.
var ErrInvalidConfig = errors.New("fakeengine: invalid config")

// EnvPrefix prefixes the environment variable of every flag: --num-gpu-blocks is
// read from KVINDEX_FAKEENGINE_NUM_GPU_BLOCKS when not given on the command line.
const EnvPrefix = "KVINDEX_FAKEENGINE_"

// Role is the engine's part in prefill/decode disaggregation.
type Role string

// Roles, as vLLM's kv_role kv_both / kv_producer / kv_consumer.
const (
	RoleBoth    Role = "both"
	RolePrefill Role = "prefill"
	RoleDecode  Role = "decode"
)

// ReplayLayout is the frame layout of replay replies.
type ReplayLayout string

const (
	// ReplayNew replies ["", topic, seq, payload] (vLLM >= 0.26); the end marker is
	// ["", "", ff x 8, ""].
	ReplayNew ReplayLayout = "new"
	// ReplayLegacy replies ["", seq, payload] (older vLLM, SGLang); the end marker
	// is ["", ff x 8, ""].
	ReplayLegacy ReplayLayout = "legacy"
)

// Timing is the simulated cost model. The engine runs in steps, as vLLM does: each
// step decodes one token for every running sequence and prefills up to
// MaxNumBatchedTokens prompt tokens, and lasts
//
//	StepBase + prefill tokens x PrefillPerToken + decoding sequences x DecodePerSeq
//	         + tokens loaded from the CPU tier x CPULoadPerToken
//	         + tokens received from a prefill engine x KVTransferPerToken
//
// So a lone request's time to first token is StepBase + uncached x PrefillPerToken
// (prefix-cached tokens are free), and each further token costs about StepBase.
//
// Defaults model Llama-3.1-8B in bf16 on one H100 SXM (80 GB, 3.35 TB/s HBM, ~990
// dense bf16 TFLOPS), KV cache 128 KiB per token (32 layers x 8 KV heads x 128 dims
// x 2 (K,V) x 2 bytes):
//   - StepBase 6 ms: one forward pass reads the 16 GB of weights (4.8 ms at full
//     bandwidth) plus launch and sampling overhead; measured vLLM inter-token latency
//     at low batch is 6-7 ms.
//   - PrefillPerToken 30 µs: 2 x 8e9 FLOP per token at ~55% MFU (~540 TFLOPS);
//     a 1k-token prompt then takes ~36 ms, in line with published TTFTs.
//   - DecodePerSeq 50 µs: reading a ~1k-token context's KV (128 MB) per sequence.
//   - CPULoadPerToken 5 µs: 128 KiB over PCIe Gen5 at ~25 GB/s effective.
//   - KVTransferPerToken 3 µs: 128 KiB over a 400 Gb/s RDMA NIC (~45 GB/s).
type Timing struct {
	StepBase           time.Duration
	PrefillPerToken    time.Duration
	DecodePerSeq       time.Duration
	CPULoadPerToken    time.Duration
	KVTransferPerToken time.Duration
}

// Faults are the injected failures; they can be changed at run time through
// Engine.SetFaults or POST /admin/faults (JSON shape in faults.go).
type Faults struct {
	// DropEveryNBatches > 0 withholds every Nth event batch from the PUB socket
	// (seq N-1, 2N-1, ...); it stays in the replay buffer, so a subscriber sees a
	// gap that replay can fill.
	DropEveryNBatches int
	// FailRate is the fraction of completion requests answered with FailStatus,
	// spread evenly (request k fails when floor((k+1)*rate) > floor(k*rate)).
	FailRate float64
	// FailStatus is 500 or 429.
	FailStatus int
	// HangBeforeFirstToken delays every completion request this long (wall time)
	// before it is queued and before any response byte is written.
	HangBeforeFirstToken time.Duration
	// AbortAfterTokens > 0 breaks every streamed response's connection after that
	// many token chunks, as an engine that dies mid-generation does.
	AbortAfterTokens int
	// StallAfterTokens > 0 stops every streamed response after that many token
	// chunks without closing it, until the client goes away (a hung engine).
	StallAfterTokens int
}

// Config configures one engine (or, with Fleet > 0, a fleet of identical ones).
type Config struct {
	Model        string
	Host         string
	Port         int
	BlockSize    int
	NumGPUBlocks int
	NumCPUBlocks int
	MaxModelLen  int
	// MaxNumSeqs caps the running batch; further requests wait in FIFO order.
	MaxNumSeqs int
	// MaxNumBatchedTokens is the token budget of one step (decode + prefill chunks).
	MaxNumBatchedTokens int
	// DefaultMaxTokens is used when a request gives no max_tokens.
	DefaultMaxTokens int

	// KVEventsEndpoint is the PUB endpoint; it binds when it contains '*' or '::' or
	// is ipc:// or inproc:// (as vLLM decides) and connects otherwise. Empty
	// disables KV events.
	KVEventsEndpoint string
	// KVEventsTopic defaults to kv@<host>:<port>@<model>.
	KVEventsTopic          string
	KVEventsWire           WireFormat
	KVEventsReplayEndpoint string
	ReplayLayout           ReplayLayout
	ReplayBufferSteps      int
	// KVEventsFirstSeq is the seq of the first batch after a start or restart: 0
	// as vLLM, 1 as llm-d's publishers.
	KVEventsFirstSeq int64
	DataParallelSize int

	Role      Role
	TimeScale float64
	Timing    Timing

	Tokenizers  tokenize.Specs
	LoRAModules []string
	// BlockHashSeed seeds the engine's opaque block hashes; 0 picks a random seed.
	BlockHashSeed uint64

	Faults Faults

	// Fleet > 0 runs that many engines in one process on BasePort, BasePort+1, ...
	Fleet    int
	BasePort int

	LogLevel  string
	LogFormat string
}

// DefaultConfig returns the defaults documented on each flag.
func DefaultConfig() Config {
	return Config{
		Model:               "fake/llama-3.1-8b",
		Host:                "127.0.0.1",
		Port:                8000,
		BlockSize:           16,
		NumGPUBlocks:        28000, // ~450k tokens: 80 GB x 0.9 - 16 GB weights, / 128 KiB per token
		NumCPUBlocks:        0,
		MaxModelLen:         131072,
		MaxNumSeqs:          256,
		MaxNumBatchedTokens: 8192,
		DefaultMaxTokens:    16,
		KVEventsEndpoint:    "tcp://*:5557",
		KVEventsWire:        WireMap,
		ReplayLayout:        ReplayNew,
		ReplayBufferSteps:   10000,
		DataParallelSize:    1,
		Role:                RoleBoth,
		TimeScale:           1,
		Timing: Timing{
			StepBase:           6 * time.Millisecond,
			PrefillPerToken:    30 * time.Microsecond,
			DecodePerSeq:       50 * time.Microsecond,
			CPULoadPerToken:    5 * time.Microsecond,
			KVTransferPerToken: 3 * time.Microsecond,
		},
		Faults:    Faults{FailStatus: 500},
		LogLevel:  "info",
		LogFormat: "text",
	}
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, args...))
}

// Validate reports the first bad value, naming its flag.
func (c *Config) Validate() error {
	switch {
	case c.Model == "":
		return invalid("--model must not be empty")
	case c.Port < 0 || c.Port > 65535:
		return invalid("--port=%d is not a port (0-65535; 0 picks a free one)", c.Port)
	case c.BlockSize < 1 || c.BlockSize > 1024:
		return invalid("--block-size=%d must be between 1 and 1024", c.BlockSize)
	case c.NumGPUBlocks < 1:
		return invalid("--num-gpu-blocks=%d must be at least 1", c.NumGPUBlocks)
	case c.NumCPUBlocks < 0:
		return invalid("--num-cpu-blocks=%d must not be negative", c.NumCPUBlocks)
	case c.MaxModelLen < 2:
		return invalid("--max-model-len=%d must be at least 2", c.MaxModelLen)
	case c.MaxNumSeqs < 1:
		return invalid("--max-num-seqs=%d must be at least 1", c.MaxNumSeqs)
	case c.MaxNumBatchedTokens < c.MaxNumSeqs:
		return invalid("--max-num-batched-tokens=%d must be at least --max-num-seqs=%d", c.MaxNumBatchedTokens, c.MaxNumSeqs)
	case c.DefaultMaxTokens < 1:
		return invalid("--default-max-tokens=%d must be at least 1", c.DefaultMaxTokens)
	case c.KVEventsWire != WireMap && c.KVEventsWire != WireArray:
		return invalid("--kv-events-wire=%q must be map or array", c.KVEventsWire)
	case c.ReplayLayout != ReplayNew && c.ReplayLayout != ReplayLegacy:
		return invalid("--replay-layout=%q must be new or legacy", c.ReplayLayout)
	case c.ReplayBufferSteps < 1:
		return invalid("--replay-buffer-steps=%d must be at least 1", c.ReplayBufferSteps)
	case c.KVEventsFirstSeq != 0 && c.KVEventsFirstSeq != 1:
		return invalid("--kv-events-first-seq=%d must be 0 (vLLM) or 1 (llm-d publishers)", c.KVEventsFirstSeq)
	case c.DataParallelSize < 1 || c.DataParallelSize > 256:
		return invalid("--data-parallel-size=%d must be between 1 and 256", c.DataParallelSize)
	case c.Role != RoleBoth && c.Role != RolePrefill && c.Role != RoleDecode:
		return invalid("--role=%q must be both, prefill or decode", c.Role)
	case c.TimeScale < 0:
		return invalid("--time-scale=%v must not be negative", c.TimeScale)
	case c.Fleet < 0:
		return invalid("--fleet=%d must not be negative", c.Fleet)
	case c.BasePort < 0 || c.BasePort > 65535:
		return invalid("--base-port=%d is not a port", c.BasePort)
	}
	for _, d := range []struct {
		flag string
		v    time.Duration
	}{
		{"--step-base", c.Timing.StepBase}, {"--prefill-per-token", c.Timing.PrefillPerToken},
		{"--decode-per-seq", c.Timing.DecodePerSeq}, {"--cpu-load-per-token", c.Timing.CPULoadPerToken},
		{"--kv-transfer-per-token", c.Timing.KVTransferPerToken},
	} {
		if d.v < 0 {
			return invalid("%s=%v must not be negative", d.flag, d.v)
		}
	}
	if err := c.Faults.validate(); err != nil {
		return err
	}
	for _, ep := range []struct{ flag, v string }{
		{"--kv-events-endpoint", c.KVEventsEndpoint}, {"--kv-events-replay-endpoint", c.KVEventsReplayEndpoint},
	} {
		if ep.v == "" {
			continue
		}
		if _, err := offsetEndpoint(ep.v, 0); err != nil {
			return invalid("%s=%q: %v", ep.flag, ep.v, err)
		}
	}
	if c.KVEventsReplayEndpoint != "" && !bindsEndpoint(c.KVEventsReplayEndpoint) {
		return invalid("--kv-events-replay-endpoint=%q must be a bind endpoint (tcp://*:port, tcp://host:*, ipc:// or inproc://)", c.KVEventsReplayEndpoint)
	}
	if c.KVEventsReplayEndpoint != "" && c.KVEventsEndpoint == "" {
		return invalid("--kv-events-replay-endpoint=%q needs --kv-events-endpoint", c.KVEventsReplayEndpoint)
	}
	for _, spec := range c.Tokenizers {
		if spec.Model != c.Model {
			return invalid("--tokenizer=%s names model %q but this engine serves %q", spec, spec.Model, c.Model)
		}
	}
	for _, l := range c.LoRAModules {
		if l == "" || l == c.Model {
			return invalid("--lora-modules entry %q must be a non-empty name other than --model", l)
		}
	}
	if _, err := logging.ParseLevel(c.LogLevel); err != nil {
		return invalid("%v", err)
	}
	if err := logging.ValidateFormat(c.LogFormat); err != nil {
		return invalid("%v", err)
	}
	if c.Fleet > 1 {
		return c.validateFleet()
	}
	return nil
}

func (f Faults) validate() error {
	switch {
	case f.DropEveryNBatches < 0:
		return invalid("--fault-drop-every-n-batches=%d must not be negative", f.DropEveryNBatches)
	case f.FailRate < 0 || f.FailRate > 1:
		return invalid("--fault-fail-rate=%v must be between 0 and 1", f.FailRate)
	case f.FailStatus != 500 && f.FailStatus != 429:
		return invalid("--fault-fail-status=%d must be 500 or 429", f.FailStatus)
	case f.HangBeforeFirstToken < 0:
		return invalid("--fault-hang-before-first-token=%v must not be negative", f.HangBeforeFirstToken)
	case f.AbortAfterTokens < 0:
		return invalid("--fault-abort-after-tokens=%d must not be negative", f.AbortAfterTokens)
	case f.StallAfterTokens < 0:
		return invalid("--fault-stall-after-tokens=%d must not be negative", f.StallAfterTokens)
	}
	return nil
}

// validateFleet checks that fleet members get distinct ports and topics.
func (c *Config) validateFleet() error {
	if c.KVEventsTopic != "" {
		return invalid("--kv-events-topic=%q cannot be shared by a --fleet of %d engines; leave it empty so each gets kv@host:port@model", c.KVEventsTopic, c.Fleet)
	}
	if base := c.fleetBasePort(); base+c.Fleet-1 > 65535 {
		return invalid("--base-port=%d cannot host --fleet=%d engines", base, c.Fleet)
	}
	used := map[int]string{}
	claim := func(port int, what string) error {
		if port == 0 {
			return nil // a free port picked at bind time
		}
		if prev, ok := used[port]; ok {
			return invalid("--fleet=%d: port %d would be used by both %s and %s; move --base-port or the event endpoints", c.Fleet, port, prev, what)
		}
		used[port] = what
		return nil
	}
	for i := 0; i < c.Fleet; i++ {
		m := c.fleetMember(i)
		if err := claim(m.Port, fmt.Sprintf("engine %d HTTP", i)); err != nil {
			return err
		}
		for _, ep := range []struct{ name, v string }{{"events", m.KVEventsEndpoint}, {"replay", m.KVEventsReplayEndpoint}} {
			if ep.v == "" || !bindsEndpoint(ep.v) {
				continue
			}
			port, ok := endpointPort(ep.v)
			if !ok {
				continue
			}
			for r := 0; r < c.DataParallelSize; r++ {
				if err := claim(port+r, fmt.Sprintf("engine %d rank %d %s", i, r, ep.name)); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

func (c *Config) fleetBasePort() int {
	if c.BasePort != 0 {
		return c.BasePort
	}
	return c.Port
}

// FleetMembers returns the configs of the engines a fleet runs (one config, itself,
// when Fleet <= 1). Layout for engine i (0-based) with data-parallel size D:
//   - HTTP port: base + i, base = --base-port (or --port when --base-port is 0);
//     when both are 0 every engine picks a free port;
//   - events: a bind endpoint's port + i*D (+ rank); a connect endpoint unchanged, so
//     every engine connects to the same indexer address;
//   - replay: the replay endpoint's port + i*D (+ rank);
//   - topic: kv@<host>:<its HTTP port>@<model>.
//
// Wildcard ports (tcp://host:*) stay wildcards.
func (c Config) FleetMembers() []Config {
	if c.Fleet <= 1 {
		return []Config{c}
	}
	out := make([]Config, c.Fleet)
	for i := range out {
		out[i] = c.fleetMember(i)
	}
	return out
}

func (c Config) fleetMember(i int) Config {
	m := c
	m.Fleet = 0
	m.BasePort = 0
	if base := c.fleetBasePort(); base != 0 {
		m.Port = base + i
	}
	stride := i * c.DataParallelSize
	if c.KVEventsEndpoint != "" && bindsEndpoint(c.KVEventsEndpoint) {
		m.KVEventsEndpoint, _ = offsetEndpoint(c.KVEventsEndpoint, stride)
	}
	if c.KVEventsReplayEndpoint != "" {
		m.KVEventsReplayEndpoint, _ = offsetEndpoint(c.KVEventsReplayEndpoint, stride)
	}
	if c.LoRAModules != nil {
		m.LoRAModules = append([]string(nil), c.LoRAModules...)
	}
	return m
}

// bindsEndpoint applies vLLM's heuristic: bind for wildcards, ipc and inproc.
func bindsEndpoint(ep string) bool {
	return strings.Contains(ep, "*") || strings.Contains(ep, "::") ||
		strings.HasPrefix(ep, "ipc://") || strings.HasPrefix(ep, "inproc://")
}

func endpointPort(ep string) (int, bool) {
	if !strings.HasPrefix(ep, "tcp://") {
		return 0, false
	}
	i := strings.LastIndexByte(ep, ':')
	port, err := strconv.Atoi(ep[i+1:])
	return port, err == nil
}

// offsetEndpoint moves a tcp endpoint's port by n (vLLM's offset_endpoint_port):
// tcp ports are incremented (a '*' port stays '*'), ipc and inproc get a _dp<n>
// suffix.
func offsetEndpoint(ep string, n int) (string, error) {
	switch {
	case strings.HasPrefix(ep, "inproc://"), strings.HasPrefix(ep, "ipc://"):
		if n == 0 {
			return ep, nil
		}
		return fmt.Sprintf("%s_dp%d", ep, n), nil
	case strings.HasPrefix(ep, "tcp://"):
		host, port, err := net.SplitHostPort(strings.TrimPrefix(ep, "tcp://"))
		if err != nil {
			return "", fmt.Errorf("want tcp://host:port: %v", err)
		}
		if port == "*" {
			return ep, nil
		}
		p, err := strconv.Atoi(port)
		if err != nil || p < 1 || p+n > 65535 {
			return "", fmt.Errorf("port %q (+%d) is not a port", port, n)
		}
		return "tcp://" + net.JoinHostPort(host, strconv.Itoa(p+n)), nil
	}
	return "", errors.New("want a tcp://, ipc:// or inproc:// endpoint")
}

// stringFlag binds a string-typed enum to a flag.
type stringFlag[T ~string] struct{ v *T }

func (s stringFlag[T]) String() string {
	if s.v == nil {
		return ""
	}
	return string(*s.v)
}
func (s stringFlag[T]) Set(v string) error { *s.v = T(v); return nil }

// RegisterFlags defines every flag on fs, bound to cfg, with cfg's current values as
// the defaults shown by --help.
func RegisterFlags(fs *flag.FlagSet, cfg *Config) {
	fs.StringVar(&cfg.Model, "model", cfg.Model, "model `name` served and stamped in the default topic")
	fs.StringVar(&cfg.Host, "host", cfg.Host, "HTTP bind `address`")
	fs.IntVar(&cfg.Port, "port", cfg.Port, "HTTP `port` (0 picks a free one)")
	fs.IntVar(&cfg.BlockSize, "block-size", cfg.BlockSize, "tokens per KV block")
	fs.IntVar(&cfg.NumGPUBlocks, "num-gpu-blocks", cfg.NumGPUBlocks, "GPU KV blocks per data-parallel rank; the default is what Llama-3.1-8B leaves on an 80 GB H100")
	fs.IntVar(&cfg.NumCPUBlocks, "num-cpu-blocks", cfg.NumCPUBlocks, "CPU offload tier blocks per rank; evicted GPU blocks move there and are announced with medium CPU (0 disables)")
	fs.IntVar(&cfg.MaxModelLen, "max-model-len", cfg.MaxModelLen, "longest prompt + max_tokens accepted")
	fs.IntVar(&cfg.MaxNumSeqs, "max-num-seqs", cfg.MaxNumSeqs, "running batch limit per rank; more requests wait in FIFO order")
	fs.IntVar(&cfg.MaxNumBatchedTokens, "max-num-batched-tokens", cfg.MaxNumBatchedTokens, "token budget of one engine step (chunked prefill)")
	fs.IntVar(&cfg.DefaultMaxTokens, "default-max-tokens", cfg.DefaultMaxTokens, "max_tokens of requests that give none")
	fs.StringVar(&cfg.KVEventsEndpoint, "kv-events-endpoint", cfg.KVEventsEndpoint, "ZMQ PUB `endpoint`: binds for tcp://*:port, tcp://host:* (free port), ipc://, inproc://; connects otherwise; rank r uses port+r; empty disables events")
	fs.StringVar(&cfg.KVEventsTopic, "kv-events-topic", cfg.KVEventsTopic, "ZMQ topic (default kv@<host>:<port>@<model>)")
	fs.Var(stringFlag[WireFormat]{&cfg.KVEventsWire}, "kv-events-wire", "encode events as msgspec tagged `map|array` (map: vLLM >= 0.26; array: older vLLM)")
	fs.StringVar(&cfg.KVEventsReplayEndpoint, "kv-events-replay-endpoint", cfg.KVEventsReplayEndpoint, "ZMQ ROUTER bind `endpoint` answering replay requests; rank r uses port+r; empty disables replay")
	fs.Var(stringFlag[ReplayLayout]{&cfg.ReplayLayout}, "replay-layout", "reply to replay requests in the `new|legacy` layout: [topic, seq, payload] (vLLM >= 0.26) or [seq, payload] (older vLLM, SGLang)")
	fs.IntVar(&cfg.ReplayBufferSteps, "replay-buffer-steps", cfg.ReplayBufferSteps, "event batches kept per rank for replay")
	fs.Int64Var(&cfg.KVEventsFirstSeq, "kv-events-first-seq", cfg.KVEventsFirstSeq, "seq of the first event batch after a start or restart: 0 (vLLM) or 1 (llm-d's publishers)")
	fs.IntVar(&cfg.DataParallelSize, "data-parallel-size", cfg.DataParallelSize, "data-parallel ranks: each has its own KV cache and event stream on port+rank")
	fs.Var(stringFlag[Role]{&cfg.Role}, "role", "this engine's `both|prefill|decode` role in disaggregation: prefill answers do_remote_decode with kv_transfer_params, decode takes do_remote_prefill")
	fs.Float64Var(&cfg.TimeScale, "time-scale", cfg.TimeScale, "wall time per simulated second (0.1 runs 10x faster than real time; 0 never sleeps)")
	fs.DurationVar(&cfg.Timing.StepBase, "step-base", cfg.Timing.StepBase, "fixed cost of one engine step (forward pass)")
	fs.DurationVar(&cfg.Timing.PrefillPerToken, "prefill-per-token", cfg.Timing.PrefillPerToken, "cost of each uncached prompt token")
	fs.DurationVar(&cfg.Timing.DecodePerSeq, "decode-per-seq", cfg.Timing.DecodePerSeq, "extra step cost per decoding sequence")
	fs.DurationVar(&cfg.Timing.CPULoadPerToken, "cpu-load-per-token", cfg.Timing.CPULoadPerToken, "cost of each prompt token loaded back from the CPU tier")
	fs.DurationVar(&cfg.Timing.KVTransferPerToken, "kv-transfer-per-token", cfg.Timing.KVTransferPerToken, "cost of each prompt token received from a prefill engine (role decode)")
	fs.Var(&cfg.Tokenizers, "tokenizer", "`model=dir` of a Hugging Face tokenizer (repeatable); the engine then tokenizes with it (internal/tokenize); without it the built-in byte-level tokenizer is used")
	fs.Var(envflag.List{Items: &cfg.LoRAModules}, "lora-modules", "comma-separated LoRA adapter `names` served besides --model (requests naming one get lora_name in events)")
	fs.Uint64Var(&cfg.BlockHashSeed, "block-hash-seed", cfg.BlockHashSeed, "seed of the opaque engine block hashes (0 = random per engine)")
	fs.IntVar(&cfg.Faults.DropEveryNBatches, "fault-drop-every-n-batches", cfg.Faults.DropEveryNBatches, "withhold every Nth event batch from PUB (kept for replay); 0 disables")
	fs.Float64Var(&cfg.Faults.FailRate, "fault-fail-rate", cfg.Faults.FailRate, "fraction of completion requests to fail")
	fs.IntVar(&cfg.Faults.FailStatus, "fault-fail-status", cfg.Faults.FailStatus, "HTTP status of failed requests: 500 or 429")
	fs.DurationVar(&cfg.Faults.HangBeforeFirstToken, "fault-hang-before-first-token", cfg.Faults.HangBeforeFirstToken, "wall-time delay before any request is queued")
	fs.IntVar(&cfg.Faults.AbortAfterTokens, "fault-abort-after-tokens", cfg.Faults.AbortAfterTokens, "break every streamed response's connection after this many token chunks; 0 disables")
	fs.IntVar(&cfg.Faults.StallAfterTokens, "fault-stall-after-tokens", cfg.Faults.StallAfterTokens, "stop every streamed response after this many token chunks, open, until the client leaves; 0 disables")
	fs.IntVar(&cfg.Fleet, "fleet", cfg.Fleet, "run N engines in this process (see --base-port)")
	fs.IntVar(&cfg.BasePort, "base-port", cfg.BasePort, "HTTP port of fleet engine 0; engine i listens on base+i and shifts bind event/replay ports by i*data-parallel-size (0 = --port)")
	fs.StringVar(&cfg.LogLevel, "log-level", cfg.LogLevel, "debug, info, warn or error")
	fs.StringVar(&cfg.LogFormat, "log-format", cfg.LogFormat, "text or json")
}

// ParseFlags builds a Config from defaults, KVINDEX_FAKEENGINE_* variables (looked up
// with lookup, os.LookupEnv when nil) and args, in increasing precedence, and
// validates it. --help prints every flag to out and returns flag.ErrHelp.
func ParseFlags(args []string, out io.Writer, lookup func(string) (string, bool)) (Config, error) {
	cfg := DefaultConfig()
	fs := flag.NewFlagSet("fakeengine", flag.ContinueOnError)
	fs.SetOutput(out)
	RegisterFlags(fs, &cfg)
	fs.Usage = envflag.Usage(fs, EnvPrefix, "usage: fakeengine [flags]\n\nA vLLM-compatible fake inference engine that publishes real KV cache events.")
	if err := envflag.Parse(fs, EnvPrefix, args, lookup); err != nil {
		return Config{}, err
	}
	if fs.NArg() > 0 {
		return Config{}, invalid("unexpected argument %q", fs.Arg(0))
	}
	if err := cfg.Validate(); err != nil {
		return Config{}, err
	}
	return cfg, nil
}
