package router

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvindex/kvindex/internal/envflag"
	"github.com/kvindex/kvindex/internal/logging"
	"github.com/kvindex/kvindex/internal/tokenize"
	"github.com/kvindex/kvindex/internal/workerspec"
)

// EnvPrefix is the prefix of the router's environment variables: --router-policy is
// read from KVINDEX_ROUTER_ROUTER_POLICY when the flag is not given.
const EnvPrefix = "KVINDEX_ROUTER_"

// ErrInvalidConfig is wrapped by every configuration error; the message names the
// flag and the bad value.
var ErrInvalidConfig = errors.New("invalid router configuration")

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, args...))
}

// Policy names (--router-policy).
const (
	PolicyKVAware     = "kv-aware"
	PolicyRoundRobin  = "round-robin"
	PolicyRandom      = "random"
	PolicyPowerOfTwo  = "power-of-two"
	PolicyLeastLoaded = "least-loaded"
	PolicySession     = "session"
	PolicyPrefixHash  = "prefix-hash"
)

// Policies lists every --router-policy value.
var Policies = []string{PolicyKVAware, PolicyRoundRobin, PolicyRandom, PolicyPowerOfTwo, PolicyLeastLoaded, PolicySession, PolicyPrefixHash}

// Cost functions of the kv-aware policy (--router-cost).
const (
	CostDynamo  = "dynamo"
	CostLMetric = "lmetric"
)

// Router modes (--router-mode).
const (
	ModeAuto   = "auto"
	ModeDirect = "direct"
)

// Config is everything the router needs; DefaultConfig gives the defaults and
// Validate checks a filled one.
type Config struct {
	Listen string
	// EPP is the endpoint-picker (Envoy ext_proc) server, epp.go.
	EPP EPPConfig
	// Kube is Kubernetes pod discovery, discovery.go.
	Kube KubeConfig

	// Indexer lists the indexer cluster's gRPC addresses; empty runs the router on
	// its own approximate index.
	Indexer        []string
	IndexerTimeout time.Duration
	// IndexerRetryAfter is how long the router routes without the indexer after a
	// failed query before it asks again.
	IndexerRetryAfter time.Duration

	// Ledger shares load, decisions and session bindings with the other routers
	// through the indexer leader (LoadService); on by default with --indexer.
	Ledger         bool
	LedgerInterval time.Duration
	// RouterID names this router on the ledger; default host-pid.
	RouterID string
	// IndexerToken is sent as a bearer token on the ledger stream: the
	// indexer's --ledger-token, which opens LoadService only (its --admin-token
	// works too, and opens every admin call).
	IndexerToken string
	// TLS to the indexer: a CA to verify it (enables TLS), a client certificate
	// for mutual TLS, and a server name to verify instead of the address's host.
	IndexerTLSCA, IndexerTLSCert, IndexerTLSKey, IndexerTLSServerName string

	Workers            []workerspec.Spec
	WorkersFile        string
	WorkersFromIndexer bool
	// WorkersRefresh is the period of the workers-file check, the indexer registry
	// poll and each worker's /v1/models poll.
	WorkersRefresh time.Duration
	// BlockSize is the block size of workers whose spec does not give one.
	BlockSize int

	Tokenizers         tokenize.Specs
	TokenizeCacheBytes int64
	// ChatTemplateContentFormat is vLLM's --chat-template-content-format: how chat
	// templates receive message content (auto: detected from the template as vLLM
	// does). It must be the engines' setting.
	ChatTemplateContentFormat string

	Policy      string
	Mode        string
	Cost        string
	Temperature float64
	// PrefillScale weighs prefill blocks against decode blocks in the cost.
	PrefillScale float64
	// CreditHalfLife is, in blocks of active prefill above the least-loaded
	// candidate's, how fast a candidate's cache credit halves (the hot-spot guard).
	CreditHalfLife float64
	// SessionWeight is the kv-aware cost bonus, as a fraction of the prompt's
	// blocks, for the worker a session was last routed to.
	SessionWeight float64
	PredictedTTL  time.Duration
	ApproxTTL     time.Duration
	// OverlayMaxBlocks bounds the store of recent decisions (the predicted overlay
	// and the approximate index) in entries.
	OverlayMaxBlocks int
	// SessionTTL bounds how long a session remembers its worker.
	SessionTTL time.Duration
	RingVNodes int
	// Key extraction bounds of the session and prefix-hash policies.
	ExplicitKeyMaxLength     int
	SystemSegmentMaxLength   int
	DocumentSegmentMaxLength int

	MaxActivePrefillTokens int
	MaxActiveDecodeBlocks  int
	ReservationTTL         time.Duration
	// DefaultOutputTokens is the output length assumed for decode load when a
	// request does not set max_tokens.
	DefaultOutputTokens int

	ScrapeEngineMetrics bool
	ScrapeInterval      time.Duration

	PDMinUncachedTokens int

	BreakerFailureThreshold int
	BreakerCooldown         time.Duration
	BreakerMaxCooldown      time.Duration

	RequestMaxRetries  int
	FirstByteTimeout   time.Duration
	RequestIdleTimeout time.Duration
	MaxPending         int
	QueueSize          int
	QueueTimeout       time.Duration

	MaxBodyBytes    int64
	BodyReadTimeout time.Duration // longest time to receive a request body
	ShutdownTimeout time.Duration

	ParityInterval time.Duration

	LogLevel  string
	LogFormat string
}

