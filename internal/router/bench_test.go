package router

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvindex/kvindex/bench/fakeengine"
	"github.com/kvindex/kvindex/internal/cputime"
	"github.com/kvindex/kvindex/internal/workerspec"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// longPromptFleet is n fake engines with 16-token blocks and room (20,000 GPU
// blocks, 16k-token prompts) for the benchmarks' long prompts.
func longPromptFleet(b *testing.B, n int) *fleet {
	return startFleet(b, n, func(_ int, c *fakeengine.Config) {
		c.BlockSize = 16
		c.NumGPUBlocks = 20000
		c.MaxModelLen = 16384
	})
}

// BenchmarkRouterOverhead measures what the router adds to a request: the same
// completion requests (a shared 2k- or 8k-token prefix, a unique tail) go to one
// fake engine directly and through a kv-aware router that asks a live in-process
// indexer, alternating request by request so both see the same machine state.
// It reports p50/p99 of each path and of their difference, and the router's own
// arrival-to-upstream time. The engine never sleeps (time scale 0), so what is
// measured is HTTP, tokenization, hashing, the indexer query and the relay.
//
//	go test -run '^$' -bench RouterOverhead -benchtime 2000x ./internal/router
func BenchmarkRouterOverhead(b *testing.B) {
	for _, tokens := range []int{2048, 8192} {
		b.Run(fmt.Sprintf("prompt=%d", tokens), func(b *testing.B) {
			f := longPromptFleet(b, 1)
			ix := startIndexer(b, f)
			cfg := testConfig(b, f)
			cfg.Indexer = []string{ix.addr}
			cfg.BlockSize = 16
			cfg.LogLevel = "error"
			rt := startRouter(b, cfg)
			engineURL := f.engines["w0"].URL()
			// The builtin tokenizer is byte-level: one token per byte (plus BOS).
			prefix := bytes.Repeat([]byte("a"), tokens-64)
			body := func(i int) []byte {
				return []byte(fmt.Sprintf(`{"model":%q,"prompt":"%s unique tail %08d ...........................................","max_tokens":1}`, testModel, prefix, i))
			}
			// trySend is send with its failure returned, for the throughput
			// clients' goroutines, which must not call FailNow.
			trySend := func(url string, i int) (time.Duration, error) {
				start := time.Now()
				resp, err := http.Post(url+"/v1/completions", "application/json", bytes.NewReader(body(i)))
				if err != nil {
					return 0, err
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					return 0, fmt.Errorf("status %d", resp.StatusCode)
				}
				return time.Since(start), nil
			}
			send := func(url string, i int) time.Duration {
				d, err := trySend(url, i)
				if err != nil {
					b.Fatal(err)
				}
				return d
			}
			for i := range 50 { // warm connections, caches and the index
				send(engineURL, -i-1)
				send(rt.url, -i-1)
			}
			direct := make([]time.Duration, 0, b.N)
			routed := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for i := range b.N {
				direct = append(direct, send(engineURL, i))
				routed = append(routed, send(rt.url, i))
			}
			b.StopTimer()
			pd50, pd99 := pct(direct, 50), pct(direct, 99)
			pr50, pr99 := pct(routed, 50), pct(routed, 99)
			b.ReportMetric(us(pd50), "direct_p50_us")
			b.ReportMetric(us(pd99), "direct_p99_us")
			b.ReportMetric(us(pr50), "routed_p50_us")
			b.ReportMetric(us(pr99), "routed_p99_us")
			b.ReportMetric(us(pr50-pd50), "added_p50_us")
			b.ReportMetric(us(pr99-pd99), "added_p99_us")
			b.ReportMetric(0, "ns/op")
			// Throughput: 8 clients for a fixed count of requests each, direct then routed.
			for _, mode := range []struct {
				name string
				url  string
			}{{"direct", engineURL}, {"routed", rt.url}} {
				const clients, each = 8, 100
				start := time.Now()
				var wg sync.WaitGroup
				for c := range clients {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for i := range each {
							if _, err := trySend(mode.url, 1_000_000+c*each+i); err != nil {
								b.Error(err)
								return
							}
						}
					}()
				}
				wg.Wait()
				b.ReportMetric(float64(clients*each)/time.Since(start).Seconds(), mode.name+"_req/s")
			}
		})
	}
}

