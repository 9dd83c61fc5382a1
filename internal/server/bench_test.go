package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	kvindexv1 "github.com/kvindex/kvindex/api/proto/kvindex/v1"
	"github.com/kvindex/kvindex/internal/cputime"
	"github.com/kvindex/kvindex/internal/kvblock"
	"github.com/kvindex/kvindex/internal/radix"
	"github.com/kvindex/kvindex/internal/tokenize"
	"github.com/kvindex/kvindex/internal/workerspec"
)

// The Score benchmark serves an index of ~1M (block, worker) residencies over
// 64 workers, the way a mid-size fleet looks: every worker holds 32 sequences
// of 8k tokens (512 blocks of 16); each sequence starts with one of 64 shared
// prefixes, cut at a length that differs per worker (128 to 512 blocks), and
// ends with blocks of its own. Queries are 2k- and 8k-token prefixes of the
// shared ones, so every query matches on about 32 workers at various depths.
//
// Text queries are tokenized with the Qwen3 tokenizer when its files are in
// .cache/tokenizers/qwen3 (scripts/fetch-tokenizers.sh) or KVINDEX_BENCH_TOKENIZER
// names a directory, else with the byte-level builtin one; the sub-benchmark
// name says which.
const (
	benchModel      = "bench/model"
	benchWorkers    = 64
	benchSeqs       = 32
	benchSeqBlocks  = 512
	benchBlock      = 16
	benchPrefixes   = 64
	benchPrefixToks = benchSeqBlocks * benchBlock
)

type benchEnv struct {
	srv       *Server
	tokName   string
	prefixes  [][]uint32 // token ids of the shared prefixes (8k tokens each)
	keys      [][]uint64 // their local block keys, as the router computes them
	texts     []string   // their texts
	stop      func()
	conn      *grpc.ClientConn
	residency int
}

var (
	benchOnce sync.Once
	bench     *benchEnv
	benchErr  error
)

func benchTokenizer() (tokenize.Tokenizer, string) {
	dir := os.Getenv("KVINDEX_BENCH_TOKENIZER")
	if dir == "" {
		dir = filepath.Join("..", "..", ".cache", "tokenizers", "qwen3")
	}
	if t, err := tokenize.Load(tokenize.Spec{Model: benchModel, Dir: dir}, tokenize.Options{}); err == nil {
		return t, "qwen3"
	}
	return tokenize.NewBuiltin(), "builtin"
}

// words makes deterministic English-like text.
func words(rng *rand.Rand, minTokens int, tok tokenize.Tokenizer) (string, []uint32) {
	vocab := strings.Fields("the of and to in is was for on that with as by at from this be are or an have it not which " +
		"cache prefix block worker engine router prompt token model index replica leader follower request latency memory " +
		"kernel attention layer batch decode prefill offload tier gpu cpu disk hash chain tree node score hit rate")
	var sb strings.Builder
	for {
		for range 256 {
			sb.WriteString(vocab[rng.IntN(len(vocab))])
			sb.WriteByte(' ')
		}
		if ids := tok.Encode(sb.String(), true); len(ids) >= minTokens {
			return sb.String(), ids
		}
	}
}