// DefaultConfig returns the defaults documented in --help.
func DefaultConfig() Config {
	return Config{
		Listen:                    "127.0.0.1:8000",
		EPP:                       DefaultEPPConfig(),
		Kube:                      DefaultKubeConfig(),
		IndexerTimeout:            20 * time.Millisecond,
		IndexerRetryAfter:         time.Second,
		Ledger:                    true,
		LedgerInterval:            10 * time.Millisecond,
		WorkersRefresh:            5 * time.Second,
		BlockSize:                 16,
		TokenizeCacheBytes:        tokenize.DefaultCacheBytes,
		ChatTemplateContentFormat: string(tokenize.ContentFormatAuto),
		Policy:                    PolicyKVAware,
		Mode:                      ModeAuto,
		Cost:                      CostDynamo,
		PrefillScale:              8,
		CreditHalfLife:            64,
		SessionWeight:             0.25,
		PredictedTTL:              5 * time.Second,
		ApproxTTL:                 2 * time.Minute,
		OverlayMaxBlocks:          1 << 20,
		SessionTTL:                30 * time.Minute,
		RingVNodes:                160,
		ExplicitKeyMaxLength:      128,
		SystemSegmentMaxLength:    512,
		DocumentSegmentMaxLength:  256,
		ReservationTTL:            15 * time.Minute,
		DefaultOutputTokens:       256,
		ScrapeInterval:            time.Second,
		BreakerFailureThreshold:   3,
		BreakerCooldown:           5 * time.Second,
		BreakerMaxCooldown:        60 * time.Second,
		RequestMaxRetries:         1,
		FirstByteTimeout:          60 * time.Second,
		RequestIdleTimeout:        900 * time.Second,
		QueueSize:                 128,
		QueueTimeout:              30 * time.Second,
		MaxBodyBytes:              32 << 20,
		BodyReadTimeout:           30 * time.Second,
		ShutdownTimeout:           30 * time.Second,
		ParityInterval:            5 * time.Minute,
		LogLevel:                  "info",
		LogFormat:                 "text",
	}
}

