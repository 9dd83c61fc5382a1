package raftstore

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/cputime"
	"github.com/kvindex/kvindex/internal/ingest"
)

// Benchmarks of replication: 3 nodes in this process on loopback TCP (the plain
// stream layer, no fault injection), bolt stores with fsync in b.TempDir().
//
//	go test -run '^$' -bench 'Replicated|RawEntries' -benchtime 100000x ./internal/raftstore/
//	go test -run '^$' -bench 'ReplicatedSteady' -benchtime 50000x ./internal/raftstore/
//
// b.N is the number of stream batches (blockEvents block events each). Reported:
// block-events/s replicated (submitted until applied on all three replicas),
// entries/s, and the latency from Submit to applied on the leader (p50, p99).

const blockEvents = 16 // per stream batch, as an engine step storing a 256-token prompt

// startPlainCluster starts n nodes listening on 127.0.0.1:0; the first
// bootstraps and the others join it.
func startPlainCluster(tb testing.TB, n int, configure func(c *Config)) []*Node {
	tb.Helper()
	var nodes []*Node
	tb.Cleanup(func() {
		for _, nd := range nodes {
			nd.stop(true)
		}
	})
	for i := range n {
		cfg := DefaultConfig()
		cfg.NodeID, cfg.RaftAddr, cfg.DataDir = fmt.Sprintf("node-%d", i), "127.0.0.1:0", filepath.Join(tb.TempDir(), "data")
		cfg.Bootstrap = i == 0
		cfg.Logger = testLogger()
		// Longer than DefaultConfig's: on a shared 2-core machine a starved leader
		// otherwise loses its lease mid-run, which measures the neighbours.
		cfg.HeartbeatTimeout, cfg.ElectionTimeout, cfg.LeaderLeaseTimeout = 2*time.Second, 2*time.Second, time.Second
		if configure != nil {
			configure(&cfg)
		}
		nd, err := NewNode(cfg)
		if err != nil {
			tb.Fatal(err)
		}
		nodes = append(nodes, nd)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for !nodes[0].IsLeader() {
		if ctx.Err() != nil {
			tb.Fatal("no leader")
		}
		time.Sleep(5 * time.Millisecond)
	}
	for _, nd := range nodes[1:] {
		if _, err := nodes[0].Join(ctx, nd.ID(), nd.RaftAddr(), "", true); err != nil {
			tb.Fatal(err)
		}
	}
	return nodes
}

// benchLoad is b.N batches over 16 streams, generated before the clock starts.
type benchLoad struct {
	perStream [][]ingest.StreamBatch
	streamIdx map[ingest.Stream]int
	submitted [][]time.Time // when each sampled batch was submitted
	applied   [][]time.Time // when the leader applied it
}

const latencySample = 8 // every 8th batch of a stream is timed

func newBenchLoad(n int) *benchLoad {
	const streams = 16
	l := &benchLoad{streamIdx: map[ingest.Stream]int{}}
	for i, g := range testStreams(streams) {
		l.streamIdx[g.stream] = i
		count := n / streams
		if i < n%streams {
			count++
		}
		bs := make([]ingest.StreamBatch, count)
		for j := range bs {
			bs[j] = g.batch(blockEvents)
		}
		l.perStream = append(l.perStream, bs)
		l.submitted = append(l.submitted, make([]time.Time, count/latencySample+1))
		l.applied = append(l.applied, make([]time.Time, count/latencySample+1))
	}
	return l
}

// observe is the leader's BatchObserver.
func (l *benchLoad) observe(_ uint64, b *ingest.StreamBatch, _ BatchOutcome, _ ingest.ApplyResult) {
	if b.Seq%latencySample == 0 {
		l.applied[l.streamIdx[b.Stream]][b.Seq/latencySample] = time.Now()
	}
}

func (l *benchLoad) latencies() []time.Duration {
	var out []time.Duration
	for i := range l.submitted {
		for j, at := range l.submitted[i] {
			if done := l.applied[i][j]; !at.IsZero() && !done.IsZero() {
				out = append(out, done.Sub(at))
			}
		}
	}
	slices.Sort(out)
	return out
}

func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, int(q*float64(len(sorted))))]
}