func setupBench() (*benchEnv, error) {
	tok, tokName := benchTokenizer()
	env := &benchEnv{tokName: tokName}
	rng := rand.New(rand.NewPCG(1, 2))
	for range benchPrefixes {
		text, ids := words(rng, benchPrefixToks, tok)
		env.texts = append(env.texts, text)
		env.prefixes = append(env.prefixes, ids[:benchPrefixToks])
	}
	dataDir, err := os.MkdirTemp("", "kvindex-bench-")
	if err != nil {
		return nil, err
	}
	cfg := DefaultConfig()
	cfg.NodeID = "bench"
	cfg.HTTPAddr, cfg.GRPCAddr, cfg.Raft.RaftAddr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	cfg.DataDir = dataDir
	cfg.Ingest.DefaultBlockSize = benchBlock
	cfg.MaxBodyBytes = 8 << 20
	for w := range benchWorkers {
		cfg.Ingest.Workers = append(cfg.Ingest.Workers, workerspec.Spec{ID: fmt.Sprintf("worker-%02d", w), Model: benchModel, BlockSize: benchBlock})
	}
	srv, err := New(cfg, nil)
	if err != nil {
		return nil, err
	}
	srv.api.tokenizers.Register(benchModel, tok)
	env.srv = srv

	ns := kvblock.Namespace{Model: benchModel}.ID()
	prefixKeys := make([][]uint64, benchPrefixes)
	for p, ids := range env.prefixes {
		prefixKeys[p] = kvblock.AppendLocalHashes(nil, ids, benchBlock, "")
	}
	env.keys = prefixKeys
	hashes := make([]uint64, benchSeqBlocks)
	keys := make([]uint64, benchSeqBlocks)
	for w := range benchWorkers {
		wk := radix.WorkerKey{Worker: fmt.Sprintf("worker-%02d", w)}
		for s := range benchSeqs {
			p := (w*5 + s) % benchPrefixes
			shared := 128 + (w*31+s*17)%385
			copy(keys, prefixKeys[p][:shared])
			for i := shared; i < benchSeqBlocks; i++ {
				keys[i] = rng.Uint64()
			}
			for i := range hashes {
				hashes[i] = rng.Uint64() // engine hashes are opaque
			}
			tier := radix.TierGPU
			if s%4 == 3 {
				tier = radix.TierCPU
			}
			if _, err := srv.Index().Stored(wk, ns, 0, false, hashes, keys, tier); err != nil {
				return nil, err
			}
			env.residency += benchSeqBlocks
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	env.stop = func() {
		cancel()
		<-done
		os.RemoveAll(dataDir)
	}
	if env.conn, err = grpc.NewClient(srv.GRPCAddr(), append(kvindexv1.FlowControlDialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...); err != nil {
		return nil, err
	}
	for deadline := time.Now().Add(10 * time.Second); srv.Backend().Ready() != nil; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("bench server not ready: %v", srv.Backend().Ready())
		}
	}
	return env, nil
}

// runClients sends b.N requests from clients goroutines and reports latency
// percentiles and throughput.
func runClients(b *testing.B, clients int, call func(i int) error) {
	b.Helper()
	lat := make([]time.Duration, b.N)
	var next sync.Mutex
	n := 0
	var firstErr error
	var wg sync.WaitGroup
	b.ResetTimer()
	cpu0 := cputime.Process()
	start := time.Now()
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				next.Lock()
				i := n
				n++
				next.Unlock()
				if i >= b.N {
					return
				}
				t0 := time.Now()
				if err := call(i); err != nil {
					next.Lock()
					if firstErr == nil {
						firstErr = err
					}
					next.Unlock()
					return
				}
				lat[i] = time.Since(t0)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	cpu := cputime.Process() - cpu0
	b.StopTimer()
	if firstErr != nil {
		b.Fatal(firstErr)
	}
	reportLatencies(b, lat)
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "req/s")
	// CPU time of the whole process (clients, server, GC) per request: on a
	// shared machine it varies far less than latency, which measures the
	// other jobs as much as this code.
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/req")
	b.ReportMetric(0, "ns/op")
}

// reportLatencies reports the median and 99th percentile of lat (sorted in
// place), in microseconds.
func reportLatencies(b *testing.B, lat []time.Duration) {
	slices.Sort(lat)
	pct := func(p float64) float64 { return float64(lat[min(len(lat)-1, int(p*float64(len(lat))))].Microseconds()) }
	b.ReportMetric(pct(0.50), "p50-µs")
	b.ReportMetric(pct(0.99), "p99-µs")
}

