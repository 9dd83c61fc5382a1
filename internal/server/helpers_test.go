package server

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	indexerv1 "github.com/kvindex/kvindex/api/proto/indexer/v1"
	kvindexv1 "github.com/kvindex/kvindex/api/proto/kvindex/v1"
	"github.com/kvindex/kvindex/bench/fakeengine"
	"github.com/kvindex/kvindex/bench/fakeengine/fakeenginetest"
	"github.com/kvindex/kvindex/internal/ingest"
	"github.com/kvindex/kvindex/internal/kvblock"
	"github.com/kvindex/kvindex/internal/radix"
	"github.com/kvindex/kvindex/internal/tokenize"
	"github.com/kvindex/kvindex/internal/workerspec"
)

const testModel = "fake/test-model"

// engineSpec describes one fake engine of a fixture; its worker id is its name.
type engineSpec struct {
	name      string
	dp        int
	gpuBlocks int
	cpuBlocks int
}

// defaultEngines: e0 plain, e1 offloading to CPU, e2 with two dp ranks.
var defaultEngines = []engineSpec{
	{name: "e0", dp: 1, gpuBlocks: 256},
	{name: "e1", dp: 1, gpuBlocks: 6, cpuBlocks: 256},
	{name: "e2", dp: 2, gpuBlocks: 256},
}

// fixture is a running single-node indexer following fake engines, with gRPC
// and HTTP clients.
type fixture struct {
	t       *testing.T
	srv     *Server
	engines map[string]*fakeengine.Engine
	base    string // http(s)://host:port
	http    *http.Client
	conn    *grpc.ClientConn
	index   kvindexv1.IndexServiceClient
	admin   kvindexv1.AdminServiceClient
	llmd    indexerv1.IndexerServiceClient
}

type fixtureOptions struct {
	engines []engineSpec
	// configure adjusts the indexer's config after the defaults of the fixture.
	configure func(*Config)
	// clientTLS, when set, is how clients dial (the server's TLS is set by configure).
	clientTLS *tls.Config
	// register registers the engines through the API once the server is ready,
	// rather than giving them by --worker (a worker of the configuration cannot
	// be unregistered).
	register bool
	// unlisted leaves the engines out of the configuration and the registry:
	// the test has them discovered.
	unlisted bool
}

func startEngineFor(t *testing.T, es engineSpec) *fakeengine.Engine {
	t.Helper()
	return fakeenginetest.Start(t, engineConfigFor(es))
}

// engineConfigFor is the configuration of es's engine: its PUB and ROUTER
// sockets bind free loopback ports.
func engineConfigFor(es engineSpec) fakeengine.Config {
	c := fakeenginetest.Config()
	c.Model = testModel
	c.NumGPUBlocks = es.gpuBlocks
	c.NumCPUBlocks = es.cpuBlocks
	c.DataParallelSize = es.dp
	c.BlockHashSeed = 99
	return c
}

func workerFlagFor(t *testing.T, name string, e *fakeengine.Engine) workerspec.Spec {
	t.Helper()
	loopback := strings.NewReplacer("tcp://*:", "tcp://127.0.0.1:", "tcp://0.0.0.0:", "tcp://127.0.0.1:")
	spec, err := workerspec.Parse(fmt.Sprintf("id=%s,model=%s,endpoint=%s,replay=%s,block-size=4,dp-size=%d,http=%s",
		name, testModel, loopback.Replace(e.EventEndpoints()[0]), loopback.Replace(e.ReplayEndpoints()[0]),
		e.Config().DataParallelSize, e.URL()))
	if err != nil {
		t.Fatal(err)
	}
	return spec
}

// testConfig is a single node on free loopback ports with a data dir of tb's,
// raft timeouts short enough for tests, and the builtin tokenizer for testModel.
func testConfig(tb testing.TB) Config {
	cfg := DefaultConfig()
	cfg.NodeID = "node-a"
	cfg.HTTPAddr = "127.0.0.1:0"
	cfg.GRPCAddr = "127.0.0.1:0"
	cfg.DataDir = tb.TempDir()
	cfg.Raft.RaftAddr = "127.0.0.1:0"
	// Sized for -race on two cores shared with other builds: at 200 ms a
	// starved leader lost its lease mid-test (load 27) and the cluster test's
	// leader moved under it.
	cfg.Raft.HeartbeatTimeout = time.Second
	cfg.Raft.ElectionTimeout = time.Second
	cfg.Raft.LeaderLeaseTimeout = 500 * time.Millisecond
	cfg.Raft.CommitTimeout = 10 * time.Millisecond
	cfg.Raft.TransportTimeout = 2 * time.Second
	cfg.Ingest.PollInterval = 10 * time.Millisecond
	cfg.Ingest.IdleReplayInterval = 50 * time.Millisecond
	cfg.Ingest.DefaultBlockSize = 4
	cfg.Tokenizers = tokenize.Specs{{Model: testModel, Dir: BuiltinTokenizer}}
	return cfg
}

