package server

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
	"k8s.io/client-go/kubernetes"

	kvindexv1 "github.com/kvindex/kvindex/api/proto/kvindex/v1"
	"github.com/kvindex/kvindex/internal/envflag"
	"github.com/kvindex/kvindex/internal/ingest"
	"github.com/kvindex/kvindex/internal/kube"
	"github.com/kvindex/kvindex/internal/logging"
	"github.com/kvindex/kvindex/internal/raftstore"
	"github.com/kvindex/kvindex/internal/tokenize"
	"github.com/kvindex/kvindex/internal/workerspec"
)

// EnvPrefix prefixes the environment variable of every indexer flag: --http-addr is
// read from KVINDEX_HTTP_ADDR when not given on the command line.
const EnvPrefix = "KVINDEX_"

// ErrInvalidConfig is wrapped by every configuration error; the message names the
// flag and the bad value.
var ErrInvalidConfig = errors.New("invalid config") // cmd/indexer prefixes "indexer:"

// Config is the indexer's configuration. Precedence: flags > KVINDEX_* environment
// variables > the --config file > DefaultConfig.
type Config struct {
	NodeID string
	// DataDir holds the node's raft log and stable store (raft.db) and its
	// snapshots; a restart resumes from it.
	DataDir  string
	GRPCAddr string
	// GRPCAdvertise is the gRPC address other members and clients reach this
	// node at (forwarded writes, not-leader answers); empty: GRPCAddr as bound,
	// which must then name a specific host.
	GRPCAdvertise string
	HTTPAddr      string
	// ProbeAddr (--probe-addr), when set, is a second, plain-HTTP listener
	// serving only GET /healthz, /readyz and /metrics (probe.go): for
	// kubelet probes and Prometheus, which present no client certificate
	// when TLSClientCA makes HTTPAddr require one. Empty: off.
	ProbeAddr string
	// Join is the gRPC address of a member of the cluster to join (--join);
	// empty: a node without raft state starts a cluster of its own.
	Join string
	// BootstrapPeers (--bootstrap-peers) are the gRPC addresses of the other
	// would-be members. A node with them, without Join and without raft state
	// does not start a cluster at once: it asks each of them (bootstrap.go)
	// and joins the cluster one of them is in, starts one only when every one
	// answered that it is in none, and otherwise waits and asks again.
	BootstrapPeers []string
	// Bootstrap (--bootstrap) states that this node starts the cluster. It is
	// what a node without --join does anyway, so it only guards against a
	// --join given by mistake.
	Bootstrap bool
	// Raft configures replication: the raft address (RaftAddr, RaftAdvertise),
	// batching, snapshots and timing. New fills in NodeID, DataDir, the gRPC
	// address, Bootstrap, the logger, the metrics registerer and the callbacks.
	Raft raftstore.Config
	// MaxBodyBytes bounds HTTP request bodies and gRPC messages, at least
	// kvindexv1.LedgerMinRecvBytes: the routers' shared ledger sends messages
	// that large.
	MaxBodyBytes int64
	// MaxPromptTokens bounds the tokens of a prompt and the hashes of a query.
	MaxPromptTokens int
	// TLSCert and TLSKey serve gRPC and REST over TLS; with TLSClientCA clients
	// must present a certificate signed by it (mTLS).
	TLSCert, TLSKey, TLSClientCA string
	// RaftTLSCA, RaftTLSCert and RaftTLSKey authenticate the raft transport
	// when TLS is on: members present RaftTLSCert (default TLSCert) and accept
	// only peers whose certificate RaftTLSCA signed. A CA of its own, apart
	// from TLSClientCA, so that no API client certificate can speak raft.
	RaftTLSCA, RaftTLSCert, RaftTLSKey string
	// AdminToken, when set, is required as a bearer token by every admin call
	// (see access.go: all but the public reads).
	AdminToken string
	// LedgerToken, when set, is accepted instead of AdminToken by LoadService
	// (the routers' shared load ledger) and by nothing else, so that routers
	// need not hold the admin token. It needs AdminToken: without one no call
	// is checked.
	LedgerToken string
	// InsecureNoAdminToken lets a node listen beyond loopback without
	// AdminToken; without it such a node refuses to start.
	InsecureNoAdminToken bool
	// HTTPReadTimeout bounds reading a whole request, body included;
	// HTTPWriteTimeout writing a response (a dump: each part of it);
	// HTTPIdleTimeout how long a keep-alive connection may wait for its next
	// request.
	HTTPReadTimeout, HTTPWriteTimeout, HTTPIdleTimeout time.Duration
	// GRPCMaxConcurrentStreams bounds the calls open at once on one gRPC
	// connection; MaxWatchStreams the Watch streams open at once on the node
	// (more: RESOURCE_EXHAUSTED).
	GRPCMaxConcurrentStreams uint32
	MaxWatchStreams          int
	// The routers' shared load ledger (LoadService, held by the leader): how long
	// a router's load counts after its stream ends, how often at most the fleet
	// view is pushed, and how many routers it holds.
	LedgerLease        time.Duration
	LedgerPushInterval time.Duration
	LedgerMaxRouters   int
	// Tokenizers are the --tokenizer <model>=<dir> values ("builtin" as dir
	// selects the byte-level tokenizer of the fake engine); FallbackTokenizer
	// ("" or "builtin") serves models without one.
	Tokenizers        tokenize.Specs
	FallbackTokenizer string
	// ReadyMaxLag is how many committed log entries a node may have left to
	// apply and still be ready (see readiness.go).
	ReadyMaxLag int
	// WatchBuffer is how many log entries' changes a Watch stream may fall
	// behind, and how many entries' changes are kept for resuming Watches.
	WatchBuffer int
	// WorkerDeadAfter: a worker whose health endpoint (its HTTP URL + /health)
	// failed every probe for this long is declared dead (0: never; health.go);
	// WorkerHealthInterval is how often the leader probes.
	WorkerDeadAfter, WorkerHealthInterval time.Duration

	LogLevel  string
	LogFormat string
	// Ingest holds --kv-event-transport, --worker, --workers-file, --zmq-bind,
	// --nats-url, --nats-subject-prefix, --block-size and the ingest tuning flags.
	Ingest ingest.ManagerConfig

	// Kube is the Kubernetes discovery of the engine pods (--kube-*, --kubeconfig;
	// off without Kube.Selector): the leader registers the ready pods as workers
	// (kubeworkers.go).
	Kube kube.Config
	// KubeUnreadyGrace is how long a discovered pod may stay unready before the
	// leader unregisters its worker (and its blocks leave the index).
	KubeUnreadyGrace time.Duration
	// KubeClient, when set, is the Kubernetes API client discovery uses instead
	// of one made from Kube.Kubeconfig or the in-cluster service account (tests
	// give client-go's fake clientset). Not a flag.
	KubeClient kubernetes.Interface

	// onBatch, when set, is told of every committed stream batch after the
	// node's own hooks: tests audit every applied sequence number with it.
	onBatch raftstore.BatchObserver
}

