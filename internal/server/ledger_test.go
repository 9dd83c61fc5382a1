package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	kvindexv1 "github.com/kvindex/kvindex/api/proto/kvindex/v1"
	"github.com/kvindex/kvindex/bench/fakeengine/fakeenginetest"
	kvindex "github.com/kvindex/kvindex/clients/go"
	"github.com/kvindex/kvindex/internal/ledgerq"
	"github.com/kvindex/kvindex/internal/router"
	"github.com/kvindex/kvindex/internal/workerspec"
)

// ledgerStream opens a LoadService stream on addr as a router would.
func ledgerStream(t *testing.T, addr, token string) kvindexv1.LoadService_ReportClient {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if token != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
	}
	s, err := kvindexv1.NewLoadServiceClient(cc).Report(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// recvUntil reads views into view (applying full and partial pushes) until cond
// holds of it, for at most 20 s (the leader pushes at least once a second).
func recvUntil(t *testing.T, s kvindexv1.LoadService_ReportClient, view map[string]uint32, cond func(map[string]uint32) bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond(view) {
		if time.Now().After(deadline) {
			t.Fatalf("the pushed view is still %v after 20s", view)
		}
		resp, err := s.Recv()
		if err != nil {
			t.Fatalf("recv: %v (view %v)", err, view)
		}
		if resp.Full {
			clear(view)
		}
		for _, l := range resp.Loads {
			k := fmt.Sprintf("%s/%d", l.Worker, l.DpRank)
			if l.InFlight == 0 {
				delete(view, k)
			} else {
				view[k] = l.InFlight
			}
		}
	}
}

// The leader sums the routers' reported loads per target and sends each router
// the others' sum; a report replaces what it lists; a full report replaces all;
// a second stream for the same router replaces the first; the first message must
// be a full report with a router id; a token is needed when one is set.
func TestLedgerSumsTheOtherRoutersLoad(t *testing.T) {
	cfg := testConfig(t)
	cfg.AdminToken = "ledger-secret"
	cfg.LedgerMaxRouters = 3
	srv := runServer(t, cfg)
	addr := srv.GRPCAddr()
	waitForCond(t, 20*time.Second, "the node to lead", func() bool { return srv.node.IsLeader() && srv.backend.Ready() == nil })

	a, b := ledgerStream(t, addr, "ledger-secret"), ledgerStream(t, addr, "ledger-secret")
	load := func(w string, n uint32) *kvindexv1.TargetLoad {
		return &kvindexv1.TargetLoad{Worker: w, InFlight: n, DecodeBlocks: uint64(10 * n)}
	}
	if err := a.Send(&kvindexv1.ReportRequest{RouterId: "a", Full: true, Loads: []*kvindexv1.TargetLoad{load("w0", 2), load("w1", 1)}}); err != nil {
		t.Fatal(err)
	}
	if err := b.Send(&kvindexv1.ReportRequest{RouterId: "b", Full: true, Loads: []*kvindexv1.TargetLoad{load("w0", 3)}}); err != nil {
		t.Fatal(err)
	}
	va, vb := map[string]uint32{}, map[string]uint32{}
	recvUntil(t, a, va, func(v map[string]uint32) bool { return v["w0/0"] == 3 && len(v) == 1 })
	recvUntil(t, b, vb, func(v map[string]uint32) bool { return v["w0/0"] == 2 && v["w1/0"] == 1 && len(v) == 2 })

	// A partial report changes only what it lists; a zero clears.
	if err := a.Send(&kvindexv1.ReportRequest{RouterId: "a", Loads: []*kvindexv1.TargetLoad{{Worker: "w1"}}}); err != nil {
		t.Fatal(err)
	}
	recvUntil(t, b, vb, func(v map[string]uint32) bool { return v["w0/0"] == 2 && len(v) == 1 })
	// A full report drops what it does not list.
	if err := a.Send(&kvindexv1.ReportRequest{RouterId: "a", Full: true, Loads: []*kvindexv1.TargetLoad{load("w2", 4)}}); err != nil {
		t.Fatal(err)
	}
	recvUntil(t, b, vb, func(v map[string]uint32) bool { return v["w2/0"] == 4 && len(v) == 1 })

	// Decisions reach the other routers, not the one that made them.
	if err := b.Send(&kvindexv1.ReportRequest{RouterId: "b", Predicted: []*kvindexv1.PredictedPrefix{{Worker: "w0", Keys: []uint64{1, 2, 3}, TtlMs: 5000, RouterId: "b"}}}); err != nil {
		t.Fatal(err)
	}
	for {
		resp, err := a.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Predicted) == 1 && resp.Predicted[0].Worker == "w0" && len(resp.Predicted[0].Keys) == 3 {
			break
		}
	}

	// Bad first messages and missing tokens are refused, and a refused router
	// takes no slot: with --ledger-max-routers=3, a and b hold two, the refused
	// ones none, so c gets the third and d is refused as one too many.
	long := strings.Repeat("x", MaxNameBytes+1)
	for _, c := range []struct {
		name  string
		token string
		first *kvindexv1.ReportRequest
		code  codes.Code
	}{
		{"no token", "", &kvindexv1.ReportRequest{RouterId: "c", Full: true}, codes.Unauthenticated},
		{"not full", "ledger-secret", &kvindexv1.ReportRequest{RouterId: "c"}, codes.InvalidArgument},
		{"no id", "ledger-secret", &kvindexv1.ReportRequest{Full: true}, codes.InvalidArgument},
		{"long id", "ledger-secret", &kvindexv1.ReportRequest{RouterId: long, Full: true}, codes.InvalidArgument},
		{"unnamed worker", "ledger-secret", &kvindexv1.ReportRequest{RouterId: "bad-1", Full: true,
			Loads: []*kvindexv1.TargetLoad{load("w0", 1), {InFlight: 1}}}, codes.InvalidArgument},
		{"long worker", "ledger-secret", &kvindexv1.ReportRequest{RouterId: "bad-2", Full: true,
			Loads: []*kvindexv1.TargetLoad{load(long, 1)}}, codes.InvalidArgument},
		{"prediction without worker", "ledger-secret", &kvindexv1.ReportRequest{RouterId: "bad-3", Full: true,
			Predicted: []*kvindexv1.PredictedPrefix{{Keys: []uint64{1}}}}, codes.InvalidArgument},
		{"binding without key", "ledger-secret", &kvindexv1.ReportRequest{RouterId: "bad-4", Full: true,
			Sessions: []*kvindexv1.SessionBinding{{Worker: "w0"}}}, codes.InvalidArgument},
	} {
		s := ledgerStream(t, addr, c.token)
		s.Send(c.first)
		_, err := s.Recv()
		if status.Code(err) != c.code {
			t.Errorf("%s: %v, want %v", c.name, err, c.code)
		}
	}
	// The refused reports applied nothing (bad-1 listed a valid w0 first): c
	// sees a's w2 and b's w0 as they were.
	c := ledgerStream(t, addr, "ledger-secret")
	if err := c.Send(&kvindexv1.ReportRequest{RouterId: "c", Full: true, Loads: []*kvindexv1.TargetLoad{load("w3", 1)}}); err != nil {
		t.Fatal(err)
	}
	recvUntil(t, c, map[string]uint32{}, func(v map[string]uint32) bool { return v["w2/0"] == 4 && v["w0/0"] == 3 && len(v) == 2 })
	recvUntil(t, b, vb, func(v map[string]uint32) bool { return v["w2/0"] == 4 && v["w3/0"] == 1 && len(v) == 2 })
	if n := metric(t, "http://"+srv.HTTPAddr(), "kvindex_ledger_routers"); n != 3 {
		t.Errorf("kvindex_ledger_routers = %v, want 3 (a, b, c)", n)
	}
	d := ledgerStream(t, addr, "ledger-secret")
	d.Send(&kvindexv1.ReportRequest{RouterId: "d", Full: true})
	if _, err := d.Recv(); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("a fourth router with --ledger-max-routers=3: %v, want %v", err, codes.ResourceExhausted)
	}
}