// Validate reports the first bad value, naming its flag.
func (c *Config) Validate() error {
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		return invalid("--listen=%q: %v", c.Listen, err)
	}
	for _, a := range c.Indexer {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return invalid("--indexer address %q: %v", a, err)
		}
	}
	if c.WorkersFromIndexer && len(c.Indexer) == 0 {
		return invalid("--workers-from-indexer needs --indexer")
	}
	seen := map[string]bool{}
	for _, w := range c.Workers {
		if seen[w.ID] {
			return invalid("--worker id %q given twice", w.ID)
		}
		seen[w.ID] = true
	}
	positive := []struct {
		flag string
		v    time.Duration
	}{
		{"--indexer-timeout", c.IndexerTimeout}, {"--indexer-retry-after", c.IndexerRetryAfter}, {"--ledger-interval", c.LedgerInterval},
		{"--workers-refresh", c.WorkersRefresh}, {"--router-predicted-ttl", c.PredictedTTL},
		{"--approx-ttl", c.ApproxTTL}, {"--session-ttl", c.SessionTTL}, {"--reservation-ttl", c.ReservationTTL},
		{"--scrape-interval", c.ScrapeInterval}, {"--breaker-cooldown-s", c.BreakerCooldown},
		{"--breaker-max-cooldown-s", c.BreakerMaxCooldown}, {"--first-byte-timeout", c.FirstByteTimeout},
		{"--queue-timeout", c.QueueTimeout}, {"--shutdown-timeout", c.ShutdownTimeout}, {"--body-read-timeout", c.BodyReadTimeout},
		{"--parity-interval", c.ParityInterval},
	}
	for _, p := range positive {
		if p.v <= 0 {
			return invalid("%s=%s must be positive", p.flag, p.v)
		}
	}
	switch {
	case len(c.RouterID) > workerspec.MaxNameBytes:
		// the indexer refuses a longer name on the ledger, and the stream would never come up
		return invalid("--router-id of %d bytes is longer than %d", len(c.RouterID), workerspec.MaxNameBytes)
	case c.RequestIdleTimeout < 0:
		return invalid("--request-idle-timeout=%s must not be negative (0: none)", c.RequestIdleTimeout)
	case c.BlockSize < 1 || c.BlockSize > workerspec.MaxBlockSize:
		return invalid("--block-size=%d must be between 1 and %d", c.BlockSize, workerspec.MaxBlockSize)
	case c.TokenizeCacheBytes < 0:
		return invalid("--tokenize-cache-bytes=%d must not be negative", c.TokenizeCacheBytes)
	case !slices.Contains(tokenize.ContentFormats, tokenize.ContentFormat(c.ChatTemplateContentFormat)):
		return invalid("--chat-template-content-format=%q must be auto, string or openai", c.ChatTemplateContentFormat)
	case !slices.Contains(Policies, c.Policy):
		return invalid("--router-policy=%q must be one of %s", c.Policy, strings.Join(Policies, ", "))
	case c.Mode != ModeAuto && c.Mode != ModeDirect:
		return invalid("--router-mode=%q must be auto or direct", c.Mode)
	case c.Cost != CostDynamo && c.Cost != CostLMetric:
		return invalid("--router-cost=%q must be dynamo or lmetric", c.Cost)
	case c.Temperature < 0:
		return invalid("--router-temperature=%g must not be negative", c.Temperature)
	case c.PrefillScale <= 0:
		return invalid("--prefill-scale=%g must be positive", c.PrefillScale)
	case c.CreditHalfLife <= 0:
		return invalid("--credit-half-life-blocks=%g must be positive", c.CreditHalfLife)
	case c.SessionWeight < 0 || c.SessionWeight > 1:
		return invalid("--session-weight=%g must be between 0 and 1", c.SessionWeight)
	case c.OverlayMaxBlocks < 1:
		return invalid("--overlay-max-blocks=%d must be positive", c.OverlayMaxBlocks)
	case c.RingVNodes < 1 || c.RingVNodes > 4096:
		return invalid("--ring-vnodes=%d must be between 1 and 4096", c.RingVNodes)
	case c.ExplicitKeyMaxLength < 1 || c.SystemSegmentMaxLength < 1 || c.DocumentSegmentMaxLength < 1:
		return invalid("key length bounds (--explicit-key-max-length=%d, --system-segment-max-length=%d, --document-segment-max-length=%d) must be positive",
			c.ExplicitKeyMaxLength, c.SystemSegmentMaxLength, c.DocumentSegmentMaxLength)
	case c.MaxActivePrefillTokens < 0:
		return invalid("--max-active-prefill-tokens=%d must not be negative (0: no limit)", c.MaxActivePrefillTokens)
	case c.MaxActiveDecodeBlocks < 0:
		return invalid("--max-active-decode-blocks=%d must not be negative (0: no limit)", c.MaxActiveDecodeBlocks)
	case c.DefaultOutputTokens < 1:
		return invalid("--default-output-tokens=%d must be positive", c.DefaultOutputTokens)
	case c.PDMinUncachedTokens < 0:
		return invalid("--pd-min-uncached-tokens=%d must not be negative", c.PDMinUncachedTokens)
	case c.BreakerFailureThreshold < 0:
		return invalid("--breaker-failure-threshold=%d must not be negative (0: breaker off)", c.BreakerFailureThreshold)
	case c.BreakerMaxCooldown < c.BreakerCooldown:
		return invalid("--breaker-max-cooldown-s=%s must be at least --breaker-cooldown-s=%s", c.BreakerMaxCooldown, c.BreakerCooldown)
	case c.RequestMaxRetries < 0 || c.RequestMaxRetries > 16:
		return invalid("--request-max-retries=%d must be between 0 and 16", c.RequestMaxRetries)
	case c.MaxPending < 0:
		return invalid("--max-pending=%d must not be negative (0: no limit)", c.MaxPending)
	case c.QueueSize < 0:
		return invalid("--queue-size=%d must not be negative", c.QueueSize)
	case c.MaxBodyBytes < 1024:
		return invalid("--max-body-bytes=%d must be at least 1024", c.MaxBodyBytes)
	}
	if err := c.EPP.Validate(); err != nil {
		return err
	}
	if err := c.Kube.Validate(); err != nil {
		return err
	}
	if _, err := logging.ParseLevel(c.LogLevel); err != nil {
		return invalid("%v", err)
	}
	if err := logging.ValidateFormat(c.LogFormat); err != nil {
		return invalid("%v", err)
	}
	return nil
}