// DefaultConfig returns the defaults documented on each flag.
func DefaultConfig() Config {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "indexer-0"
	}
	return Config{
		NodeID:                   host,
		DataDir:                  "data",
		GRPCAddr:                 "127.0.0.1:7070",
		HTTPAddr:                 "127.0.0.1:7080",
		MaxBodyBytes:             4 << 20,
		MaxPromptTokens:          DefaultMaxPromptTokens,
		WatchBuffer:              DefaultWatchBuffer,
		HTTPReadTimeout:          30 * time.Second,
		HTTPWriteTimeout:         60 * time.Second,
		HTTPIdleTimeout:          120 * time.Second,
		GRPCMaxConcurrentStreams: 256,
		MaxWatchStreams:          64,
		ReadyMaxLag:              DefaultReadyMaxLag,
		LedgerLease:              10 * time.Second,
		LedgerPushInterval:       15 * time.Millisecond,
		LedgerMaxRouters:         256,
		WorkerDeadAfter:          DefaultWorkerDeadAfter,
		WorkerHealthInterval:     DefaultWorkerHealthInterval,
		LogLevel:                 "info",
		LogFormat:                "text",
		Ingest:                   ingest.DefaultManagerConfig(),
		Raft:                     raftstore.DefaultConfig(),
		Kube:                     kube.DefaultConfig(),
		KubeUnreadyGrace:         time.Minute,
	}
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, args...))
}

