package ingest

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvindex/kvindex/bench/fakeengine"
	"github.com/kvindex/kvindex/internal/radix"
	"github.com/kvindex/kvindex/internal/workerspec"
)

const (
	benchBlocks    = 32 // blocks stored and removed per batch
	benchBlockSize = 16
	benchCycle     = 512 // distinct batches a publisher cycles through
	benchWindow    = 64  // a batch removes the blocks stored this many batches before
)

// benchPayloads are a publisher's pre-encoded batches: batch i stores a root
// chain of benchBlocks blocks and removes the chain stored benchWindow batches
// before, so the index stays bounded while every batch carries
// 2*benchBlocks block events. Publishers share token content (so chains share
// tree nodes across workers) but not engine hashes.
func benchPayloads(b *testing.B, publisher int) [][]byte {
	b.Helper()
	hashes := func(i int) []uint64 {
		out := make([]uint64, benchBlocks)
		for j := range out {
			out[j] = uint64(publisher)<<40 | uint64(i%benchCycle)<<16 | uint64(j)
		}
		return out
	}
	out := make([][]byte, benchCycle)
	for i := range out {
		tokens := make([]uint32, benchBlocks*benchBlockSize)
		for j := range tokens {
			tokens[j] = uint32(i*7919 + j)
		}
		events := []fakeengine.Event{{Kind: fakeengine.BlockStored, BlockHashes: hashes(i), TokenIDs: tokens,
			BlockSize: benchBlockSize, Medium: fakeengine.MediumGPU}}
		// The first cycle removes nothing it has not stored; later cycles, reusing
		// these payloads, remove what the previous cycle stored.
		events = append(events, fakeengine.Event{Kind: fakeengine.BlockRemoved,
			BlockHashes: hashes((i - benchWindow + benchCycle) % benchCycle), Medium: fakeengine.MediumGPU})
		p, err := fakeengine.EncodeBatch(fakeengine.Batch{TS: 1, Events: events}, fakeengine.WireMap)
		if err != nil {
			b.Fatal(err)
		}
		if p[0] != 0x93 || p[1] != 0xcb {
			b.Fatalf("payload does not start with [float64 ts: % x", p[:2])
		}
		out[i] = p
	}
	return out
}

// lagRecorder wraps the Applier to time every batch from its engine timestamp to
// its application.
type lagRecorder struct {
	*Applier
	mu  sync.Mutex
	lag []time.Duration
}

func (l *lagRecorder) Apply(b StreamBatch) ApplyResult {
	res := l.Applier.Apply(b)
	d := time.Duration((float64(time.Now().UnixNano())/1e9 - b.TS) * 1e9)
	l.mu.Lock()
	l.lag = append(l.lag, d)
	l.mu.Unlock()
	return res
}

func (l *lagRecorder) quantile(q float64) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.lag) == 0 {
		return 0
	}
	s := slices.Clone(l.lag)
	slices.Sort(s)
	return s[int(math.Ceil(q*float64(len(s))))-1]
}