func pct(d []time.Duration, p int) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, len(s)*p/100)]
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// BenchmarkPrepareAndDecide is the router's own work per request without the
// HTTP hops: read the body, tokenize (built-in tokenizer), hash, ask the live
// indexer (gRPC on loopback), score and reserve. Reservations are released at
// once so the load stays flat.
//
//	go test -run '^$' -bench PrepareAndDecide -benchmem ./internal/router
func BenchmarkPrepareAndDecide(b *testing.B) {
	for _, tokens := range []int{2048, 8192} {
		b.Run(fmt.Sprintf("prompt=%d", tokens), func(b *testing.B) {
			f := longPromptFleet(b, 4)
			ix := startIndexer(b, f)
			cfg := testConfig(b, f)
			cfg.Indexer = []string{ix.addr}
			cfg.IndexerTimeout = time.Second // measure the query, never the fallback
			cfg.BlockSize = 16
			cfg.LogLevel = "error"
			rt := startRouter(b, cfg)
			prefix := bytes.Repeat([]byte("a"), tokens-64)
			// Cache the prefix on one engine so the indexer has a real answer to give.
			if code, _, raw := post(b, rt.url, "/v1/completions", fmt.Sprintf(`{"model":%q,"prompt":"%s warm","max_tokens":1}`, testModel, prefix)); code != http.StatusOK {
				b.Fatalf("%d %s", code, raw)
			}
			ix.caughtUp(b, f)
			bodies := make([][]byte, 64)
			for i := range bodies {
				bodies[i] = []byte(fmt.Sprintf(`{"model":%q,"prompt":"%s unique tail %08d","max_tokens":1}`, testModel, prefix, i))
			}
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				p, err := rt.prepare(http.Header{}, "/v1/completions", endpointCompletions, bodies[i%len(bodies)])
				if err != nil {
					b.Fatal(err)
				}
				d, err := rt.decide(ctx, p, nil, false)
				if err != nil {
					b.Fatal(err)
				}
				d.release()
				if !p.indexOK {
					b.Fatal("the indexer did not answer")
				}
			}
		})
	}
}