// Validate reports the first bad value, naming its flag.
func (c *Config) Validate() error {
	switch {
	case c.NodeID == "":
		return invalid("--node-id must not be empty")
	case c.DataDir == "":
		return invalid("--data-dir must not be empty")
	case c.MaxBodyBytes < kvindexv1.LedgerMinRecvBytes:
		// It is the gRPC receive limit too, and the routers' shared ledger,
		// always served, sends messages up to this size: below it the leader
		// would refuse their reports and every router would route alone.
		return invalid("--max-body-bytes=%d is below %d, the largest message of the routers' shared ledger (LoadService.Report), whose reports it would refuse",
			c.MaxBodyBytes, kvindexv1.LedgerMinRecvBytes)
	case c.Join != "" && c.Bootstrap:
		return invalid("--bootstrap starts a new cluster and --join=%s joins one: give one of them", c.Join)
	case c.Join != "" && len(c.BootstrapPeers) > 0:
		return invalid("--join=%s joins a cluster and --bootstrap-peers decides whether to start one: give one of them", c.Join)
	case c.Bootstrap && len(c.BootstrapPeers) > 0:
		return invalid("--bootstrap starts a new cluster at once and --bootstrap-peers only when no peer is in one: give one of them")
	case c.MaxPromptTokens < 1:
		return invalid("--max-prompt-tokens=%d must be at least 1", c.MaxPromptTokens)
	case c.WatchBuffer < 1:
		return invalid("--watch-buffer=%d must be at least 1", c.WatchBuffer)
	case (c.TLSCert == "") != (c.TLSKey == ""):
		return invalid("--tls-cert and --tls-key go together")
	case c.TLSClientCA != "" && c.TLSCert == "":
		return invalid("--tls-client-ca needs --tls-cert and --tls-key")
	case c.RaftTLSCert != "" && c.TLSCert == "", c.RaftTLSCA != "" && c.TLSCert == "":
		return invalid("--raft-tls-ca and --raft-tls-cert need --tls-cert and --tls-key (raft uses TLS when the API does)")
	case (c.RaftTLSCert == "") != (c.RaftTLSKey == ""):
		return invalid("--raft-tls-cert and --raft-tls-key go together")
	case c.TLSCert != "" && c.RaftTLSCA == "":
		return invalid("--tls-cert is set but --raft-tls-ca is not: with TLS on, the raft transport must authenticate its peers; give the CA that signs the members' raft certificates")
	case c.HTTPReadTimeout <= 0 || c.HTTPWriteTimeout <= 0 || c.HTTPIdleTimeout <= 0:
		return invalid("--http-read-timeout=%v, --http-write-timeout=%v and --http-idle-timeout=%v must be positive", c.HTTPReadTimeout, c.HTTPWriteTimeout, c.HTTPIdleTimeout)
	case c.GRPCMaxConcurrentStreams < 1:
		return invalid("--grpc-max-concurrent-streams=%d must be at least 1", c.GRPCMaxConcurrentStreams)
	case c.ReadyMaxLag < 0:
		return invalid("--ready-max-lag=%d must not be negative", c.ReadyMaxLag)
	case c.MaxWatchStreams < 1:
		return invalid("--max-watch-streams=%d must be at least 1", c.MaxWatchStreams)
	case c.LedgerLease <= 0:
		return invalid("--ledger-lease=%s must be positive", c.LedgerLease)
	case c.LedgerPushInterval <= 0:
		return invalid("--ledger-push-interval=%s must be positive", c.LedgerPushInterval)
	case c.LedgerMaxRouters < 1:
		return invalid("--ledger-max-routers=%d must be at least 1", c.LedgerMaxRouters)
	case c.WorkerDeadAfter < 0:
		return invalid("--worker-dead-after=%s must not be negative (0 disables)", c.WorkerDeadAfter)
	case c.WorkerDeadAfter > 0 && (c.WorkerHealthInterval <= 0 || c.WorkerHealthInterval > c.WorkerDeadAfter):
		return invalid("--worker-health-interval=%s must be positive and at most --worker-dead-after=%s", c.WorkerHealthInterval, c.WorkerDeadAfter)
	case c.FallbackTokenizer != "" && c.FallbackTokenizer != BuiltinTokenizer:
		return invalid("--fallback-tokenizer=%q must be empty or %q", c.FallbackTokenizer, BuiltinTokenizer)
	}
	for _, a := range []struct {
		flag, v  string
		optional bool
	}{
		{"--grpc-addr", c.GRPCAddr, false}, {"--http-addr", c.HTTPAddr, false}, {"--raft-addr", c.Raft.RaftAddr, false},
		{"--grpc-advertise", c.GRPCAdvertise, true}, {"--probe-addr", c.ProbeAddr, true}, {"--raft-advertise", c.Raft.RaftAdvertise, true}, {"--join", c.Join, true},
	} {
		if a.v == "" && a.optional {
			continue
		}
		if _, _, err := net.SplitHostPort(a.v); err != nil {
			return invalid("%s=%q is not host:port: %v", a.flag, a.v, err)
		}
	}
	for _, p := range c.BootstrapPeers {
		if _, _, err := net.SplitHostPort(p); err != nil {
			return invalid("--bootstrap-peers: %q is not host:port: %v", p, err)
		}
	}
	if c.AdminToken == "" && !c.InsecureNoAdminToken {
		for _, a := range []struct{ flag, v string }{{"--grpc-addr", c.GRPCAddr}, {"--http-addr", c.HTTPAddr}} {
			if !isLoopback(a.v) {
				return invalid("%s=%s listens beyond loopback without --admin-token: anyone who reaches it could register workers, change the membership and take snapshots; set --admin-token (or KVINDEX_ADMIN_TOKEN), or --insecure-no-admin-token to accept that", a.flag, a.v)
			}
		}
	}
	if c.LedgerToken != "" && c.AdminToken == "" {
		return invalid("--ledger-token is set without --admin-token: without an admin token no call is checked, so the ledger token would protect nothing; set --admin-token (or KVINDEX_ADMIN_TOKEN) too, or drop --ledger-token (KVINDEX_LEDGER_TOKEN)")
	}
	rc := c.raftConfig()
	if err := rc.Validate(); err != nil {
		return invalid("%s", raftFlagNames.Replace(strings.TrimPrefix(err.Error(), raftstore.ErrInvalidConfig.Error()+": ")))
	}
	if _, err := logging.ParseLevel(c.LogLevel); err != nil {
		return invalid("%v", err)
	}
	if err := logging.ValidateFormat(c.LogFormat); err != nil {
		return invalid("%v", err)
	}
	if err := c.validateKube(); err != nil {
		return err
	}
	return c.Ingest.Validate()
}