// seconds is a duration flag that also takes a bare number of seconds, as the
// breaker flags of seeds/000 (--breaker-cooldown-s 5) are given.
type seconds struct{ d *time.Duration }

func (f seconds) String() string {
	if f.d == nil {
		return ""
	}
	return f.d.String()
}

func (f seconds) Set(v string) error {
	if s, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil {
		// Beyond ±292 years the conversion would wrap (1e12 s read as a
		// negative duration) and NaN has no duration.
		if math.IsNaN(s) || math.Abs(s) > float64(math.MaxInt64)/float64(time.Second) {
			return fmt.Errorf("%q seconds is out of range", v)
		}
		*f.d = time.Duration(s * float64(time.Second))
		return nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return fmt.Errorf("%q is neither seconds nor a duration", v)
	}
	*f.d = d
	return nil
}

func registerFlags(fs *flag.FlagSet, c *Config) {
	fs.StringVar(&c.Listen, "listen", c.Listen, "`host:port` of the OpenAI-compatible proxy (also /metrics, /healthz, /readyz, /debug/route)")
	fs.Var(envflag.List{Items: &c.Indexer}, "indexer", "indexer gRPC `host:port[,host:port…]` (a cluster's members; the router follows the one that answers); empty: route on the router's own approximate index")
	fs.DurationVar(&c.IndexerTimeout, "indexer-timeout", c.IndexerTimeout, "deadline of one indexer query; past it the request is routed on the predicted/approximate overlap")
	fs.DurationVar(&c.IndexerRetryAfter, "indexer-retry-after", c.IndexerRetryAfter, "after a failed indexer query, route without the indexer for this long before asking again")
	fs.BoolVar(&c.Ledger, "ledger", c.Ledger, "share load, decisions and session bindings with the other routers through the indexer leader (needs --indexer)")
	fs.DurationVar(&c.LedgerInterval, "ledger-interval", c.LedgerInterval, "how often the router reports what changed of its load to the ledger")
	fs.StringVar(&c.RouterID, "router-id", c.RouterID, "this router's name on the ledger (default host-pid)")
	fs.StringVar(&c.IndexerToken, "indexer-token", c.IndexerToken, "bearer `token` for the ledger stream: the indexer's --ledger-token (it opens the ledger only), or its --admin-token when it has no ledger token; empty when the indexer has no --admin-token")
	fs.StringVar(&c.IndexerTLSCA, "indexer-tls-ca", c.IndexerTLSCA, "PEM CA `file` to verify the indexer with (enables TLS to it)")
	fs.StringVar(&c.IndexerTLSCert, "indexer-tls-cert", c.IndexerTLSCert, "PEM client certificate `file` for mutual TLS with the indexer (with --indexer-tls-key)")
	fs.StringVar(&c.IndexerTLSKey, "indexer-tls-key", c.IndexerTLSKey, "PEM client key `file` for mutual TLS with the indexer")
	fs.StringVar(&c.IndexerTLSServerName, "indexer-tls-server-name", c.IndexerTLSServerName, "server name to verify the indexer's certificate against instead of the address's host")
	fs.Var((*workerspec.List)(&c.Workers), "worker", "a worker in the indexer's syntax `id=…,http=URL,model=M[,role=both|prefill|decode][,dp-size=N][,block-size=N][,label.k=v]` (repeatable, or several in one value separated by ';'; event keys are accepted and ignored)")
	fs.StringVar(&c.WorkersFile, "workers-file", c.WorkersFile, "YAML `file` of workers (the indexer's layout), re-read when it changes")
	fs.BoolVar(&c.WorkersFromIndexer, "workers-from-indexer", c.WorkersFromIndexer, "take the workers from the indexer's registry (kept current by polling and Watch)")
	fs.DurationVar(&c.WorkersRefresh, "workers-refresh", c.WorkersRefresh, "period of the workers-file check, the registry poll and each worker's /v1/models poll")
	fs.IntVar(&c.BlockSize, "block-size", c.BlockSize, "tokens per KV block of workers whose spec gives no block-size (vLLM --block-size)")
	fs.Var(&c.Tokenizers, "tokenizer", "`model=dir` of the model's Hugging Face tokenizer.json + tokenizer_config.json (repeatable; several in one value separated by ';', as the environment variable takes them); models without one use the built-in byte-level tokenizer (the fake engine's), which a real engine does not share: watch kvindex_router_token_parity")
	fs.Int64Var(&c.TokenizeCacheBytes, "tokenize-cache-bytes", c.TokenizeCacheBytes, "memory budget of the tokenization cache (segments and prompt block keys)")
	fs.StringVar(&c.ChatTemplateContentFormat, "chat-template-content-format", c.ChatTemplateContentFormat, "how chat templates receive message content, as vLLM's flag of the same name (give the engines' value): auto (detected from the template as vLLM does: a template that loops over message['content'] gets a list of text parts), string (text parts joined with \\n) or openai (a list of {\"type\": \"text\", \"text\": ...})")
	fs.StringVar(&c.Policy, "router-policy", c.Policy, "routing policy: "+strings.Join(Policies, "|"))
	fs.StringVar(&c.Mode, "router-mode", c.Mode, "auto: the policy picks; direct: dispatch to the x-worker-instance-id (and x-prefill-instance-id) header, the policy when absent")
	fs.StringVar(&c.Cost, "router-cost", c.Cost, "kv-aware cost: dynamo (prefill_scale·max(active_prefill+prompt−credit·overlap, 0)+active_decode) or lmetric (uncached_prefill·(load+1))")
	fs.Float64Var(&c.Temperature, "router-temperature", c.Temperature, "0: argmin of the cost with random tie-break; >0: softmax sampling over normalized costs")
	fs.Float64Var(&c.PrefillScale, "prefill-scale", c.PrefillScale, "weight of prefill blocks against decode blocks in the dynamo cost: a block prefilled costs the engine far more than a block held by a decoding sequence (bench/RESULTS.md, route bench)")
	fs.Float64Var(&c.CreditHalfLife, "credit-half-life-blocks", c.CreditHalfLife, "hot-spot guard: a candidate's cache credit halves per this many blocks of active prefill above the least-loaded candidate's")
	fs.Float64Var(&c.SessionWeight, "session-weight", c.SessionWeight, "kv-aware: cost bonus (fraction of the prompt's blocks) for the worker a session last went to; a soft preference, never a pin")
	fs.DurationVar(&c.PredictedTTL, "router-predicted-ttl", c.PredictedTTL, "how long a decision counts as predicted overlap for its worker (co-locates a burst before the engine's events arrive)")
	fs.DurationVar(&c.ApproxTTL, "approx-ttl", c.ApproxTTL, "how long a decision counts in the approximate index used while the indexer is down")
	fs.IntVar(&c.OverlayMaxBlocks, "overlay-max-blocks", c.OverlayMaxBlocks, "bound on the entries of the store of recent decisions (predicted overlay and approximate index); the oldest go first")
	fs.DurationVar(&c.SessionTTL, "session-ttl", c.SessionTTL, "how long a session remembers the worker it went to")
	fs.IntVar(&c.RingVNodes, "ring-vnodes", c.RingVNodes, "virtual nodes per worker rank on the consistent-hash ring (session, prefix-hash)")
	fs.IntVar(&c.ExplicitKeyMaxLength, "explicit-key-max-length", c.ExplicitKeyMaxLength, "longest accepted X-Cache-Key / cache_key / session id; longer keys are ignored")
	fs.IntVar(&c.SystemSegmentMaxLength, "system-segment-max-length", c.SystemSegmentMaxLength, "characters of system messages kept in the canonical prefix key")
	fs.IntVar(&c.DocumentSegmentMaxLength, "document-segment-max-length", c.DocumentSegmentMaxLength, "characters of document context kept in the canonical prefix key")
	fs.IntVar(&c.MaxActivePrefillTokens, "max-active-prefill-tokens", c.MaxActivePrefillTokens, "per worker rank: busy above this many uncached prefill tokens in flight (this router's and, with --ledger, the other routers'; 0: no limit)")
	fs.IntVar(&c.MaxActiveDecodeBlocks, "max-active-decode-blocks", c.MaxActiveDecodeBlocks, "per worker rank: busy above this many decode blocks in flight (this router's and, with --ledger, the other routers'; 0: no limit)")
	fs.DurationVar(&c.ReservationTTL, "reservation-ttl", c.ReservationTTL, "a sweep drops load reservations older than this (a leak guard; longer than any request)")
	fs.IntVar(&c.DefaultOutputTokens, "default-output-tokens", c.DefaultOutputTokens, "output tokens assumed for decode load when a request sets no max_tokens")
	fs.BoolVar(&c.ScrapeEngineMetrics, "scrape-engine-metrics", c.ScrapeEngineMetrics, "read vllm:num_requests_waiting/running and vllm:kv_cache_usage_perc (as blocks, with vllm:cache_config_info's num_gpu_blocks) from each worker's /metrics and fold them into load: requests other routers or clients sent count too")
	fs.DurationVar(&c.ScrapeInterval, "scrape-interval", c.ScrapeInterval, "period of the engine /metrics scrape")
	fs.IntVar(&c.PDMinUncachedTokens, "pd-min-uncached-tokens", c.PDMinUncachedTokens, "disaggregate only when at least this many prompt tokens are uncached on the decode worker; below, decode prefills locally")
	fs.IntVar(&c.BreakerFailureThreshold, "breaker-failure-threshold", c.BreakerFailureThreshold, "consecutive faults (connect errors, 5xx, timeouts; never 4xx or 429) before a worker is excluded; 0 disables the breaker")
	fs.Var(seconds{&c.BreakerCooldown}, "breaker-cooldown-s", "exclusion window before one probe request is admitted (seconds or a duration)")
	fs.Var(seconds{&c.BreakerMaxCooldown}, "breaker-max-cooldown-s", "cap of the cooldown, which doubles on every failed probe (seconds or a duration)")
	fs.IntVar(&c.RequestMaxRetries, "request-max-retries", c.RequestMaxRetries, "retries on another worker before the first response byte (connect error, 5xx, 429, first-byte timeout); never after bytes reached the client")
	fs.DurationVar(&c.FirstByteTimeout, "first-byte-timeout", c.FirstByteTimeout, "longest wait for a streamed answer's first body byte (the first token) and for a prefill leg's answer before the attempt counts as failed and is retried elsewhere; a non-streamed answer, which vLLM sends only when the generation ends, waits up to --request-idle-timeout instead")
	fs.DurationVar(&c.RequestIdleTimeout, "request-idle-timeout", c.RequestIdleTimeout, "longest wait for the next response chunk, for a non-streamed answer (not retried elsewhere when it expires) and for the client to take a chunk (a client that stops reading is cut off, its load released); expiry ends the request (504, or an SSE error event once streaming) and cancels it upstream (0: none)")
	fs.IntVar(&c.MaxPending, "max-pending", c.MaxPending, "per worker rank: requests in flight before it counts as full (this router's and, with --ledger, the other routers'; 0: no limit)")
	fs.IntVar(&c.QueueSize, "queue-size", c.QueueSize, "requests that may wait (FIFO) when every eligible worker is busy or full; beyond it: 429")
	fs.DurationVar(&c.QueueTimeout, "queue-timeout", c.QueueTimeout, "longest wait in the queue before 429 with Retry-After")
	fs.Int64Var(&c.MaxBodyBytes, "max-body-bytes", c.MaxBodyBytes, "largest accepted request body (413 beyond)")
	fs.DurationVar(&c.BodyReadTimeout, "body-read-timeout", c.BodyReadTimeout, "longest time to receive a request's body once its headers arrived (408 beyond, and the connection closes)")
	fs.DurationVar(&c.ShutdownTimeout, "shutdown-timeout", c.ShutdownTimeout, "on SIGTERM, how long in-flight streams may drain")
	fs.DurationVar(&c.ParityInterval, "parity-interval", c.ParityInterval, "period of the token-parity probe against each model's workers' /tokenize")
	fs.StringVar(&c.LogLevel, "log-level", c.LogLevel, "debug|info|warn|error (debug logs every RouteDecision)")
	fs.StringVar(&c.LogFormat, "log-format", c.LogFormat, "text|json")
	registerEPPFlags(fs, &c.EPP)
	registerKubeFlags(fs, &c.Kube)
}

// ParseFlags reads the configuration from args and the environment (flags >
// KVINDEX_ROUTER_* > defaults) and validates it. --help prints every flag to out
// and returns flag.ErrHelp.
func ParseFlags(args []string, out io.Writer, lookup func(string) (string, bool)) (Config, error) {
	c := DefaultConfig()
	fs := flag.NewFlagSet("router", flag.ContinueOnError)
	fs.SetOutput(out)
	registerFlags(fs, &c)
	fs.Usage = envflag.Usage(fs, EnvPrefix, "Usage: router [flags]\n\nThe kvindex router: a KV-aware OpenAI-compatible proxy in front of vLLM/SGLang engines.")
	if err := envflag.Parse(fs, EnvPrefix, args, lookup); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, invalid("unexpected arguments %q", fs.Args())
	}
	return c, c.Validate()
}