// routerProc is an in-process router over real sockets.
type routerProc struct {
	r    *router.Router
	url  string
	stop func()
}

func startLedgerRouter(t *testing.T, id string, indexers []string, workers []workerspec.Spec) *routerProc {
	t.Helper()
	cfg := router.DefaultConfig()
	cfg.Listen = "127.0.0.1:0"
	cfg.Indexer = indexers
	cfg.IndexerToken = clusterToken
	cfg.IndexerTimeout = time.Second
	cfg.RouterID = id
	cfg.Workers = workers
	cfg.BlockSize = 4
	cfg.Policy = router.PolicyRoundRobin
	cfg.WorkersRefresh = 100 * time.Millisecond
	r, err := router.New(cfg, clusterLogger())
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx, l) }()
	p := &routerProc{r: r, url: "http://" + l.Addr().String(), stop: func() { cancel(); <-done }}
	t.Cleanup(p.stop)
	return p
}

// metric reads one unlabelled-or-summed value of a /metrics page whose line
// starts with prefix.
func metric(t *testing.T, url, prefix string) float64 {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	total := 0.0
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, prefix) {
			var v float64
			fmt.Sscan(line[strings.LastIndexByte(line, ' ')+1:], &v)
			total += v
		}
	}
	return total
}

// Three routers route through a three-node indexer cluster; the leader is killed
// mid-run. No request fails, and the new leader's ledger, rebuilt from the
// routers' full reports, equals their live reservations.
func TestLedgerSurvivesLeaderKill(t *testing.T) {
	c := makeCluster(t, 3, nil)
	var workers []workerspec.Spec
	for i := range 2 {
		ec := fakeenginetest.Config()
		ec.Faults.HangBeforeFirstToken = 4 * time.Second
		e := fakeenginetest.Start(t, ec)
		workers = append(workers, workerspec.Spec{ID: fmt.Sprintf("w%d", i), Model: ec.Model, BlockSize: 4, HTTP: e.URL()})
	}
	var addrs []string
	for _, cn := range c.nodes {
		addrs = append(addrs, cn.srv.GRPCAddr())
	}
	var routers []*routerProc
	for i := range 3 {
		routers = append(routers, startLedgerRouter(t, fmt.Sprintf("r%d", i), addrs, workers))
	}
	for _, rp := range routers {
		waitForCond(t, 20*time.Second, "routers on the ledger", func() bool { return metric(t, rp.url, "kvindex_router_ledger_connected") == 1 })
	}
	// A follower holds no ledger: it answers a stream with the not-leader error
	// naming the leader's address, which the routers follow.
	for _, fn := range c.followers(c.leader(10 * time.Second)) {
		waitForCond(t, 10*time.Second, fn.id+" to send a ledger stream to the leader", func() bool {
			s := ledgerStream(t, fn.srv.GRPCAddr(), clusterToken)
			s.Send(&kvindexv1.ReportRequest{RouterId: "probe", Full: true})
			_, err := s.Recv()
			addr, ok := kvindex.NotLeader(err)
			return ok && addr == c.leader(10*time.Second).srv.GRPCAddr()
		})
	}
	model := workers[0].Model
	var wg sync.WaitGroup
	var failed sync.Map
	send := func(i int) {
		defer wg.Done()
		resp, err := http.Post(routers[i%3].url+"/v1/completions", "application/json",
			strings.NewReader(fmt.Sprintf(`{"model":%q,"prompt":"request %d","max_tokens":1}`, model, i)))
		if err != nil {
			failed.Store(i, err.Error())
			return
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			failed.Store(i, resp.Status)
		}
	}
	for i := range 6 {
		wg.Add(1)
		go send(i)
	}
	old := c.leader(10 * time.Second)
	c.kill(old)
	for i := 6; i < 12; i++ {
		wg.Add(1)
		go send(i)
	}
	leader := c.leader(20 * time.Second)
	// The routers' own live counts, and the new leader's view of them.
	routersSay := func() map[string]int64 {
		out := map[string]int64{}
		for _, rp := range routers {
			for _, w := range workers {
				out[w.ID] += int64(metric(t, rp.url, `kvindex_router_worker_inflight{scope="local",worker="`+w.ID+`"}`))
			}
		}
		return out
	}
	leaderSays := func() map[string]int64 {
		l := leader.srv.api.ledger
		l.mu.Lock()
		defer l.mu.Unlock()
		out := map[string]int64{}
		for _, w := range workers {
			out[w.ID] = l.total[ledgerTarget{w.ID, 0}].inFlight
		}
		return out
	}
	waitForCond(t, 10*time.Second, "the new leader's ledger to equal the routers' reservations", func() bool {
		r, l := routersSay(), leaderSays()
		return fmt.Sprint(r) == fmt.Sprint(l) && r["w0"]+r["w1"] > 0
	})
	wg.Wait()
	failed.Range(func(k, v any) bool {
		t.Errorf("request %v failed: %v", k, v)
		return true
	})
	for _, rp := range routers {
		if n := metric(t, rp.url, "kvindex_router_ledger_rebuild_seconds_count"); n < 1 {
			t.Errorf("%s: no ledger rebuild measured after the leader died", rp.url)
		}
	}
}