// validateKube checks the --kube-* flags.
func (c *Config) validateKube() error {
	if err := c.Kube.Validate(); err != nil {
		return invalid("%s", strings.TrimPrefix(err.Error(), kube.ErrInvalidConfig.Error()+": "))
	}
	switch {
	case c.KubeUnreadyGrace < 0:
		return invalid("--kube-unready-grace=%s must not be negative", c.KubeUnreadyGrace)
	case c.Kube.Selector != "" && c.Ingest.MaxDiscoveredWorkers < 1:
		return invalid("--kube-selector=%q registers pods as workers, but --max-discovered-workers=%d allows none", c.Kube.Selector, c.Ingest.MaxDiscoveredWorkers)
	}
	return nil
}

// workerFlag is the repeatable --worker flag. Workers from the config file are its
// default; the first --worker on the command line (or KVINDEX_WORKER) replaces
// them rather than adding to them, as any other flag replaces its file value.
type workerFlag struct {
	list       *[]workerspec.Spec
	replaceOld bool
}

func (f *workerFlag) String() string {
	if f.list == nil {
		return ""
	}
	l := workerspec.List(*f.list)
	return l.String()
}

// tokenizerFlag is the repeatable --tokenizer flag, replacing the config
// file's values like workerFlag.
type tokenizerFlag struct {
	list       *tokenize.Specs
	replaceOld bool
}

func (f *tokenizerFlag) String() string {
	if f.list == nil {
		return ""
	}
	return f.list.String()
}

func (f *tokenizerFlag) Set(v string) error {
	if f.replaceOld {
		*f.list, f.replaceOld = nil, false
	}
	return f.list.Set(v)
}

// Set adds the workers of v (see workerspec.ParseList: ';' separates several).
func (f *workerFlag) Set(v string) error {
	ws, err := workerspec.ParseList(v)
	if err != nil {
		return err
	}
	if f.replaceOld {
		*f.list, f.replaceOld = nil, false
	}
	*f.list = append(*f.list, ws...)
	return nil
}