// BenchmarkScore measures Score over gRPC and REST (POST /kv-cache/hit-rate)
// with token ids and text, and QueryByHash over gRPC with the prompt's local
// block keys as the router sends them ("hashes": matched workers only), for 2k-
// and 8k-token prompts and 1, 8 and 32 concurrent clients.
//
//	go test -run '^$' -bench BenchmarkScore -benchtime 2000x ./internal/server/
func BenchmarkScore(b *testing.B) {
	benchOnce.Do(func() { bench, benchErr = setupBench() })
	if benchErr != nil {
		b.Fatal(benchErr)
	}
	env := bench
	b.Logf("index: %d residencies, %d nodes, %d workers; text tokenizer %s", env.residency, env.srv.Index().Stats().Nodes, benchWorkers, env.tokName)
	idx := kvindexv1.NewIndexServiceClient(env.conn)
	httpClient := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	url := "http://" + env.srv.HTTPAddr() + "/kv-cache/hit-rate"
	tok, _ := env.srv.api.tokenizers.Lookup(benchModel)
	// The floor under every gRPC row: a call to the same server over the same
	// connection that does no work (the health service's Check), and the
	// Score work itself without gRPC. On a 2-vCPU host the first is most of a
	// Score's tail: gRPC hands each call on between five goroutines.
	health := healthpb.NewHealthClient(env.conn)
	b.Run("grpc/health/clients=1", func(b *testing.B) {
		runClients(b, 1, func(int) error {
			_, err := health.Check(context.Background(), &healthpb.HealthCheckRequest{})
			return err
		})
	})
	direct := indexService{a: env.srv.api}
	for _, size := range []int{2048, 8192} {
		b.Run(fmt.Sprintf("direct/tokens/%dk", size/1024), func(b *testing.B) {
			runClients(b, 1, func(i int) error {
				res, err := direct.scoreResult(context.Background(), &kvindexv1.ScoreRequest{Model: benchModel, TokenIds: env.prefixes[i%benchPrefixes][:size]})
				if err != nil {
					return err
				}
				res.release()
				return nil
			})
		})
	}
	for _, size := range []int{2048, 8192} {
		// Queries: the first size tokens of each shared prefix, and the text that
		// tokenizes to about as many.
		tokenQueries := make([][]uint32, benchPrefixes)
		textQueries := make([]string, benchPrefixes)
		for p := range benchPrefixes {
			tokenQueries[p] = env.prefixes[p][:size]
			text := env.texts[p]
			lo, hi := 0, len(text)
			for lo < hi { // shortest cut of the text with at least size tokens
				mid := (lo + hi) / 2
				if len(tok.Encode(text[:mid], true)) >= size {
					hi = mid
				} else {
					lo = mid + 1
				}
			}
			textQueries[p] = text[:lo]
		}
		for _, input := range []string{"tokens", "text-" + env.tokName, "hashes"} {
			for _, api := range []string{"grpc", "rest"} {
				if input == "hashes" && api == "rest" {
					continue // QueryByHash is gRPC only
				}
				bodies := make([][]byte, benchPrefixes)
				for p := range benchPrefixes {
					req := map[string]any{"model": benchModel, "token_ids": tokenQueries[p]}
					if input != "tokens" {
						req = map[string]any{"model": benchModel, "prompt": textQueries[p]}
					}
					bodies[p], _ = json.Marshal(req)
				}
				for _, clients := range []int{1, 8, 32} {
					b.Run(fmt.Sprintf("%s/%s/%dk/clients=%d", api, input, size/1024, clients), func(b *testing.B) {
						runClients(b, clients, func(i int) error {
							p := i % benchPrefixes
							if input == "hashes" {
								resp, err := idx.QueryByHash(context.Background(), &kvindexv1.QueryByHashRequest{
									Model: benchModel, BlockHashes: env.keys[p][:size/benchBlock],
									HashKind: kvindexv1.BlockHashKind_BLOCK_HASH_KIND_LOCAL, MatchedOnly: true,
								})
								if err == nil && (len(resp.Scores) == 0 || resp.Scores[0].MatchedBlocks == 0) {
									err = fmt.Errorf("query %d matched nothing", p)
								}
								return err
							}
							if api == "grpc" {
								req := &kvindexv1.ScoreRequest{Model: benchModel, TokenIds: tokenQueries[p]}
								if input != "tokens" {
									req = &kvindexv1.ScoreRequest{Model: benchModel, Text: textQueries[p]}
								}
								resp, err := idx.Score(context.Background(), req)
								if err == nil && resp.Scores[0].MatchedBlocks == 0 {
									err = fmt.Errorf("query %d matched nothing", p)
								}
								return err
							}
							resp, err := httpClient.Post(url, "application/json", bytes.NewReader(bodies[p]))
							if err != nil {
								return err
							}
							_, err = io.Copy(io.Discard, resp.Body)
							resp.Body.Close()
							if err == nil && resp.StatusCode != http.StatusOK {
								err = fmt.Errorf("status %d", resp.StatusCode)
							}
							return err
						})
					})
				}
			}
		}
	}
}