func waitForCond(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A router reaches an indexer served over mutual TLS (--indexer-tls-*): its
// queries are answered and its ledger stream is up; without the CA it is not.
func TestRouterOverMutualTLS(t *testing.T) {
	pki := newTestPKI(t)
	f := newMutualTLSFixture(t, pki)
	var workers []workerspec.Spec
	for name, e := range f.engines {
		workers = append(workers, workerspec.Spec{ID: name, Model: e.Config().Model, BlockSize: 4, HTTP: e.URL()})
	}
	start := func(secure bool) *routerProc {
		cfg := router.DefaultConfig()
		cfg.Listen = "127.0.0.1:0"
		cfg.Indexer = []string{f.srv.GRPCAddr()}
		cfg.IndexerTimeout = 2 * time.Second
		if secure {
			cfg.IndexerTLSCA, cfg.IndexerTLSCert, cfg.IndexerTLSKey = pki.caFile, pki.peerCert, pki.peerKey
		}
		cfg.Workers = workers
		cfg.BlockSize = 4
		r, err := router.New(cfg, clusterLogger())
		if err != nil {
			t.Fatal(err)
		}
		l, err := net.Listen("tcp", cfg.Listen)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- r.Run(ctx, l) }()
		p := &routerProc{r: r, url: "http://" + l.Addr().String(), stop: func() { cancel(); <-done }}
		t.Cleanup(p.stop)
		return p
	}
	rp := start(true)
	waitForCond(t, 20*time.Second, "the router's ledger over TLS", func() bool { return metric(t, rp.url, "kvindex_router_ledger_connected") == 1 })
	model := workers[0].Model
	for i := range 2 {
		resp, err := http.Post(rp.url+"/v1/completions", "application/json", strings.NewReader(fmt.Sprintf(`{"model":%q,"prompt":"over tls %d","max_tokens":1}`, model, i)))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	if up := metric(t, rp.url, "kvindex_router_indexer_up"); up != 1 {
		t.Errorf("indexer_up = %v over TLS, want 1", up)
	}
	if n := metric(t, rp.url, `kvindex_router_indexer_query_seconds_count{result="ok"}`); n < 1 {
		t.Errorf("no indexer query answered over TLS")
	}
	// Without TLS settings the router cannot talk to it (and says so), yet serves.
	plain := start(false)
	resp, err := http.Post(plain.url+"/v1/completions", "application/json", strings.NewReader(fmt.Sprintf(`{"model":%q,"prompt":"plain","max_tokens":1}`, model)))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("a router that cannot reach the indexer answered %s; it must route on its own", resp.Status)
	}
	if metric(t, plain.url, "kvindex_router_ledger_connected") != 0 || metric(t, plain.url, `kvindex_router_indexer_query_seconds_count{result="ok"}`) != 0 {
		t.Errorf("a plaintext router talked to the TLS indexer")
	}
	if s := metric(t, plain.url, "kvindex_router_ledger_staleness_seconds"); s != -1 {
		t.Errorf("kvindex_router_ledger_staleness_seconds = %v without the ledger, want -1", s)
	}
}