// registerFlags binds every flag to cfg, with cfg's values as defaults.
func registerFlags(fs *flag.FlagSet, cfg *Config, replaceLists bool) {
	in := &cfg.Ingest
	fs.String("config", "", "YAML `file` of flag values (keys are flag names; worker is a list); flags and KVINDEX_* variables override it")
	fs.StringVar(&cfg.NodeID, "node-id", cfg.NodeID, "this node's id (defaults to the host name)")
	fs.StringVar(&cfg.DataDir, "data-dir", cfg.DataDir, "data `directory`: the raft log (raft.db) and snapshots; a restart resumes from it")
	fs.StringVar(&cfg.GRPCAddr, "grpc-addr", cfg.GRPCAddr, "gRPC listen `host:port`: kvindex.v1 IndexService and AdminService, llm-d's indexer.v1.IndexerService, health, reflection (port 0 picks a free one)")
	fs.StringVar(&cfg.GRPCAdvertise, "grpc-advertise", cfg.GRPCAdvertise, "`host:port` other members reach this node's gRPC at (default: --grpc-addr as bound)")
	fs.StringVar(&cfg.Join, "join", cfg.Join, "gRPC `host:port` of any member of a cluster to join (the leader adds this node as a voter); empty: a node without raft state in --data-dir starts a single-node cluster (see --bootstrap-peers)")
	fs.Func("bootstrap-peers", "comma-separated gRPC `host:port` of the other would-be members; a node without raft state and without --join asks each of them first: it joins the cluster one of them is in, starts a new one only when every one answered that it is in none, and waits while some do not answer (so a member whose data dir was lost never starts a second cluster beside the first); empty: start at once",
		func(v string) error { cfg.BootstrapPeers = envflag.SplitList(v); return nil })
	fs.BoolVar(&cfg.Bootstrap, "bootstrap", cfg.Bootstrap, "start a new cluster with this node (what a node without --join and without raft state does anyway)")
	registerRaftFlags(fs, &cfg.Raft)
	fs.StringVar(&cfg.HTTPAddr, "http-addr", cfg.HTTPAddr, "HTTP listen `host:port`: the REST API (docs/api.md), /metrics, /healthz, /readyz (port 0 picks a free one)")
	fs.StringVar(&cfg.ProbeAddr, "probe-addr", cfg.ProbeAddr, "plain-HTTP listen `host:port` serving only GET /healthz, /readyz and /metrics, never TLS, a client certificate or the admin token (for kubelet probes and Prometheus when --tls-client-ca makes --http-addr ask for client certificates; it serves nothing else, so it may listen beyond loopback); empty: off")
	fs.Int64Var(&cfg.MaxBodyBytes, "max-body-bytes", cfg.MaxBodyBytes, "largest HTTP request body and gRPC message accepted, in `bytes` (larger: 413 / RESOURCE_EXHAUSTED); at least "+strconv.Itoa(kvindexv1.LedgerMinRecvBytes)+", the routers' shared ledger's largest message")
	fs.IntVar(&cfg.MaxPromptTokens, "max-prompt-tokens", cfg.MaxPromptTokens, "most tokens a prompt (or block hashes a query) may have")
	fs.StringVar(&cfg.TLSCert, "tls-cert", cfg.TLSCert, "PEM certificate `file`: serve gRPC and REST over TLS (with --tls-key)")
	fs.StringVar(&cfg.TLSKey, "tls-key", cfg.TLSKey, "PEM private key `file` of --tls-cert")
	fs.StringVar(&cfg.TLSClientCA, "tls-client-ca", cfg.TLSClientCA, "PEM CA `file`: require client certificates signed by it (mTLS)")
	fs.StringVar(&cfg.RaftTLSCA, "raft-tls-ca", cfg.RaftTLSCA, "PEM CA `file` of the members' raft certificates; required with --tls-cert: the raft transport accepts only peers presenting a certificate it signed; it must not hold a certificate --tls-client-ca holds")
	fs.StringVar(&cfg.RaftTLSCert, "raft-tls-cert", cfg.RaftTLSCert, "PEM certificate `file` this member presents on the raft transport, for server and client authentication (default: --tls-cert)")
	fs.StringVar(&cfg.RaftTLSKey, "raft-tls-key", cfg.RaftTLSKey, "PEM private key `file` of --raft-tls-cert")
	fs.StringVar(&cfg.AdminToken, "admin-token", cfg.AdminToken, "bearer `token` every admin call needs (Authorization: Bearer <token>): register, unregister, join, leave, snapshot, member-to-member calls and any call not documented as public (LoadService also takes --ledger-token); empty: no check, allowed only on loopback listeners or with --insecure-no-admin-token")
	fs.StringVar(&cfg.LedgerToken, "ledger-token", cfg.LedgerToken, "bearer `token` that opens kvindex.v1.LoadService (the routers' shared load ledger) and nothing else; give it to routers (their --indexer-token) instead of --admin-token, which LoadService accepts too; needs --admin-token; empty: LoadService takes the admin token only")
	fs.BoolVar(&cfg.InsecureNoAdminToken, "insecure-no-admin-token", cfg.InsecureNoAdminToken, "start without --admin-token although --grpc-addr or --http-addr listens beyond loopback (anyone who reaches them may change the registry and the membership)")
	fs.DurationVar(&cfg.HTTPReadTimeout, "http-read-timeout", cfg.HTTPReadTimeout, "longest time to read an HTTP request, body included (slower: 408 and the connection closed)")
	fs.DurationVar(&cfg.HTTPWriteTimeout, "http-write-timeout", cfg.HTTPWriteTimeout, "longest time to write an HTTP response (a dump: each part of it), and one message of a gRPC Watch or Dump")
	fs.DurationVar(&cfg.HTTPIdleTimeout, "http-idle-timeout", cfg.HTTPIdleTimeout, "how long an idle keep-alive HTTP connection is kept open")
	fs.Var(envflag.Uint32{V: &cfg.GRPCMaxConcurrentStreams}, "grpc-max-concurrent-streams", "most gRPC calls open at once on one connection (more wait for a free one)")
	fs.IntVar(&cfg.MaxWatchStreams, "max-watch-streams", cfg.MaxWatchStreams, "most Watch streams open at once on this node (more: RESOURCE_EXHAUSTED)")
	fs.DurationVar(&cfg.LedgerLease, "ledger-lease", cfg.LedgerLease, "routers' load ledger: how long a router's load still counts after its stream ended")
	fs.DurationVar(&cfg.LedgerPushInterval, "ledger-push-interval", cfg.LedgerPushInterval, "routers' load ledger: shortest time between two fleet views pushed to a router")
	fs.IntVar(&cfg.LedgerMaxRouters, "ledger-max-routers", cfg.LedgerMaxRouters, "routers' load ledger: most routers held (more: RESOURCE_EXHAUSTED)")
	fs.Var(&tokenizerFlag{list: &cfg.Tokenizers, replaceOld: replaceLists}, "tokenizer",
		"tokenizer of a model for text and chat prompts, repeatable, as `model=dir` (a Hugging Face tokenizer.json directory; dir \"builtin\": the fake engine's byte-level tokenizer); several in one value separated by ';', as the environment variable takes them")
	fs.StringVar(&cfg.FallbackTokenizer, "fallback-tokenizer", cfg.FallbackTokenizer, "tokenizer for models without --tokenizer: \"builtin\" or empty (text for such models is refused)")
	fs.IntVar(&cfg.ReadyMaxLag, "ready-max-lag", cfg.ReadyMaxLag, "committed log entries a node may have left to apply and still answer /readyz 200 (a follower also needs recent contact with the leader and the leader's commit index)")
	fs.IntVar(&cfg.WatchBuffer, "watch-buffer", cfg.WatchBuffer, "log entries of changes a Watch stream may fall behind before it is ended, and the recent entries whose changes are kept for Watch streams that resume (an entry carries up to --raft-batch-max-events block events)")
	fs.DurationVar(&cfg.WorkerDeadAfter, "worker-dead-after", cfg.WorkerDeadAfter, "declare a worker with an http URL dead once GET <http>/health has failed (no 2xx within 2s) for this long: its blocks are dropped on every member and it is not scored until it answers or publishes again (0: never; the leader probes)")
	fs.DurationVar(&cfg.WorkerHealthInterval, "worker-health-interval", cfg.WorkerHealthInterval, "how often the leader probes each worker's health endpoint (at most --worker-dead-after)")
	fs.StringVar(&cfg.LogLevel, "log-level", cfg.LogLevel, "debug, info, warn or error")
	fs.StringVar(&cfg.LogFormat, "log-format", cfg.LogFormat, "text or json")

	fs.Func("kv-event-transport", "how KV events arrive: `zmq|nats` (zmq: dial workers' PUB sockets and/or --zmq-bind) (default "+string(in.Transport)+")",
		func(v string) error { in.Transport = ingest.Transport(v); return nil })
	fs.Var(&workerFlag{list: &in.Workers, replaceOld: replaceLists}, "worker",
		"a worker to dial, repeatable, as `k=v,...` (several in one value separated by ';', as KVINDEX_WORKER needs): id=w1,endpoint=tcp://10.0.0.5:5557,replay=tcp://10.0.0.5:5558,model=M,block-size=16,dp-size=2 (also topic, http, role, label.<k>)")
	fs.StringVar(&in.WorkersFile, "workers-file", in.WorkersFile, "YAML `file` of workers (workers: [{id, model, endpoint, replay, block-size, dp-size, topic, http}]), re-read when it changes")
	fs.StringVar(&in.ZMQBind, "zmq-bind", in.ZMQBind, "bind a SUB socket engines connect to, e.g. tcp://*:5557; the worker and model come from the topic kv@<pod>@<model>. Every member of a cluster binds; one that does not lead forwards what it receives to the leader")
	fs.StringVar(&in.BindReplayPattern, "bind-replay-pattern", in.BindReplayPattern, "replay `endpoint` of workers discovered on --zmq-bind, with {pod} the pod of their kv@<pod>@<model> topic, e.g. tcp://{pod}.engines.ns.svc:5558 (+dp rank); it must match --discover-replay-allow. Empty: such workers have no replay unless registered with one")
	fs.StringVar(&in.NATSURL, "nats-url", in.NATSURL, "NATS server `url` (with --kv-event-transport nats)")
	fs.StringVar(&in.NATSSubjectPrefix, "nats-subject-prefix", in.NATSSubjectPrefix, "NATS subjects are <prefix>.<worker>.<dp_rank>")
	fs.IntVar(&in.DefaultBlockSize, "block-size", in.DefaultBlockSize, "tokens per KV block of workers that do not say; events with another block_size are refused (0: take each event's)")
	fs.IntVar(&in.MaxDiscoveredWorkers, "max-discovered-workers", in.MaxDiscoveredWorkers, "discovery on --zmq-bind or NATS adds no worker while this node follows this many workers its configuration does not declare (discovered or registered); refusals are counted in kvindex_ingest_decode_errors_total{reason=\"discovery_limit\"} (0: no discovery); --kube-selector registers no new pod while the registry holds this many (kvindex_kube_refused_total{reason=\"limit\"})")
	fs.IntVar(&in.MaxDiscoveredDPRanks, "max-discovered-dp-ranks", in.MaxDiscoveredDPRanks, "a worker discovered on --zmq-bind or NATS may have dp ranks 0 to this many - 1; batches of higher ranks are counted in kvindex_ingest_decode_errors_total{reason=\"rank_limit\"} and dropped (a declared worker is held to its dp-size: reason dp_size)")
	fs.Func("discover-allow", "comma-separated `patterns` (path.Match: pod-*, vllm-?) of the worker ids discovery accepts; others are counted (reason not_allowed) and dropped (default: any)",
		func(v string) error { in.DiscoverAllow = envflag.SplitList(v); return nil })
	fs.Func("discover-replay-allow", "comma-separated `patterns` of the replay endpoints a NATS Kv-Replay header or --bind-replay-pattern may name (tcp:// only); others are ignored and counted (reason replay_not_allowed) (default "+strings.Join(in.ReplayAllow, ",")+")",
		func(v string) error { in.ReplayAllow = envflag.SplitList(v); return nil })
	fs.IntVar(&in.MaxFrameBytes, "max-frame-bytes", in.MaxFrameBytes, "largest event batch accepted, in `bytes`; larger ones are counted and dropped")
	fs.DurationVar(&in.ReplayTimeout, "replay-timeout", in.ReplayTimeout, "how long a replay from an engine may go without a reply")
	fs.DurationVar(&in.IdleReplayInterval, "idle-replay-interval", in.IdleReplayInterval, "ask an engine that has been silent this long for batches we may have missed (0 disables)")
	registerKubeFlags(fs, cfg)
}