// runServer starts a server with cfg and stops it when tb ends (an error if Run
// fails or does not return).
func runServer(tb testing.TB, cfg Config) *Server {
	tb.Helper()
	srv, err := New(cfg, nil)
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	tb.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				tb.Errorf("Run: %v", err)
			}
		case <-time.After(20 * time.Second):
			tb.Error("the server did not stop")
		}
	})
	return srv
}

func newFixture(t *testing.T, opts fixtureOptions) *fixture {
	t.Helper()
	if opts.engines == nil {
		opts.engines = defaultEngines
	}
	f := &fixture{t: t, engines: map[string]*fakeengine.Engine{}}
	cfg := testConfig(t)
	for _, es := range opts.engines {
		e := startEngineFor(t, es)
		f.engines[es.name] = e
		if !opts.register && !opts.unlisted {
			cfg.Ingest.Workers = append(cfg.Ingest.Workers, workerFlagFor(t, es.name, e))
		}
	}
	if opts.configure != nil {
		opts.configure(&cfg)
	}
	srv := runServer(t, cfg)
	f.srv = srv
	var err error
	scheme := "http"
	creds := insecure.NewCredentials()
	f.http = &http.Client{Timeout: 30 * time.Second}
	if opts.clientTLS != nil {
		scheme = "https"
		creds = credentials.NewTLS(opts.clientTLS)
		f.http.Transport = &http.Transport{TLSClientConfig: opts.clientTLS}
	}
	f.base = scheme + "://" + srv.HTTPAddr()
	f.conn, err = grpc.NewClient(srv.GRPCAddr(), grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.conn.Close() })
	f.index = kvindexv1.NewIndexServiceClient(f.conn)
	f.admin = kvindexv1.NewAdminServiceClient(f.conn)
	f.llmd = indexerv1.NewIndexerServiceClient(f.conn)
	f.waitReady()
	if opts.register {
		for name, e := range f.engines {
			req := &kvindexv1.RegisterWorkerRequest{Worker: specProto(workerFlagFor(t, name, e))}
			if _, err := f.admin.RegisterWorker(context.Background(), req); err != nil {
				t.Fatalf("registering %s: %v", name, err)
			}
		}
	}
	return f
}