// The predictions queued for a router that does not take them (a slow or
// vanished stream) are bounded in number and in keys; the newest stay, in order.
func TestLedgerBoundsQueuedPredictions(t *testing.T) {
	m, err := newLedgerMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name      string
		n, keys   int // predictions sent, keys each
		wantCount int
	}{
		{"few keys: the count bound", kvindexv1.LedgerMaxQueued + 100, 4, kvindexv1.LedgerMaxQueued},
		{"long prompts: the key bound", 40, kvindexv1.LedgerMaxPredictionKeys, kvindexv1.LedgerMaxQueuedKeys / kvindexv1.LedgerMaxPredictionKeys},
		{"under both", 10, 100, 10},
	} {
		t.Run(c.name, func(t *testing.T) {
			l := newLoadLedger(time.Minute, time.Millisecond, 4, m, clusterLogger())
			for i, id := range []string{"slow", "sender"} {
				if err := l.open(&kvindexv1.ReportRequest{RouterId: id, Full: true}, uint64(i+1)); err != nil {
					t.Fatal(err)
				}
			}
			for i := range c.n { // one prediction a report, as a router sends them
				keys := make([]uint64, c.keys)
				keys[0] = uint64(i)
				p := &kvindexv1.PredictedPrefix{Worker: "w0", Keys: keys, TtlMs: 3_600_000, RouterId: "sender"}
				if err := l.report("sender", 2, &kvindexv1.ReportRequest{RouterId: "sender", Predicted: []*kvindexv1.PredictedPrefix{p}}); err != nil {
					t.Fatal(err)
				}
			}
			// A push carries a message's worth (ledgerq.Take), the next ones the rest.
			var predicted []*kvindexv1.PredictedPrefix
			for range c.wantCount {
				resp, _, _, _ := l.view("slow", 1, nil)
				if len(resp.Predicted) == 0 {
					break
				}
				predicted = append(predicted, resp.Predicted...)
			}
			if len(predicted) != c.wantCount {
				t.Fatalf("%d predictions queued, want %d", len(predicted), c.wantCount)
			}
			for i, p := range predicted {
				if want := uint64(c.n - c.wantCount + i); p.Keys[0] != want {
					t.Fatalf("queued prediction %d is #%d, want #%d (the newest, in order)", i, p.Keys[0], want)
				}
			}
			if resp, _, _, _ := l.view("slow", 1, nil); len(resp.Predicted) != 0 {
				t.Errorf("%d predictions again after the router took them", len(resp.Predicted))
			}
		})
	}
}

// A router that reconnects within its lease gets the decisions the others made
// meanwhile with what is left of their TTLs, not the TTLs they were sent with,
// and not those that ran out.
func TestLedgerHandsOnWhatIsLeftOfEachTTL(t *testing.T) {
	m, err := newLedgerMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	l := newLoadLedger(time.Minute, time.Millisecond, 4, m, clusterLogger())
	now := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
	l.now = func() time.Time { return now }
	for i, id := range []string{"away", "sender"} {
		if err := l.open(&kvindexv1.ReportRequest{RouterId: id, Full: true}, uint64(i+1)); err != nil {
			t.Fatal(err)
		}
	}
	l.close("away", 1) // its stream is gone; the lease keeps it a minute
	for _, ttl := range []uint32{5000, 20000} {
		rep := &kvindexv1.ReportRequest{RouterId: "sender",
			Predicted: []*kvindexv1.PredictedPrefix{{Worker: "w0", Keys: []uint64{uint64(ttl)}, TtlMs: ttl, RouterId: "sender"}},
			Sessions:  []*kvindexv1.SessionBinding{{Key: fmt.Sprint(ttl), Worker: "w0", TtlMs: ttl}}}
		if err := l.report("sender", 2, rep); err != nil {
			t.Fatal(err)
		}
	}
	now = now.Add(8 * time.Second)
	if err := l.open(&kvindexv1.ReportRequest{RouterId: "away", Full: true}, 3); err != nil {
		t.Fatal(err)
	}
	// The stream the router left (its session 1) may live on until keepalive
	// ends it: it must end now, without taking the new stream's messages.
	if _, _, _, err := l.view("away", 1, nil); !errors.Is(err, ErrFailedPrecondition) {
		t.Fatalf("the replaced stream's view: %v, want FailedPrecondition", err)
	}
	resp, _, _, err := l.view("away", 3, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Predicted) != 1 || resp.Predicted[0].Keys[0] != 20000 || resp.Predicted[0].TtlMs != 12000 {
		t.Errorf("predictions after 8 s away: %v, want only the 20 s one with 12000 ms left", resp.Predicted)
	}
	if len(resp.Sessions) != 1 || resp.Sessions[0].Key != "20000" || resp.Sessions[0].TtlMs != 12000 {
		t.Errorf("bindings after 8 s away: %v, want only the 20 s one with 12000 ms left", resp.Sessions)
	}
}