// registerKubeFlags binds the Kubernetes discovery flags, named as the router's.
func registerKubeFlags(fs *flag.FlagSet, cfg *Config) {
	k := &cfg.Kube
	fs.StringVar(&k.Selector, "kube-selector", k.Selector, "Kubernetes discovery: label `selector` of the engine pods (e.g. app=vllm); the leader registers ready pods as workers (connect mode: kvindex.io/kv-events-port, kvindex.io/kv-replay-port; docs/deploy.md lists the labels and annotations read) and unregisters them when their pod goes; at most --max-discovered-workers; empty: off")
	fs.StringVar(&k.Namespace, "kube-namespace", k.Namespace, "Kubernetes discovery: namespace to watch; empty: the indexer's own namespace in a cluster, every namespace with --kubeconfig")
	fs.StringVar(&k.Kubeconfig, "kubeconfig", k.Kubeconfig, "Kubernetes discovery: kubeconfig `file`; empty: the in-cluster service account")
	fs.IntVar(&k.HTTPPort, "kube-http-port", k.HTTPPort, "Kubernetes discovery: engine HTTP port of pods without the kvindex.io/http-port annotation")
	fs.StringVar(&k.DefaultModel, "kube-default-model", k.DefaultModel, "Kubernetes discovery: model of pods without a kvindex.io/model or llm-d.ai/model label")
	fs.DurationVar(&k.Resync, "kube-resync", k.Resync, "Kubernetes discovery: the informer's full resync period")
	fs.DurationVar(&cfg.KubeUnreadyGrace, "kube-unready-grace", cfg.KubeUnreadyGrace, "Kubernetes discovery: a pod that is still there but not ready keeps its worker and blocks this long, then its worker is unregistered (0: at once); a deleted pod's worker goes at once")
}

