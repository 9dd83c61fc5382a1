package server

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	kvindexv1 "github.com/kvindex/kvindex/api/proto/kvindex/v1"
	"github.com/kvindex/kvindex/internal/cputime"
)

// benchClientEnv names the file that turns this test binary into the client of
// BenchmarkScoreFromAnotherProcess (TestMain reads it).
const benchClientEnv = "KVINDEX_BENCH_SCORE_CLIENT"

// benchClientJob is what the client process is asked to do, and benchClientResult
// what it answers on its standard output.
type benchClientJob struct {
	Addr    string     `json:"addr"`
	Model   string     `json:"model"`
	Queries [][]uint32 `json:"queries"`
	N       int        `json:"n"`
}

type benchClientResult struct {
	LatencyMicros []int64 `json:"latency_us"`
	CPUMicros     int64   `json:"cpu_us"`
}

// BenchmarkScoreFromAnotherProcess is BenchmarkScore's gRPC 2k-token query at
// one client, with the client in a process of its own, as every real client
// is: its garbage no longer makes the server's collector mark the index, and
// each request crosses two schedulers. It reports the client's latency and
// the CPU each side spends per request.
//
//	go test -run '^$' -bench BenchmarkScoreFromAnotherProcess -benchtime 20000x ./internal/server/
//
// Set GOMAXPROCS_CLIENT to run the client with that GOMAXPROCS.
func BenchmarkScoreFromAnotherProcess(b *testing.B) {
	benchOnce.Do(func() { bench, benchErr = setupBench() })
	if benchErr != nil {
		b.Fatal(benchErr)
	}
	job := benchClientJob{Addr: bench.srv.GRPCAddr(), Model: benchModel, N: b.N}
	for _, prefix := range bench.prefixes {
		job.Queries = append(job.Queries, prefix[:2048])
	}
	jobFile := filepath.Join(b.TempDir(), "job.json")
	data, err := json.Marshal(job)
	if err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(jobFile, data, 0o600); err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), benchClientEnv+"="+jobFile)
	if procs := os.Getenv("GOMAXPROCS_CLIENT"); procs != "" {
		cmd.Env = append(cmd.Env, "GOMAXPROCS="+procs)
	}
	cmd.Stderr = os.Stderr
	b.ResetTimer()
	serverCPU := cputime.Process()
	out, err := cmd.Output()
	serverCPU = cputime.Process() - serverCPU
	b.StopTimer()
	if err != nil {
		b.Fatalf("client process: %v", err)
	}
	var res benchClientResult
	if err := json.Unmarshal(out, &res); err != nil {
		b.Fatalf("client process answered %q: %v", out, err)
	}
	if len(res.LatencyMicros) != b.N {
		b.Fatalf("client process measured %d requests, want %d", len(res.LatencyMicros), b.N)
	}
	lat := make([]time.Duration, len(res.LatencyMicros))
	var total time.Duration
	for i, us := range res.LatencyMicros {
		lat[i] = time.Duration(us) * time.Microsecond
		total += lat[i]
	}
	reportLatencies(b, lat)
	b.ReportMetric(float64(b.N)/total.Seconds(), "req/s")
	b.ReportMetric(float64(serverCPU.Microseconds())/float64(b.N), "server-cpu-µs/req")
	b.ReportMetric(float64(res.CPUMicros)/float64(b.N), "client-cpu-µs/req")
	b.ReportMetric(0, "ns/op")
}

// runBenchClient is the client process of BenchmarkScoreFromAnotherProcess:
// it sends the job's queries one at a time over one connection and prints
// each one's latency.
func runBenchClient(jobFile string) error {
	data, err := os.ReadFile(jobFile)
	if err != nil {
		return err
	}
	var job benchClientJob
	if err := json.Unmarshal(data, &job); err != nil {
		return err
	}
	conn, err := grpc.NewClient(job.Addr, append(kvindexv1.FlowControlDialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		return err
	}
	defer conn.Close()
	idx := kvindexv1.NewIndexServiceClient(conn)
	// Warm up the connection (and the server's pools) before measuring.
	for i := range 200 {
		if _, err := idx.Score(context.Background(), &kvindexv1.ScoreRequest{Model: job.Model, TokenIds: job.Queries[i%len(job.Queries)]}); err != nil {
			return err
		}
	}
	res := benchClientResult{LatencyMicros: make([]int64, job.N)}
	cpu0 := cputime.Process()
	for i := range job.N {
		start := time.Now()
		resp, err := idx.Score(context.Background(), &kvindexv1.ScoreRequest{Model: job.Model, TokenIds: job.Queries[i%len(job.Queries)]})
		if err != nil {
			return err
		}
		res.LatencyMicros[i] = time.Since(start).Microseconds()
		if resp.Scores[0].MatchedBlocks == 0 {
			return fmt.Errorf("query %d matched nothing", i%len(job.Queries))
		}
	}
	res.CPUMicros = (cputime.Process() - cpu0).Microseconds()
	return json.NewEncoder(os.Stdout).Encode(res)
}