// runReplicated submits b.N batches from one goroutine per stream, as fast as
// Submit takes them or, with rate > 0, paced at rate block events per second in
// total (steady load, for latency).
func runReplicated(b *testing.B, rate float64, configure func(c *Config)) {
	load := newBenchLoad(b.N)
	var leaderLoad *benchLoad
	nodes := startPlainCluster(b, 3, func(c *Config) {
		if configure != nil {
			configure(c)
		}
		if c.Bootstrap {
			c.OnBatch = load.observe
			leaderLoad = load
		}
	})
	if leaderLoad == nil {
		b.Fatal("leader has no observer")
	}
	leader := nodes[0]
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	startEntries := leader.raft.LastIndex()
	b.ResetTimer()
	start, startCPU := time.Now(), cputime.Process()
	var wg sync.WaitGroup
	errs := make(chan error, len(load.perStream))
	interval := time.Duration(0)
	if rate > 0 {
		interval = time.Duration(float64(time.Second) * float64(len(load.perStream)*blockEvents) / rate)
	}
	for i, bs := range load.perStream {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k, batch := range bs {
				if interval > 0 {
					time.Sleep(time.Until(start.Add(time.Duration(k) * interval)))
				}
				if batch.Seq%latencySample == 0 {
					load.submitted[i][batch.Seq/latencySample] = time.Now()
				}
				if err := leader.Submit(ctx, batch); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	if err := leader.Flush(ctx); err != nil {
		b.Fatal(err)
	}
	target := leader.raft.LastIndex()
	for _, nd := range nodes {
		if err := nd.WaitApplied(ctx, target); err != nil {
			b.Fatal(err)
		}
	}
	elapsed, cpu := time.Since(start), cputime.Process()-startCPU
	b.StopTimer()
	events := 0
	for _, bs := range load.perStream {
		for i := range bs {
			events += batchEvents(&bs[i])
		}
	}
	lat := load.latencies()
	b.ReportMetric(float64(events)/elapsed.Seconds(), "block-events/s")
	b.ReportMetric(float64(target-startEntries)/elapsed.Seconds(), "entries/s")
	b.ReportMetric(float64(quantile(lat, 0.5).Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(quantile(lat, 0.99).Microseconds())/1000, "p99-ms")
	// The three replicas' CPU (plus the producers'): on this machine's cores the
	// ceiling is cores / cpu-ns-per-event, whatever the load of other jobs.
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(events), "cpu-ns/event")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkReplicated is batching as configured by DefaultConfig, then variations
// of the knobs docs/design.md measured.
func BenchmarkReplicated(b *testing.B) {
	cases := []struct {
		name string
		set  func(c *Config)
	}{
		{"default", nil},
		{"inflight=1", func(c *Config) { c.MaxInFlight = 1 }},
		{"inflight=2", func(c *Config) { c.MaxInFlight = 2 }},
		{"inflight=4", func(c *Config) { c.MaxInFlight = 4 }},
		{"inflight=8", func(c *Config) { c.MaxInFlight = 8 }},
		{"inflight=64", func(c *Config) { c.MaxInFlight = 64 }},
		{"no-log-cache", func(c *Config) { c.LogCacheSize = 0 }},
		{"max-append=64", func(c *Config) { c.MaxAppendEntries = 64 }},
		{"no-batch-apply-ch", func(c *Config) { c.BatchApplyCh = false }},
		{"wait=0", func(c *Config) { c.MaxBatchWait = 0 }},
		{"events=1024", func(c *Config) { c.MaxBatchEvents = 1024 }},
		{"events=16384", func(c *Config) { c.MaxBatchEvents = 16384; c.MaxBatchBytes = 1 << 20 }},
	}
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) { runReplicated(b, 0, tc.set) })
	}
}

// BenchmarkReplicatedSteady offers a fixed load below saturation, for latency.
func BenchmarkReplicatedSteady(b *testing.B) {
	for _, rate := range []float64{100e3, 500e3, 1000e3} {
		b.Run(fmt.Sprintf("rate=%.0fk", rate/1e3), func(b *testing.B) { runReplicated(b, rate, nil) })
	}
}

// BenchmarkRawEntries proposes every stream batch as its own log entry (no
// batching), pipelined or one at a time, to show what batching buys.
func BenchmarkRawEntries(b *testing.B) {
	cases := []struct {
		name string
		set  func(c *Config)
	}{
		{"inflight=1", func(c *Config) { c.MaxInFlight = 1 }},
		{"inflight=64", func(c *Config) { c.MaxInFlight = 64 }},
		{"inflight=64/no-batch-apply-ch", func(c *Config) { c.MaxInFlight, c.BatchApplyCh = 64, false }},
		{"inflight=64/no-log-cache", func(c *Config) { c.MaxInFlight, c.LogCacheSize = 64, 0 }},
		{"inflight=256/max-append=1024", func(c *Config) { c.MaxInFlight, c.MaxAppendEntries = 256, 1024 }},
	}
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) {
			runReplicated(b, 0, func(c *Config) {
				c.MaxBatchEvents = 1
				if tc.set != nil {
					tc.set(c)
				}
			})
		})
	}
}

// BenchmarkFSMApply is the apply cost alone (decode and index), the ceiling of
// what one replica can take: entries of 256 batches of 16 block events.
func BenchmarkFSMApply(b *testing.B) {
	load := newBenchLoad(b.N)
	var entries [][]byte
	var be batchEncoder
	for i := 0; ; i++ {
		progressed := false
		for _, bs := range load.perStream {
			if i < len(bs) {
				progressed = true
				if err := be.add(&bs[i]); err != nil {
					b.Fatal(err)
				}
				if be.batches == 256 {
					entries = append(entries, be.finish(nil))
					be.reset()
				}
			}
		}
		if !progressed {
			break
		}
	}
	if be.batches > 0 {
		entries = append(entries, be.finish(nil))
	}
	f := newTestFSM(b, nil)
	b.ResetTimer()
	start, startCPU := time.Now(), cputime.Process()
	for i, e := range entries {
		if r := applyData(f, uint64(i+1), e); r.Err != nil {
			b.Fatal(r.Err)
		}
	}
	b.ReportMetric(float64(b.N*blockEvents)/time.Since(start).Seconds(), "block-events/s")
	b.ReportMetric(float64((cputime.Process()-startCPU).Nanoseconds())/float64(b.N*blockEvents), "cpu-ns/event")
}