// ParseFlags builds a Config from defaults, the --config file (or KVINDEX_CONFIG),
// KVINDEX_* variables (looked up with lookup, os.LookupEnv when nil) and args, in
// increasing precedence, and validates it. --help prints every flag to out and
// returns flag.ErrHelp.
func ParseFlags(args []string, out io.Writer, lookup func(string) (string, bool)) (Config, error) {
	if lookup == nil {
		lookup = os.LookupEnv
	}
	cfg := DefaultConfig()
	if path := configPath(args, lookup); path != "" {
		if err := applyConfigFile(&cfg, path); err != nil {
			return Config{}, err
		}
	}
	fs := flag.NewFlagSet("indexer", flag.ContinueOnError)
	fs.SetOutput(out)
	registerFlags(fs, &cfg, true)
	for _, secret := range []string{"admin-token", "ledger-token"} {
		if f := fs.Lookup(secret); f.DefValue != "" {
			f.DefValue = "<set by --config>" // --help must not print a secret
		}
	}
	fs.Usage = envflag.Usage(fs, EnvPrefix, "usage: indexer [flags]\n       indexer relay [flags]   (forward one engine's ZMQ events to NATS; relay --help)\n\nThe kvindex index server: follows engines' KV cache events and answers prefix queries.")
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

// configPath finds --config on the command line (before "--"), else KVINDEX_CONFIG.
func configPath(args []string, lookup func(string) (string, bool)) string {
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			break
		}
		name, value, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "-") || name != "config" {
			continue
		}
		if hasValue {
			return value
		}
		if i+1 < len(args) {
			return args[i+1]
		}
	}
	v, _ := lookup(envflag.EnvName(EnvPrefix, "config"))
	return v
}

// applyConfigFile sets cfg from a YAML map of flag names to values.
func applyConfigFile(cfg *Config, path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return invalid("--config: %v", err)
	}
	var values map[string]any
	if err := yaml.Unmarshal(data, &values); err != nil {
		return invalid("--config %s: %v", path, err)
	}
	fs := flag.NewFlagSet("config", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	registerFlags(fs, cfg, false)
	keys := make([]string, 0, len(values))
	for k := range values {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if k == "config" || fs.Lookup(k) == nil {
			return invalid("--config %s: unknown key %q (keys are flag names)", path, k)
		}
		items := []any{values[k]}
		if list, isList := values[k].([]any); isList {
			if k != "worker" && k != "tokenizer" {
				return invalid("--config %s: %s takes one value, not a list", path, k)
			}
			items = list
		}
		for _, item := range items {
			switch item.(type) {
			case map[string]any, []any, nil:
				return invalid("--config %s: %s: want a scalar value", path, k)
			}
			if err := fs.Set(k, fmt.Sprint(item)); err != nil {
				return invalid("--config %s: %s: %v", path, k, err)
			}
		}
	}
	return nil
}