// TestLedgerTokenOpensOnlyTheLedger: with --ledger-token, a router holding it
// shares load through LoadService as one holding the admin token does, while
// every admin call refuses it (PERMISSION_DENIED / 403) before doing anything;
// a wrong token opens LoadService no more than no token does.
func TestLedgerTokenOpensOnlyTheLedger(t *testing.T) {
	cfg := testConfig(t)
	cfg.AdminToken, cfg.LedgerToken = adminToken, ledgerToken
	srv := runServer(t, cfg)
	addr := srv.GRPCAddr()
	waitForCond(t, 20*time.Second, "the node to lead", func() bool { return srv.node.IsLeader() && srv.backend.Ready() == nil })

	// One router on the ledger token, one still on the admin token: each sees the other's load.
	a, b := ledgerStream(t, addr, ledgerToken), ledgerStream(t, addr, adminToken)
	if err := a.Send(&kvindexv1.ReportRequest{RouterId: "a", Full: true, Loads: []*kvindexv1.TargetLoad{{Worker: "w0", InFlight: 2}}}); err != nil {
		t.Fatal(err)
	}
	if err := b.Send(&kvindexv1.ReportRequest{RouterId: "b", Full: true, Loads: []*kvindexv1.TargetLoad{{Worker: "w1", InFlight: 5}}}); err != nil {
		t.Fatal(err)
	}
	recvUntil(t, a, map[string]uint32{}, func(v map[string]uint32) bool { return v["w1/0"] == 5 && len(v) == 1 })
	recvUntil(t, b, map[string]uint32{}, func(v map[string]uint32) bool { return v["w0/0"] == 2 && len(v) == 1 })

	for _, c := range []struct {
		token string
		code  codes.Code
	}{{"wrong", codes.PermissionDenied}, {"", codes.Unauthenticated}} {
		s := ledgerStream(t, addr, c.token)
		s.Send(&kvindexv1.ReportRequest{RouterId: "c", Full: true})
		if _, err := s.Recv(); status.Code(err) != c.code {
			t.Errorf("LoadService with token %q: %v, want %v", c.token, err, c.code)
		}
	}

	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+ledgerToken)
	admin := kvindexv1.NewAdminServiceClient(cc)
	for _, c := range []struct {
		name string
		call func() error
	}{
		{"RegisterWorker", func() error {
			_, err := admin.RegisterWorker(ctx, &kvindexv1.RegisterWorkerRequest{Worker: &kvindexv1.WorkerSpec{
				Id: "w-new", Model: testModel, BlockSize: 4, EventsEndpoint: "tcp://127.0.0.1:1"}})
			return err
		}},
		{"UnregisterWorker", func() error {
			_, err := admin.UnregisterWorker(ctx, &kvindexv1.UnregisterWorkerRequest{WorkerId: "w-none"})
			return err
		}},
		{"Join", func() error {
			_, err := admin.Join(ctx, &kvindexv1.JoinRequest{NodeId: "b", RaftAddr: "127.0.0.1:1"})
			return err
		}},
		{"Snapshot", func() error {
			_, err := admin.Snapshot(ctx, &kvindexv1.SnapshotRequest{})
			return err
		}},
		{"ForwardEvents", func() error {
			s, err := kvindexv1.NewMemberServiceClient(cc).ForwardEvents(ctx)
			if err != nil {
				return err
			}
			// io.EOF: the server ended the stream already; CloseAndRecv says how.
			if err := s.Send(&kvindexv1.ForwardEventsRequest{}); err != nil && !errors.Is(err, io.EOF) {
				return err
			}
			_, err = s.CloseAndRecv()
			return err
		}},
	} {
		if err := c.call(); status.Code(err) != codes.PermissionDenied {
			t.Errorf("%s with the ledger token: %v, want %v", c.name, err, codes.PermissionDenied)
		}
	}
	req, err := http.NewRequest("POST", "http://"+srv.HTTPAddr()+"/register",
		strings.NewReader(`{"instance_id": "w-rest", "model_name": "`+testModel+`", "endpoint": "tcp://127.0.0.1:1"}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+ledgerToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("POST /register with the ledger token = %d %s, want 403", resp.StatusCode, body)
	}
}

// realKeys are n block keys as xxh3 makes them: 64-bit values, most 10 bytes
// as varints.
func realKeys(seed, n int) []uint64 {
	keys := make([]uint64, n)
	for i := range keys {
		keys[i] = 0x9E3779B97F4A7C15*uint64(seed*n+i+1) | 1<<63
	}
	return keys
}

// fullOfLongPrompts fills q with the longest predictions up to its key bound,
// as a router's outbox or the leader's queue for a router is after an outage.
func fullOfLongPrompts(q *ledgerq.Queue, router string, ttl time.Duration) {
	for i := range kvindexv1.LedgerMaxQueuedKeys / kvindexv1.LedgerMaxPredictionKeys {
		q.AddPredicted(time.Now(), &kvindexv1.PredictedPrefix{Worker: "w0", Keys: realKeys(i, kvindexv1.LedgerMaxPredictionKeys),
			TtlMs: ledgerq.TTLMs(ttl), RouterId: router})
	}
}

// recvKeys reads pushes until they have carried want predicted keys, for at most
// 20 s.
func recvKeys(t *testing.T, s kvindexv1.LoadService_ReportClient, want int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	got := 0
	for got < want {
		if time.Now().After(deadline) {
			t.Fatalf("%d predicted keys of %d arrived in 20 s", got, want)
		}
		resp, err := s.Recv()
		if err != nil {
			t.Fatalf("after %d predicted keys of %d: %v (code %v)", got, want, err, status.Code(err))
		}
		for _, p := range resp.Predicted {
			got += len(p.Keys)
		}
	}
	if got != want {
		t.Fatalf("%d predicted keys arrived, want %d", got, want)
	}
}

// A router's outbox after an outage holds up to LedgerMaxQueuedKeys keys, far
// over --max-body-bytes in one message: sent as the router sends it, a message
// of at most LedgerMaxMessageBytes of decisions after another, the leader takes
// all of it and hands all of it on.
func TestLedgerAcceptsAFullOutbox(t *testing.T) {
	cfg := testConfig(t)
	srv := runServer(t, cfg)
	waitForCond(t, 20*time.Second, "the node to lead", func() bool { return srv.node.IsLeader() && srv.backend.Ready() == nil })
	other := ledgerStream(t, srv.GRPCAddr(), "")
	s := ledgerStream(t, srv.GRPCAddr(), "")
	for id, st := range map[string]kvindexv1.LoadService_ReportClient{"other": other, "r": s} {
		if err := st.Send(&kvindexv1.ReportRequest{RouterId: id, Full: true}); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Recv(); err != nil {
			t.Fatal(err)
		}
	}
	var outbox ledgerq.Queue
	fullOfLongPrompts(&outbox, "r", time.Minute)
	for more := true; more; {
		rep := &kvindexv1.ReportRequest{RouterId: "r"}
		rep.Predicted, rep.Sessions, more = outbox.Take(time.Now())
		if size := proto.Size(rep); size > int(cfg.MaxBodyBytes) {
			t.Fatalf("a report of %d bytes from the outbox, over --max-body-bytes %d", size, cfg.MaxBodyBytes)
		}
		if err := s.Send(rep); err != nil {
			t.Fatalf("the leader ended the stream on a report from a router's outbox: %v", recvErr(s))
		}
	}
	recvKeys(t, other, kvindexv1.LedgerMaxQueuedKeys)
}

// recvErr is the stream's error after a failed Send.
func recvErr(s kvindexv1.LoadService_ReportClient) error {
	for {
		if _, err := s.Recv(); err != nil {
			return err
		}
	}
}

// The leader's queue for a router reconnecting within its lease may hold
// LedgerMaxQueuedKeys keys; the router dials with gRPC's default receive limit
// (4 MiB), and it receives all of them, a push of at most
// LedgerMaxMessageBytes of decisions after another.
func TestLedgerRouterCanTakeTheLeadersQueue(t *testing.T) {
	cfg := testConfig(t)
	srv := runServer(t, cfg)
	addr := srv.GRPCAddr()
	waitForCond(t, 20*time.Second, "the node to lead", func() bool { return srv.node.IsLeader() && srv.backend.Ready() == nil })
	// "away" as the router dials (router/ledger_client.go conn).
	cc, err := grpc.NewClient(addr, append(kvindexv1.FlowControlDialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx1, cancel1 := context.WithCancel(context.Background())
	away, err := kvindexv1.NewLoadServiceClient(cc).Report(ctx1)
	if err != nil {
		t.Fatal(err)
	}
	away.Send(&kvindexv1.ReportRequest{RouterId: "away", Full: true})
	if _, err := away.Recv(); err != nil {
		t.Fatal(err)
	}
	sender := ledgerStream(t, addr, "")
	sender.Send(&kvindexv1.ReportRequest{RouterId: "sender", Full: true})
	if _, err := sender.Recv(); err != nil {
		t.Fatal(err)
	}
	cancel1() // away's stream drops; its lease (10 s) keeps its queue
	waitForCond(t, 5*time.Second, "away's stream to close", func() bool {
		srv.api.ledger.mu.Lock()
		defer srv.api.ledger.mu.Unlock()
		return srv.api.ledger.routers["away"] != nil && srv.api.ledger.routers["away"].session == 0
	})
	for i := range kvindexv1.LedgerMaxQueuedKeys / kvindexv1.LedgerMaxPredictionKeys { // one decision a report
		p := &kvindexv1.PredictedPrefix{Worker: "w0", Keys: realKeys(i, kvindexv1.LedgerMaxPredictionKeys), TtlMs: 60_000, RouterId: "sender"}
		if err := sender.Send(&kvindexv1.ReportRequest{RouterId: "sender", Predicted: []*kvindexv1.PredictedPrefix{p}}); err != nil {
			t.Fatal(err)
		}
	}
	waitForCond(t, 10*time.Second, "away's queue to fill", func() bool {
		srv.api.ledger.mu.Lock()
		defer srv.api.ledger.mu.Unlock()
		return srv.api.ledger.routers["away"].queue.Keys() == kvindexv1.LedgerMaxQueuedKeys
	})
	again, err := kvindexv1.NewLoadServiceClient(cc).Report(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	again.Send(&kvindexv1.ReportRequest{RouterId: "away", Full: true})
	recvKeys(t, again, kvindexv1.LedgerMaxQueuedKeys)
}

// Partial reports may not add up to more targets than one report may list:
// that bounds what one router makes the leader hold. A report that would go
// over is refused whole; one that replaces targets within the bound is not.
func TestLedgerTargetsPerRouterBounded(t *testing.T) {
	m, _ := newLedgerMetrics(nil)
	l := newLoadLedger(time.Minute, time.Millisecond, 4, m, clusterLogger())
	if err := l.open(&kvindexv1.ReportRequest{RouterId: "r", Full: true}, 1); err != nil {
		t.Fatal(err)
	}
	batch := func(b int, inFlight uint32) *kvindexv1.ReportRequest {
		loads := make([]*kvindexv1.TargetLoad, maxLedgerTargetsPerReport)
		for i := range loads {
			loads[i] = &kvindexv1.TargetLoad{Worker: "w", DpRank: uint32(b*maxLedgerTargetsPerReport + i), InFlight: inFlight}
		}
		return &kvindexv1.ReportRequest{RouterId: "r", Loads: loads}
	}
	if err := l.report("r", 1, batch(0, 1)); err != nil {
		t.Fatal(err)
	}
	if err := l.report("r", 1, batch(1, 1)); !errors.Is(err, ErrInvalidArgument) || status.Code(grpcError(err)) != codes.InvalidArgument {
		t.Fatalf("a report taking a router to %d targets: %v, want INVALID_ARGUMENT", 2*maxLedgerTargetsPerReport, err)
	}
	if n := len(l.routers["r"].loads); n != maxLedgerTargetsPerReport || len(l.total) != n {
		t.Fatalf("after the refused report one router holds %d targets (%d in the total), want the %d it had",
			n, len(l.total), maxLedgerTargetsPerReport)
	}
	// Half the targets released, half of the next batch taken: within the bound.
	rep := batch(1, 1)
	rep.Loads = rep.Loads[:maxLedgerTargetsPerReport/2]
	rep.Loads = append(rep.Loads, batch(0, 0).Loads[:maxLedgerTargetsPerReport/2]...)
	if err := l.report("r", 1, rep); err != nil {
		t.Fatalf("a report moving load within the bound: %v", err)
	}
	if n := len(l.routers["r"].loads); n != maxLedgerTargetsPerReport {
		t.Fatalf("one router holds %d targets, want %d", n, maxLedgerTargetsPerReport)
	}
}

// The key bound bounds memory: a queued prediction does not keep its unknown
// fields, so 4096 queued predictions of no keys cannot each hold a whole
// --max-body-bytes.
func TestLedgerQueueBytesBounded(t *testing.T) {
	m, _ := newLedgerMetrics(nil)
	l := newLoadLedger(time.Minute, time.Millisecond, 4, m, clusterLogger())
	for i, id := range []string{"slow", "sender"} {
		if err := l.open(&kvindexv1.ReportRequest{RouterId: id, Full: true}, uint64(i+1)); err != nil {
			t.Fatal(err)
		}
	}
	blob := protowire.AppendBytes(protowire.AppendTag(nil, 99, protowire.BytesType), make([]byte, 1<<20))
	for range 32 { // 32 reports; an attacker could send 4096 of 4 MiB each
		p := &kvindexv1.PredictedPrefix{Worker: "w0", TtlMs: 3_600_000, RouterId: "sender"}
		p.ProtoReflect().SetUnknown(blob)
		if err := l.report("sender", 2, &kvindexv1.ReportRequest{RouterId: "sender", Predicted: []*kvindexv1.PredictedPrefix{p}}); err != nil {
			t.Fatal(err)
		}
	}
	resp, _, _, _ := l.view("slow", 1, nil)
	if size := proto.Size(resp); len(resp.Predicted) != 32 || size > 32*64 {
		t.Fatalf("the leader held %d bytes for %d predictions of no keys", size, len(resp.Predicted))
	}
}

// Leases expire on a timer, not only when a stream calls open or view: a leader
// whose routers are all gone forgets them after the lease.
func TestLedgerLeaseExpiresWithoutStreams(t *testing.T) {
	cfg := testConfig(t)
	cfg.LedgerLease = 100 * time.Millisecond
	srv := runServer(t, cfg)
	waitForCond(t, 20*time.Second, "the node to lead", func() bool { return srv.node.IsLeader() && srv.backend.Ready() == nil })
	s := ledgerStream(t, srv.GRPCAddr(), "")
	if err := s.Send(&kvindexv1.ReportRequest{RouterId: "gone", Full: true, Loads: []*kvindexv1.TargetLoad{{Worker: "w0", InFlight: 3}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Recv(); err != nil {
		t.Fatal(err)
	}
	s.CloseSend()
	waitForCond(t, 10*time.Second, "the lease to expire", func() bool {
		return labeled(t, srv, "kvindex_ledger_routers") == 0 && counter(t, srv, "kvindex_ledger_leases_expired_total") == 1
	})
	srv.api.ledger.mu.Lock()
	defer srv.api.ledger.mu.Unlock()
	if len(srv.api.ledger.routers)+len(srv.api.ledger.total) != 0 {
		t.Fatalf("after the lease the leader holds %d routers and load on %d targets", len(srv.api.ledger.routers), len(srv.api.ledger.total))
	}
}

// A node that does not lead holds no router (kvindex_ledger_routers says 0 on
// followers): once a stream has ended there, its router is dropped, lease or
// not, with its load and queue; an open stream (about to end with not-leader)
// keeps its router until it ends.
func TestLedgerSweepClearsANodeThatDoesNotLead(t *testing.T) {
	m, _ := newLedgerMetrics(nil)
	l := newLoadLedger(time.Hour, time.Millisecond, 4, m, slog.New(slog.DiscardHandler))
	for i, id := range []string{"closed", "open"} {
		if err := l.open(&kvindexv1.ReportRequest{RouterId: id, Full: true, Loads: []*kvindexv1.TargetLoad{{Worker: id, InFlight: 1}}}, uint64(i+1)); err != nil {
			t.Fatal(err)
		}
	}
	l.report("open", 2, &kvindexv1.ReportRequest{RouterId: "open", Predicted: []*kvindexv1.PredictedPrefix{{Worker: "w0", Keys: []uint64{1}, TtlMs: 60000}}})
	l.close("closed", 1)
	l.sweep(true) // leading, within the lease: nothing changes
	if n := testutil.ToFloat64(m.routers); n != 2 || len(l.routers) != 2 {
		t.Fatalf("a leader within the lease holds %d routers (gauge %v), want 2", len(l.routers), n)
	}
	l.sweep(false)
	if _, ok := l.routers["closed"]; ok || testutil.ToFloat64(m.routers) != 1 || testutil.ToFloat64(m.expired) != 1 || len(l.total) != 1 {
		t.Fatalf("after a sweep on a node that does not lead: routers %v (gauge %v, expired %v), load on %d targets; want only the open stream's",
			slices.Collect(maps.Keys(l.routers)), testutil.ToFloat64(m.routers), testutil.ToFloat64(m.expired), len(l.total))
	}
	l.close("open", 2)
	l.sweep(false)
	if len(l.routers)+len(l.total) != 0 || testutil.ToFloat64(m.routers) != 0 || testutil.ToFloat64(m.expired) != 2 {
		t.Fatalf("after the last stream ended on a node that does not lead: %d routers, load on %d targets, gauge %v, expired %v",
			len(l.routers), len(l.total), testutil.ToFloat64(m.routers), testutil.ToFloat64(m.expired))
	}
}

// longNamedLoads are n loads on targets with 250-byte worker names, from
// index first: 20,000 of them are over gRPC's 4 MiB on the wire.
func longNamedLoads(first, n int, inFlight uint32) []*kvindexv1.TargetLoad {
	loads := make([]*kvindexv1.TargetLoad, n)
	for i := range loads {
		loads[i] = &kvindexv1.TargetLoad{Worker: fmt.Sprintf("%0250d", first+i), InFlight: inFlight, DecodeBlocks: 7}
	}
	return loads
}

// A report whose loads are more than a message carries comes as several
// messages (ledgerq.SplitReport), and the leader applies it as it applies the
// same report in one message, once its last message has come: until then the
// router's load is what it was, so a part of a full report is not taken for
// the whole (which would clear, for a push or more, every target the other
// parts list), and a full one still clears the targets it does not list. A
// stream that ends in the middle of a report leaves the load as it was; a
// report whose messages list more targets than one report may, or a full one
// beginning before the last message of the one before, is refused and
// changes nothing.
func TestLedgerAppliesASplitReportWhole(t *testing.T) {
	m, _ := newLedgerMetrics(nil)
	split := newLoadLedger(time.Minute, time.Millisecond, 4, m, clusterLogger())
	wm, _ := newLedgerMetrics(nil)
	whole := newLoadLedger(time.Minute, time.Millisecond, 4, wm, clusterLogger()) // every report in one message
	held := func(l *loadLedger) map[ledgerTarget]ledgerLoad {
		l.mu.Lock()
		defer l.mu.Unlock()
		if !maps.Equal(l.total, l.routers["a"].loads) {
			t.Fatalf("the total %d targets differs from the only router's %d", len(l.total), len(l.routers["a"].loads))
		}
		return maps.Clone(l.total)
	}
	start := &kvindexv1.ReportRequest{RouterId: "a", Full: true,
		Loads: append(longNamedLoads(0, 10, 1), &kvindexv1.TargetLoad{Worker: "gone", InFlight: 5})}
	for _, l := range []*loadLedger{split, whole} {
		if err := l.open(start, 1); err != nil {
			t.Fatal(err)
		}
	}
	steps := []struct {
		name    string
		rep     *kvindexv1.ReportRequest
		session uint64 // a new one: the report opens a reconnected stream
	}{
		{"a full report on a reconnect, without a target the router held", &kvindexv1.ReportRequest{RouterId: "a", Full: true,
			Loads: longNamedLoads(5, 20_000, 2)}, 2},
		{"changes: some cleared, some raised, some new", &kvindexv1.ReportRequest{RouterId: "a",
			Loads: slices.Concat(longNamedLoads(0, 8_000, 0), longNamedLoads(8_000, 8_000, 3), longNamedLoads(30_000, 8_000, 4))}, 0},
		{"a full report on the same stream", &kvindexv1.ReportRequest{RouterId: "a", Full: true,
			Loads: longNamedLoads(40_000, 20_000, 1)}, 0},
	}
	session := uint64(1)
	for _, st := range steps {
		msgs := ledgerq.SplitReport(st.rep)
		if len(msgs) < 5 {
			t.Fatalf("%s: went as %d messages; the test wants it over 4 MiB", st.name, len(msgs))
		}
		before := held(split)
		for i, msg := range msgs {
			var err error
			if i == 0 && st.session != 0 {
				session = st.session
				err = split.open(msg, session)
			} else {
				err = split.report("a", session, msg)
			}
			if err != nil {
				t.Fatalf("%s: message %d of %d: %v", st.name, i, len(msgs), err)
			}
			if i < len(msgs)-1 && !maps.Equal(held(split), before) {
				t.Fatalf("%s: the load changed after message %d of %d", st.name, i, len(msgs))
			}
		}
		var err error
		if st.session != 0 {
			err = whole.open(st.rep, st.session)
		} else {
			err = whole.report("a", session, st.rep)
		}
		if err != nil {
			t.Fatalf("%s in one message: %v", st.name, err)
		}
		if got, want := held(split), held(whole); !maps.Equal(got, want) {
			t.Fatalf("%s: split, the leader holds load on %d targets; in one message, on %d (or other values)", st.name, len(got), len(want))
		}
	}
	if _, ok := held(split)[ledgerTarget{"gone", 0}]; ok {
		t.Fatal("a target the full report did not list still holds load")
	}
	if n, want := testutil.ToFloat64(m.reports), float64(1+len(steps)); n != want {
		t.Fatalf("kvindex_ledger_reports_total = %v, want %v: it counts reports, not their messages", n, want)
	}

	// What is refused, and a stream that ends in the middle of a report,
	// change nothing.
	before := held(split)
	msgs := ledgerq.SplitReport(&kvindexv1.ReportRequest{RouterId: "a", Full: true, Loads: longNamedLoads(0, 20_000, 9)})
	if err := split.open(msgs[0], 3); err != nil {
		t.Fatal(err)
	}
	split.close("a", 3)
	if !maps.Equal(held(split), before) {
		t.Fatal("the first message of a full report, its stream ended, changed the load")
	}
	half := &kvindexv1.ReportRequest{RouterId: "a", Full: true, More: true, Loads: longNamedLoads(0, maxLedgerTargetsPerReport/2+1, 9)}
	for _, c := range []struct {
		name string
		msgs []*kvindexv1.ReportRequest
	}{
		{"more targets over its messages than one report may list", []*kvindexv1.ReportRequest{half,
			{RouterId: "a", Loads: longNamedLoads(maxLedgerTargetsPerReport, maxLedgerTargetsPerReport/2+1, 9)}}},
		{"a full report before the last message of the one before", []*kvindexv1.ReportRequest{half,
			{RouterId: "a", Full: true, Loads: longNamedLoads(0, 1, 9)}}},
	} {
		session++
		if err := split.open(c.msgs[0], session); err != nil {
			t.Fatal(err)
		}
		err := split.report("a", session, c.msgs[1])
		if !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%s: %v, want INVALID_ARGUMENT", c.name, err)
		}
		split.close("a", session)
		if !maps.Equal(held(split), before) {
			t.Fatalf("%s: the refused report changed the load", c.name)
		}
	}
}