// benchIngest publishes b.N batches over loopback ZMQ from publishers raw PUB
// sockets, each followed in connect mode, at rate batches per second per
// publisher (0: as fast as it can), and reports block events applied per second
// and the engine-to-applied lag.
func benchIngest(b *testing.B, publishers int, rate float64) {
	zctx, err := zmq.NewContext()
	if err != nil {
		b.Fatal(err)
	}
	defer zctx.Term()
	type pub struct {
		sock     *zmq.Socket
		payloads [][]byte
		n        int
	}
	pubs := make([]*pub, publishers)
	cfg := DefaultManagerConfig()
	cfg.IdleReplayInterval = 0
	for i := range pubs {
		sock, err := zctx.NewSocket(zmq.PUB)
		if err != nil {
			b.Fatal(err)
		}
		defer sock.Close()
		for _, set := range []func() error{
			func() error { return sock.SetLinger(0) },
			func() error { return sock.SetSndhwm(0) }, // never drop: measure, do not lose
			func() error { return sock.Bind("tcp://127.0.0.1:*") },
		} {
			if err := set(); err != nil {
				b.Fatal(err)
			}
		}
		ep, err := sock.GetLastEndpoint()
		if err != nil {
			b.Fatal(err)
		}
		pubs[i] = &pub{sock: sock, payloads: benchPayloads(b, i), n: b.N / publishers}
		if i < b.N%publishers {
			pubs[i].n++
		}
		cfg.Workers = append(cfg.Workers, workerspec.Spec{ID: fmt.Sprintf("bench-%d", i), Model: "bench", BlockSize: benchBlockSize, Endpoint: ep})
	}
	index := radix.New(radix.Config{})
	rec := &lagRecorder{Applier: NewApplier(index), lag: make([]time.Duration, 0, b.N)}
	sink, err := NewLocalSink(rec, 0, nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	mgr, err := NewManager(cfg, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		b.Fatal(err)
	}
	defer mgr.Close()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); sink.Run(ctx) }()
	go func() { defer wg.Done(); mgr.Run(ctx, sink, rec.Applier) }()
	defer func() { cancel(); wg.Wait() }()

	// Handshake: publish seq 0 (an empty batch) until every subscriber has it.
	empty, err := fakeengine.EncodeBatch(fakeengine.Batch{TS: 1}, fakeengine.WireMap)
	if err != nil {
		b.Fatal(err)
	}
	seq0 := binary.BigEndian.AppendUint64(nil, 0)
	for i, p := range pubs {
		s := Stream{Worker: fmt.Sprintf("bench-%d", i)}
		for deadline := time.Now().Add(10 * time.Second); ; {
			if _, ok := rec.Cursor(s); ok {
				break
			}
			if time.Now().After(deadline) {
				b.Fatal("subscriber never connected")
			}
			if _, err := p.sock.SendMessage("", seq0, empty); err != nil {
				b.Fatal(err)
			}
			time.Sleep(time.Millisecond)
		}
	}
	rec.mu.Lock()
	rec.lag = rec.lag[:0]
	rec.mu.Unlock()

	b.ResetTimer()
	start := time.Now()
	var pw sync.WaitGroup
	for _, p := range pubs {
		pw.Add(1)
		go func() {
			defer pw.Done()
			seq := make([]byte, 8)
			for k := range p.n {
				if rate > 0 {
					if wait := time.Until(start.Add(time.Duration(float64(k) / rate * 1e9))); wait > 0 {
						time.Sleep(wait)
					}
				}
				payload := p.payloads[k%benchCycle]
				binary.BigEndian.PutUint64(payload[2:], math.Float64bits(float64(time.Now().UnixNano())/1e9))
				binary.BigEndian.PutUint64(seq, uint64(k+1))
				if _, err := p.sock.SendMessage("", seq, payload); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	pw.Wait()
	for i, p := range pubs {
		s := Stream{Worker: fmt.Sprintf("bench-%d", i)}
		for {
			if c, ok := rec.Cursor(s); ok && c.Seq == uint64(p.n) {
				break
			}
			time.Sleep(100 * time.Microsecond)
		}
	}
	elapsed := time.Since(start)
	b.StopTimer()
	// Only the first benchWindow batches of each publisher remove what was never
	// stored; anything else would mean the cycle is wrong or batches were lost.
	wantUnknown := 0
	for _, p := range pubs {
		wantUnknown += min(p.n, benchWindow) * benchBlocks
	}
	if st := index.Stats(); st.Counters.RemovedUnknown != uint64(wantUnknown) {
		b.Fatalf("%d removals of unknown blocks, want %d", st.Counters.RemovedUnknown, wantUnknown)
	}
	b.ReportMetric(float64(b.N)*2*benchBlocks/elapsed.Seconds(), "block-events/s")
	b.ReportMetric(float64(rec.quantile(0.5).Microseconds()), "lag-p50-µs")
	b.ReportMetric(float64(rec.quantile(0.99).Microseconds()), "lag-p99-µs")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkIngestThroughput: publishers send as fast as they can; the lag figures
// then measure the queue that builds up, not the pipeline's latency.
func BenchmarkIngestThroughput(b *testing.B) {
	for _, n := range []int{1, 4} {
		b.Run(fmt.Sprintf("publishers=%d", n), func(b *testing.B) { benchIngest(b, n, 0) })
	}
}

// BenchmarkIngestLag: 4 publishers at a fixed rate below saturation (the total in
// block events/s is in the name), for the end-to-end lag.
func BenchmarkIngestLag(b *testing.B) {
	for _, perPub := range []float64{1000, 4000} {
		b.Run(fmt.Sprintf("block-events/s=%.0f", 4*perPub*2*benchBlocks), func(b *testing.B) { benchIngest(b, 4, perPub) })
	}
}