// BenchmarkLedgerCost measures what sharing load costs: three routers in front
// of four engines route the same requests (8 clients spread over the routers)
// with the ledger on and off. It reports ledger messages and payload bytes per
// request (both directions, all routers) and the process CPU time per request
// with and without the ledger, whose difference is the ledger's CPU (routers'
// and the indexer leader's together, since all run in this process).
//
//	go test -run '^$' -bench LedgerCost -benchtime 3000x ./internal/router
func BenchmarkLedgerCost(b *testing.B) {
	f := startFleet(b, 4, func(_ int, c *fakeengine.Config) { c.BlockSize = 16; c.NumGPUBlocks = 4096 })
	ix := startIndexer(b, f)
	run := func(ledger bool) (cpuPerReq time.Duration, msgs, bytes float64) {
		var rs []*testRouter
		for i := range 3 {
			cfg := testConfig(b, f)
			cfg.Indexer = []string{ix.addr}
			cfg.IndexerTimeout = time.Second
			cfg.Ledger = ledger
			cfg.RouterID = fmt.Sprintf("bench-%v-%d", ledger, i)
			cfg.BlockSize = 16
			cfg.LogLevel = "error"
			rs = append(rs, startRouter(b, cfg))
		}
		if ledger {
			for _, r := range rs {
				waitFor(b, 20*time.Second, "the ledger", func() bool { return r.shared.connected.Load() })
			}
		}
		prompt := strings.Repeat("shared system prompt ", 50)
		n := b.N
		var wg sync.WaitGroup
		start := cputime.Process()
		for c := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := c; i < n; i += 8 {
					body := fmt.Sprintf(`{"model":%q,"prompt":"%s user %d","max_tokens":4}`, testModel, prompt, i)
					resp, err := http.Post(rs[i%3].url+"/v1/completions", "application/json", strings.NewReader(body))
					if err != nil {
						b.Error(err)
						return
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			}()
		}
		wg.Wait()
		cpu := cputime.Process() - start
		for _, r := range rs {
			for _, d := range []string{"sent", "received"} {
				msgs += testutil.ToFloat64(r.metrics.ledgerMessages.WithLabelValues(d))
				bytes += testutil.ToFloat64(r.metrics.ledgerBytes.WithLabelValues(d))
			}
		}
		return cpu / time.Duration(n), msgs / float64(n), bytes / float64(n)
	}
	b.ResetTimer()
	off, _, _ := run(false)
	on, msgs, bytes := run(true)
	b.StopTimer()
	b.ReportMetric(float64(off.Microseconds()), "cpu_us/req_ledger_off")
	b.ReportMetric(float64(on.Microseconds()), "cpu_us/req_ledger_on")
	b.ReportMetric(msgs, "ledger_msgs/req")
	b.ReportMetric(bytes, "ledger_bytes/req")
	// CPU seconds per second spent on the ledger at 1k requests/s.
	b.ReportMetric(float64(on-off)/float64(time.Millisecond), "ledger_cpu_s_per_s_at_1k_rps")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkDecideFleetSize measures one kv-aware decision (candidates, the
// indexer's answer, overlays, loads, the pick and the reservation) as the fleet
// grows: 8, 100 and 1,000 workers, all served by one fake engine's HTTP (only the
// first is the engine's event stream, so the indexer knows its blocks), with a
// request in flight on a quarter of them so the ledger has load to read.
//
//	go test -run '^$' -bench DecideFleetSize -benchtime 3000x ./internal/router
func BenchmarkDecideFleetSize(b *testing.B) {
	for _, n := range []int{8, 100, 1000} {
		b.Run(fmt.Sprintf("workers=%d", n), func(b *testing.B) {
			f := longPromptFleet(b, 1)
			ix := startIndexer(b, f)
			cfg := testConfig(b, f)
			real := cfg.Workers[0]
			for i := 1; i < n; i++ {
				cfg.Workers = append(cfg.Workers, workerspec.Spec{ID: fmt.Sprintf("w-%04d", i), Model: real.Model, BlockSize: real.BlockSize, HTTP: real.HTTP})
			}
			cfg.Indexer = []string{ix.addr}
			cfg.IndexerTimeout = time.Second // measure the query, never the fallback
			cfg.BlockSize = 16
			cfg.LogLevel = "error"
			rt := startRouter(b, cfg)
			prefix := bytes.Repeat([]byte("a"), 2048-64)
			if code, _, raw := post(b, rt.url, "/v1/completions", fmt.Sprintf(`{"model":%q,"prompt":"%s warm","max_tokens":1}`, testModel, prefix)); code != http.StatusOK {
				b.Fatalf("%d %s", code, raw)
			}
			ix.caughtUp(b, f)
			ctx := context.Background()
			prepare := func(i int) *prepared {
				body := []byte(fmt.Sprintf(`{"model":%q,"prompt":"%s unique tail %08d","max_tokens":1}`, testModel, prefix, i))
				p, err := rt.prepare(http.Header{}, "/v1/completions", endpointCompletions, body)
				if err != nil {
					b.Fatal(err)
				}
				return p
			}
			var held []*Decision
			defer func() {
				for _, d := range held {
					d.release()
				}
			}()
			for i := range n / 4 {
				d, err := rt.decide(ctx, prepare(-1-i), nil, false)
				if err != nil {
					b.Fatal(err)
				}
				held = append(held, d)
			}
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for i := range b.N {
				p := prepare(i)
				t0 := time.Now()
				d, err := rt.decide(ctx, p, nil, false)
				lat = append(lat, time.Since(t0))
				if err != nil {
					b.Fatal(err)
				}
				d.release()
			}
			b.StopTimer()
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
		})
	}
}
