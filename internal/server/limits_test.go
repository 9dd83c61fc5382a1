package server

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	kvindexv1 "github.com/kvindex/kvindex/api/proto/kvindex/v1"
	"github.com/kvindex/kvindex/internal/kvblock"
	"github.com/kvindex/kvindex/internal/logbuf"
	"github.com/kvindex/kvindex/internal/radix"
)

// TestLimitsRefuseClearlyAndServeOthers drives each resource limit past its
// bound: the client over it gets a clear RESOURCE_EXHAUSTED or 4xx, and a
// healthy client is served meanwhile.
func TestLimitsRefuseClearlyAndServeOthers(t *testing.T) {
	f := newFixture(t, fixtureOptions{engines: defaultEngines[:1], configure: func(c *Config) {
		c.MaxWatchStreams = 2
		c.GRPCMaxConcurrentStreams = 3
		c.HTTPReadTimeout = 500 * time.Millisecond
	}})
	f.generate("e0", 0, tokens(0, 8), "")
	healthy := func(t *testing.T) {
		t.Helper()
		resp, err := f.index.Score(context.Background(), &kvindexv1.ScoreRequest{Model: testModel, TokenIds: tokens(0, 8)})
		if err != nil || len(resp.Scores) != 1 || resp.Scores[0].MatchedBlocks != 2 {
			t.Errorf("a healthy Score meanwhile = %v, %v", resp, err)
		}
		if code, body := f.get("/v1/stats"); code != http.StatusOK {
			t.Errorf("a healthy GET /v1/stats meanwhile = %d %s", code, body)
		}
	}
	dial := func(t *testing.T) *grpc.ClientConn {
		cc, err := grpc.NewClient(f.srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		return cc
	}
	tooMany := func(t *testing.T, err error, mention string) {
		t.Helper()
		if status.Code(err) != codes.ResourceExhausted || !strings.Contains(status.Convert(err).Message(), mention) {
			t.Errorf("over the limit: %v, want RESOURCE_EXHAUSTED mentioning %q", err, mention)
		}
	}

	t.Run("Watch streams", func(t *testing.T) {
		index := kvindexv1.NewIndexServiceClient(dial(t))
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		openWatch := func(ctx context.Context) error {
			s, err := index.Watch(ctx, &kvindexv1.WatchRequest{})
			if err == nil {
				_, err = s.Header() // an admitted stream sends its headers at once
			}
			return err
		}
		first, firstCancel := context.WithCancel(ctx)
		for range 2 {
			if err := openWatch(first); err != nil {
				t.Fatal(err)
			}
		}
		third, err := index.Watch(ctx, &kvindexv1.WatchRequest{})
		if err == nil {
			_, err = third.Recv()
		}
		tooMany(t, err, "--max-watch-streams")
		healthy(t)
		firstCancel() // both admitted streams end: Watch is served again
		deadline := time.Now().Add(20 * time.Second)
		for f.srv.api.watches.open.Load() != 0 {
			if time.Now().After(deadline) {
				t.Fatalf("%d Watch streams still counted after their clients left", f.srv.api.watches.open.Load())
			}
			time.Sleep(10 * time.Millisecond)
		}
		if err := openWatch(ctx); err != nil || f.srv.api.watches.open.Load() != 1 {
			t.Errorf("Watch after the others closed: %v (open %d)", err, f.srv.api.watches.open.Load())
		}
	})

	t.Run("one Dump at a time", func(t *testing.T) {
		holding, release := make(chan struct{}), make(chan struct{})
		done := make(chan error, 1)
		go func() {
			first := true
			done <- f.srv.api.dump(context.Background(), &kvindexv1.DumpRequest{}, func(*kvindexv1.DumpResponse) error {
				if first {
					first = false
					close(holding)
					<-release
				}
				return nil
			})
		}()
		<-holding
		s, err := f.index.Dump(context.Background(), &kvindexv1.DumpRequest{})
		if err == nil {
			_, err = s.Recv()
		}
		tooMany(t, err, "one runs at a time")
		if code, body := f.get("/dump"); code != http.StatusTooManyRequests || !strings.Contains(body, "resource_exhausted") {
			t.Errorf("GET /dump during a dump = %d %s, want 429 resource_exhausted", code, body)
		}
		healthy(t)
		close(release)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if code, body := f.get("/dump"); code != http.StatusOK {
			t.Errorf("GET /dump once the other ended = %d %s", code, body)
		}
	})

	t.Run("gRPC streams per connection", func(t *testing.T) {
		cc := dial(t)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		for range 3 { // health watches stay open: the connection's streams are all taken
			s, err := healthpb.NewHealthClient(cc).Watch(ctx, &healthpb.HealthCheckRequest{})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.Recv(); err != nil {
				t.Fatal(err)
			}
		}
		// The fourth call on that connection waits for a free stream; its
		// deadline ends it, while other connections are served.
		wctx, wcancel := context.WithTimeout(ctx, time.Second)
		defer wcancel()
		_, err := kvindexv1.NewIndexServiceClient(cc).Stats(wctx, &kvindexv1.StatsRequest{})
		if status.Code(err) != codes.DeadlineExceeded {
			t.Errorf("a call over --grpc-max-concurrent-streams on one connection = %v, want it held until its deadline", err)
		}
		healthy(t)
	})

	t.Run("keepalive pings", func(t *testing.T) {
		// A raw HTTP/2 client: grpc-go's own will not ping more often than
		// every 10 s. Pings faster than the policy allows end the connection
		// with GOAWAY ENHANCE_YOUR_CALM "too_many_pings".
		conn, err := net.Dial("tcp", f.srv.GRPCAddr())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		frame := func(typ byte, payload []byte) []byte {
			h := []byte{byte(len(payload) >> 16), byte(len(payload) >> 8), byte(len(payload)), typ, 0, 0, 0, 0, 0}
			return append(h, payload...)
		}
		out := []byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
		out = append(out, frame(0x4, nil)...) // SETTINGS
		for i := range 10 {
			out = append(out, frame(0x6, []byte{0, 0, 0, 0, 0, 0, 0, byte(i)})...) // PING
		}
		if _, err := conn.Write(out); err != nil {
			t.Fatal(err)
		}
		conn.SetReadDeadline(time.Now().Add(20 * time.Second))
		r := bufio.NewReader(conn)
		for {
			h := make([]byte, 9)
			if _, err := io.ReadFull(r, h); err != nil {
				t.Fatalf("the connection ended without a GOAWAY: %v", err)
			}
			payload := make([]byte, int(h[0])<<16|int(h[1])<<8|int(h[2]))
			if _, err := io.ReadFull(r, payload); err != nil {
				t.Fatal(err)
			}
			if h[3] != 0x7 { // not GOAWAY
				continue
			}
			code, debug := binary.BigEndian.Uint32(payload[4:8]), string(payload[8:])
			if code != 0xb || debug != "too_many_pings" {
				t.Errorf("GOAWAY code %#x %q, want ENHANCE_YOUR_CALM (0xb) too_many_pings", code, debug)
			}
			break
		}
		healthy(t)
	})

	t.Run("slow request body", func(t *testing.T) {
		conn, err := net.Dial("tcp", f.srv.HTTPAddr())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		// Headers promise 100 bytes; 10 come, then nothing.
		if _, err := conn.Write([]byte("POST /kv-cache/hit-rate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"model\":")); err != nil {
			t.Fatal(err)
		}
		healthy(t)
		conn.SetReadDeadline(time.Now().Add(20 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("no answer to a stalled body: %v", err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestTimeout {
			t.Errorf("a stalled body = %d, want 408", resp.StatusCode)
		}
		healthy(t)
	})

	t.Run("name lengths", func(t *testing.T) {
		long := strings.Repeat("x", MaxNameBytes+1)
		for _, req := range []*kvindexv1.ScoreRequest{
			{Model: long, TokenIds: tokens(0, 8)},
			{Model: testModel, LoraName: long, TokenIds: tokens(0, 8)},
			{Model: testModel, CacheSalt: long, TokenIds: tokens(0, 8)},
		} {
			_, err := f.index.Score(context.Background(), req)
			if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "more than the limit of 256") {
				t.Errorf("Score with a %d-byte name = %v, want RESOURCE_EXHAUSTED naming the limit", len(long), err)
			}
		}
		if code, body := f.postJSON("/kv-cache/hit-rate", map[string]any{"model": testModel, "cache_salt": long, "token_ids": tokens(0, 8)}); code != http.StatusRequestEntityTooLarge || !strings.Contains(body, "cache_salt") {
			t.Errorf("hit-rate with a long cache_salt = %d %s, want 413 naming cache_salt", code, body)
		}
		if code, body := f.postJSON("/register", map[string]any{"worker": map[string]any{"id": long, "model": testModel, "block_size": 4}}); code != http.StatusRequestEntityTooLarge || !strings.Contains(body, "worker id") {
			t.Errorf("register with a long id = %d %s, want 413 naming the worker id", code, body)
		}
		if code, body := f.postJSON("/unregister", map[string]any{"worker_id": long}); code != http.StatusRequestEntityTooLarge || !strings.Contains(body, "worker_id") {
			t.Errorf("unregister with a long id = %d %s, want 413 naming worker_id", code, body)
		}
		healthy(t)
	})

	t.Run("namespace names only for registered models", func(t *testing.T) {
		before := f.srv.api.names.count.Load()
		for i := range 50 {
			f.index.Score(context.Background(), &kvindexv1.ScoreRequest{Model: "unregistered", CacheSalt: strings.Repeat("s", i+1), TokenIds: tokens(0, 8), BlockSize: ptr(uint32(4))})
		}
		if got := f.srv.api.names.count.Load(); got != before {
			t.Errorf("queries for an unregistered model named %d namespaces", got-before)
		}
		if _, err := f.index.Score(context.Background(), &kvindexv1.ScoreRequest{Model: testModel, CacheSalt: "tenant-1", TokenIds: tokens(0, 8)}); err != nil {
			t.Fatal(err)
		}
		if got := f.srv.api.names.count.Load(); got != before+1 {
			t.Errorf("a query for a registered model named %d namespaces, want 1", got-before)
		}
	})
}

func ptr[T any](v T) *T { return &v }

// A client that opens a Dump and stops reading cannot keep the one dump slot,
// over gRPC or REST: once nothing could be sent for the write timeout, the
// stream (the response) ends and the next Dump runs to its end.
func TestStalledDumpReaderFreesTheSlot(t *testing.T) {
	cfg := testConfig(t)
	cfg.HTTPWriteTimeout = 500 * time.Millisecond
	logs := &logbuf.Buffer{}
	srv, err := New(cfg, slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	// Enough blocks that the dump cannot fit in the flow-control windows of a
	// gRPC client that reads nothing (64 KiB each, as set below), nor in the
	// socket buffers of a REST one (its JSON is several times tcp_wmem's 4 MiB
	// maximum).
	const blocks = 64 * 512
	ns := kvblock.Namespace{Model: testModel}.ID()
	keys, hashes := make([]uint64, 512), make([]uint64, 512)
	for s := range blocks / 512 {
		for i := range keys {
			keys[i], hashes[i] = uint64(s)<<32|uint64(i)+1, uint64(s)<<32|uint64(i)+1
		}
		if _, err := srv.Index().Stored(radix.WorkerKey{Worker: "w"}, ns, 0, false, hashes, keys, radix.TierGPU); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	defer func() { cancel(); <-done }()

	// untilWholeDump runs dumpOnce until it returns the whole index (nil),
	// while it fails with retryable (the stalled dump still holds the slot,
	// or this reader was itself descheduled past the write timeout by -race
	// on busy cores).
	untilWholeDump := func(t *testing.T, dumpOnce func() (changes int, err error, retryable bool)) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			n, err, retryable := dumpOnce()
			if err == nil {
				if n != blocks {
					t.Fatalf("the dump after the stalled one sent %d changes, want %d", n, blocks)
				}
				return
			}
			if !retryable {
				t.Fatalf("dump: %v", err)
			}
			if time.Now().After(deadline) {
				t.Fatalf("no whole dump after the stalled one within 30 s; last: %v", err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}

	t.Run("gRPC", func(t *testing.T) {
		dialSmall := func() *grpc.ClientConn {
			cc, err := grpc.NewClient(srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()),
				grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { cc.Close() })
			return cc
		}
		stalled, err := kvindexv1.NewIndexServiceClient(dialSmall()).Dump(context.Background(), &kvindexv1.DumpRequest{})
		if err != nil {
			t.Fatal(err)
		}
		_ = stalled // never read
		untilWholeDump(t, func() (int, error, bool) {
			s, err := kvindexv1.NewIndexServiceClient(dialSmall()).Dump(context.Background(), &kvindexv1.DumpRequest{})
			n := 0
			for err == nil {
				var m *kvindexv1.DumpResponse
				if m, err = s.Recv(); err == nil {
					n += len(m.Changes)
				}
			}
			if errors.Is(err, io.EOF) {
				return n, nil, false
			}
			c := status.Code(err)
			return n, err, c == codes.ResourceExhausted || c == codes.DeadlineExceeded
		})
	})

	t.Run("REST", func(t *testing.T) {
		conn, err := net.Dial("tcp", srv.HTTPAddr())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		conn.(*net.TCPConn).SetReadBuffer(4 << 10) // never read: the dump stalls once the buffers are full
		if _, err := conn.Write([]byte("GET /dump HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")); err != nil {
			t.Fatal(err)
		}
		// The stalled reader has started its dump once the slot is taken:
		// the first attempt below may otherwise win the slot before it.
		for deadline := time.Now().Add(30 * time.Second); len(srv.api.dumps) == 0; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("the stalled reader's dump never started")
			}
		}
		client := &http.Client{Timeout: 30 * time.Second}
		untilWholeDump(t, func() (int, error, bool) {
			resp, err := client.Get("http://" + srv.HTTPAddr() + "/dump")
			if err != nil {
				// No answer at all (EOF before the headers): the server's write
				// timeout ran out before this dump's first write, its handler
				// descheduled by -race on busy cores. Seen once at load 13.
				return 0, err, true
			}
			defer resp.Body.Close()
			if resp.StatusCode == http.StatusTooManyRequests {
				return 0, errors.New("429: the stalled dump holds the slot"), true
			}
			var dump struct {
				Changes []json.RawMessage `json:"changes"`
			}
			if err := json.NewDecoder(resp.Body).Decode(&dump); err != nil {
				// Cut off: this reader was too slow for the write timeout.
				return 0, fmt.Errorf("status %d, the body: %w", resp.StatusCode, err), resp.StatusCode == http.StatusOK
			}
			return len(dump.Changes), nil, false
		})
		// The stalled reader's response was cut off, not completed into the
		// socket buffers.
		if !strings.Contains(logs.String(), "dump interrupted") {
			t.Errorf("the stalled REST reader's dump was not interrupted: the test's index fits in the socket buffers")
		}
	})
}

// TestIdleHTTPConnectionsAreClosed: a keep-alive connection that sends no next
// request is closed after --http-idle-timeout (not after the much longer read
// timeout), while other clients are served.
func TestIdleHTTPConnectionsAreClosed(t *testing.T) {
	cfg := testConfig(t)
	cfg.HTTPIdleTimeout = 500 * time.Millisecond
	cfg.HTTPReadTimeout = time.Minute // longer than the wait below: only the idle timeout can end it
	srv := runServer(t, cfg)
	conn, err := net.Dial("tcp", srv.HTTPAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(conn)
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Close {
		t.Fatalf("GET /healthz = %d (close %v), want 200 on a kept-alive connection", resp.StatusCode, resp.Close)
	}
	if resp, err := (&http.Client{Timeout: 5 * time.Second}).Get("http://" + srv.HTTPAddr() + "/healthz"); err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("another client meanwhile: %v", err)
	} else {
		resp.Body.Close()
	}
	conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	if n, err := r.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Errorf("the idle connection: read %d bytes, %v; want it closed by the server (EOF) within 20 s", n, err)
	}
}

// A Watch client that stops reading (a consumer stuck in its callback, its
// connection alive) cannot keep its --max-watch-streams slot: once one
// message could not be sent for the write timeout, its stream ends and the
// next Watch is served. It used to hold the slot for as long as it lived.
func TestStalledWatchReaderFreesItsSlot(t *testing.T) {
	f := newFixture(t, fixtureOptions{engines: []engineSpec{}, configure: func(c *Config) {
		c.MaxWatchStreams = 1
		c.WatchBuffer = 4
		c.HTTPWriteTimeout = 500 * time.Millisecond
	}})
	cc, err := grpc.NewClient(f.srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	stalled, err := kvindexv1.NewIndexServiceClient(cc).Watch(context.Background(), &kvindexv1.WatchRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stalled.Header(); err != nil {
		t.Fatal(err)
	}
	// Never read again. Changes of 256 KiB each overflow the 64 KiB windows
	// at once: gRPC takes one message beyond them, and the next Send blocks.
	// One is published per attempt below, so there is always a next one.
	feed := f.srv.Backend().Changes()
	big := make([]uint64, 32<<10)
	for i := range big {
		big[i] = uint64(i) << 40
	}
	index := f.srv.Backend().AppliedIndex() + 1000 // beyond what this test applies
	deadline := time.Now().Add(30 * time.Second)
	for {
		index++
		feed.fan.publish([]*kvindexv1.IndexChange{{Worker: "w", Kind: kvindexv1.ChangeKind_CHANGE_KIND_REMOVED, SequenceHashes: big}}, index)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		w, err := f.index.Watch(ctx, &kvindexv1.WatchRequest{})
		var md metadata.MD
		if err == nil {
			// A refused call ends without headers; a served one sends them first.
			if md, err = w.Header(); err == nil && len(md.Get(kvindexv1.WatchFromKey)) == 0 {
				_, err = w.Recv()
			}
		}
		cancel()
		if err == nil {
			break
		}
		if status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("a Watch after the stalled one: %v, want it served or refused for the slot", err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("a Watch is still refused 30 s after its only slot went to a client that reads nothing: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := stalled.Recv(); status.Code(err) != codes.DeadlineExceeded {
		// Messages sent before the stall may come first.
		for err == nil {
			_, err = stalled.Recv()
		}
		if status.Code(err) != codes.DeadlineExceeded {
			t.Errorf("the stalled Watch ended with %v, want DEADLINE_EXCEEDED", err)
		}
	}
}