// BuiltinTokenizer names the byte-level tokenizer in --tokenizer and
// --fallback-tokenizer.
const BuiltinTokenizer = "builtin"

// shutdownTimeout bounds the graceful stop of the HTTP and gRPC servers.
const shutdownTimeout = 5 * time.Second

// registerRaftFlags binds the --raft-* flags to rc.
func registerRaftFlags(fs *flag.FlagSet, rc *raftstore.Config) {
	fs.StringVar(&rc.RaftAddr, "raft-addr", rc.RaftAddr, "raft transport listen `host:port` (port 0 picks a free one)")
	fs.StringVar(&rc.RaftAdvertise, "raft-advertise", rc.RaftAdvertise, "`host:port` other members reach this node's raft transport at (default: --raft-addr as bound)")
	fs.IntVar(&rc.MaxBatchEvents, "raft-batch-max-events", rc.MaxBatchEvents, "the leader proposes the log entry it fills once it holds this many block events (or --raft-batch-max-bytes, or --raft-batch-max-wait)")
	fs.IntVar(&rc.MaxBatchBytes, "raft-batch-max-bytes", rc.MaxBatchBytes, "the leader proposes the log entry it fills once it holds this many `bytes` (or --raft-batch-max-events, or --raft-batch-max-wait)")
	fs.DurationVar(&rc.MaxBatchWait, "raft-batch-max-wait", rc.MaxBatchWait, "the leader proposes the log entry it fills this long after its first event batch at the latest (0: as soon as a proposal slot is free)")
	fs.IntVar(&rc.MaxInFlight, "raft-max-inflight", rc.MaxInFlight, "log entries proposed and not yet committed at once; ingest waits when all are pending")
	fs.Uint64Var(&rc.SnapshotThreshold, "raft-snapshot-threshold", rc.SnapshotThreshold, "take a snapshot once this many log entries were committed since the last one")
	fs.DurationVar(&rc.SnapshotInterval, "raft-snapshot-interval", rc.SnapshotInterval, "how often to check --raft-snapshot-threshold")
	fs.Uint64Var(&rc.TrailingLogs, "raft-trailing-logs", rc.TrailingLogs, "log entries kept behind a snapshot for followers that lag (one further behind is sent the snapshot)")
	fs.IntVar(&rc.SnapshotRetain, "raft-snapshot-retain", rc.SnapshotRetain, "snapshots kept in --data-dir")
	fs.DurationVar(&rc.HeartbeatTimeout, "raft-heartbeat-timeout", rc.HeartbeatTimeout, "a follower without contact from the leader this long starts an election")
	fs.DurationVar(&rc.ElectionTimeout, "raft-election-timeout", rc.ElectionTimeout, "a candidate without a result this long starts a new election")
	fs.DurationVar(&rc.LeaderLeaseTimeout, "raft-leader-lease-timeout", rc.LeaderLeaseTimeout, "a leader without contact with a quorum this long steps down (at most --raft-heartbeat-timeout)")
	fs.DurationVar(&rc.CommitTimeout, "raft-commit-timeout", rc.CommitTimeout, "longest pause between two AppendEntries of an idle leader")
	fs.IntVar(&rc.MaxAppendEntries, "raft-max-append-entries", rc.MaxAppendEntries, "most log entries in one AppendEntries RPC (1..1024)")
	fs.IntVar(&rc.LogCacheSize, "raft-log-cache", rc.LogCacheSize, "recent log entries kept in memory in front of raft.db (0: none)")
}

// raftFlagNames names the flags of raftstore.Config fields in its errors.
var raftFlagNames = strings.NewReplacer(
	"MaxBatchEvents", "--raft-batch-max-events", "MaxBatchBytes", "--raft-batch-max-bytes",
	"MaxBatchWait", "--raft-batch-max-wait", "MaxInFlight", "--raft-max-inflight",
	"SnapshotThreshold", "--raft-snapshot-threshold", "SnapshotInterval", "--raft-snapshot-interval",
	"TrailingLogs", "--raft-trailing-logs", "SnapshotRetain", "--raft-snapshot-retain",
	"HeartbeatTimeout", "--raft-heartbeat-timeout", "ElectionTimeout", "--raft-election-timeout",
	"LeaderLeaseTimeout", "--raft-leader-lease-timeout", "CommitTimeout", "--raft-commit-timeout",
	"MaxAppendEntries", "--raft-max-append-entries", "LogCacheSize", "--raft-log-cache",
	"RaftAddr", "--raft-addr", "NodeID", "--node-id", "DataDir", "--data-dir",
)

// raftConfig is c.Raft with what the flags outside --raft-* say; New adds the
// rest (addresses known once bound, logger, metrics, callbacks).
func (c *Config) raftConfig() raftstore.Config {
	rc := c.Raft
	rc.NodeID = c.NodeID
	rc.DataDir = c.DataDir
	rc.Bootstrap = c.Join == "" && len(c.BootstrapPeers) == 0 // with peers, bootstrap.go decides
	return rc
}