func (f *fixture) waitReady() {
	f.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for f.srv.Backend().Ready() != nil {
		if time.Now().After(deadline) {
			f.t.Fatalf("the server never became ready: %v", f.srv.Backend().Ready())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// generate runs prompt on engine name (pinned to rank when dp > 1), with an
// optional LoRA adapter and cache salt, and waits until the index caught up.
func (f *fixture) generate(name string, rank uint32, prompt []uint32, salt string) {
	f.t.Helper()
	e := f.engines[name]
	req := fakeengine.Request{Prompt: prompt, MaxTokens: 1, CacheSalt: salt}
	if e.Config().DataParallelSize > 1 {
		req.PinDPRank, req.DPRank = true, rank
	}
	if _, err := e.Generate(context.Background(), req); err != nil {
		f.t.Fatal(err)
	}
	f.sync()
}

// sync waits until every stream of every engine is applied up to the engine's
// last published batch.
func (f *fixture) sync() {
	f.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for name, e := range f.engines {
		if err := e.Flush(context.Background()); err != nil {
			f.t.Fatal(err)
		}
		for _, rk := range e.CacheTruth().Ranks {
			if rk.LastSeq < 0 {
				continue
			}
			for {
				c, ok := f.srv.Applier().Cursor(ingest.Stream{Worker: name, DPRank: rk.DPRank})
				if ok && c.Seq >= uint64(rk.LastSeq) {
					break
				}
				if time.Now().After(deadline) {
					f.t.Fatalf("%s rank %d never reached seq %d (cursor %+v)", name, rk.DPRank, rk.LastSeq, c)
				}
				time.Sleep(2 * time.Millisecond)
			}
		}
	}
}

// expected is what an engine really caches of a prompt, per rank: the longest
// cached prefix and, per tier, its blocks whose fastest tier that is.
type expected struct {
	blocks  int
	perTier [radix.NumTiers]int
}

// truthKey is a cached block as the index sees it: its chain hash in a
// namespace (the salt of its first block, its LoRA).
type truthKey struct {
	seq        uint64
	salt, lora string
}

// truthBlocks returns, per dp rank, every block an engine caches with its
// fastest tier.
func truthBlocks(truth fakeengine.Truth) map[uint32]map[truthKey]radix.Tier {
	out := map[uint32]map[truthKey]radix.Tier{}
	for _, rk := range truth.Ranks {
		byHash := map[uint64]*fakeengine.CachedBlock{}
		for i := range rk.Blocks {
			byHash[rk.Blocks[i].Hash] = &rk.Blocks[i]
		}
		var chain func(b *fakeengine.CachedBlock) (uint64, string, bool)
		chain = func(b *fakeengine.CachedBlock) (uint64, string, bool) {
			local := kvblock.AppendLocalHashes(nil, b.TokenIDs, truth.BlockSize, b.LoRAName)[0]
			if b.ParentHash == nil {
				salt := ""
				if n := len(b.ExtraKeys); n > 0 && (b.LoRAName == "" || n > 1) {
					salt = b.ExtraKeys[n-1]
				}
				return local, salt, true
			}
			p, ok := byHash[*b.ParentHash]
			if !ok {
				return 0, "", false // its parent was evicted: it cannot match
			}
			ps, salt, ok := chain(p)
			return kvblock.NextChainHash(ps, local), salt, ok
		}
		blocks := map[truthKey]radix.Tier{}
		for i := range rk.Blocks {
			b := &rk.Blocks[i]
			seq, salt, ok := chain(b)
			if !ok {
				continue
			}
			fastest := radix.TierDisk
			for _, t := range b.Tiers {
				switch t {
				case "GPU":
					fastest = radix.TierGPU
				case "CPU":
					fastest = min(fastest, radix.TierCPU)
				}
			}
			blocks[truthKey{seq, salt, b.LoRAName}] = fastest
		}
		out[rk.DPRank] = blocks
	}
	return out
}

// truthMatch computes from the engine's own cache contents what the index
// should report for prompt under (lora, salt), per dp rank.
func truthMatch(truth fakeengine.Truth, prompt []uint32, lora, salt string) map[uint32]expected {
	want := kvblock.AppendChainHashes(nil, kvblock.AppendLocalHashes(nil, prompt, truth.BlockSize, lora))
	out := map[uint32]expected{}
	for rank, blocks := range truthBlocks(truth) {
		var e expected
		for _, seq := range want {
			t, ok := blocks[truthKey{seq, salt, lora}]
			if !ok {
				break
			}
			e.blocks++
			e.perTier[t]++
		}
		out[rank] = e
	}
	return out
}

// postJSON posts body (a string or a value to encode) and returns the status and body.
func (f *fixture) postJSON(path string, body any, header ...string) (int, string) {
	f.t.Helper()
	var data []byte
	switch b := body.(type) {
	case string:
		data = []byte(b)
	case []byte:
		data = b
	default:
		var err error
		if data, err = json.Marshal(b); err != nil {
			f.t.Fatal(err)
		}
	}
	req, err := http.NewRequest(http.MethodPost, f.base+path, bytes.NewReader(data))
	if err != nil {
		f.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	return f.do(req)
}

func (f *fixture) get(path string) (int, string) {
	f.t.Helper()
	req, err := http.NewRequest(http.MethodGet, f.base+path, nil)
	if err != nil {
		f.t.Fatal(err)
	}
	return f.do(req)
}

func (f *fixture) do(req *http.Request) (int, string) {
	f.t.Helper()
	resp, err := f.http.Do(req)
	if err != nil {
		f.t.Fatalf("%s %s: %v", req.Method, req.URL.Path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		f.t.Fatal(err)
	}
	return resp.StatusCode, string(body)
}

// tokens returns n token ids starting at from (ids stay below 256 so that the
// builtin tokenizer could produce them).
func tokens(from, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32((from + i) % 250)
	}
	return out
}

func concat(parts ...[]uint32) []uint32 {
	var out []uint32
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func decodeInto(t *testing.T, body string, v any) {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(body))
	dec.UseNumber()
	if err := dec.Decode(v); err != nil {
		t.Fatalf("decoding %s: %v", body, err)
	}
}
