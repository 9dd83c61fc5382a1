package router

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	kvindexv1 "github.com/kvindex/kvindex/api/proto/kvindex/v1"
	"github.com/kvindex/kvindex/bench/fakeengine"
	"github.com/kvindex/kvindex/internal/server"
)

// startRouters starts n routers on the fleet sharing one indexer's ledger.
func startRouters(t *testing.T, n int, f *fleet, ix *indexer, configure func(*Config)) []*testRouter {
	var rs []*testRouter
	for i := range n {
		cfg := testConfig(t, f)
		cfg.Indexer = []string{ix.addr}
		cfg.IndexerTimeout = time.Second
		cfg.RouterID = fmt.Sprintf("router-%d", i)
		if configure != nil {
			configure(&cfg)
		}
		rs = append(rs, startRouter(t, cfg))
	}
	for _, r := range rs {
		waitFor(t, 20*time.Second, r.cfg.RouterID+" to join the ledger", func() bool { return r.shared.connected.Load() })
	}
	return rs
}

// sumLocal is every router's own in-flight count on t.
func sumLocal(rs []*testRouter, t Target) int {
	n := 0
	for _, r := range rs {
		n += r.ledger.Load(t).InFlight
	}
	return n
}

// Three routers in front of one fleet, requests sprayed over them: each router's
// fleet-wide in-flight count per worker equals the sum of the three routers' own
// counts (within a push interval, so polled), in decisions and in the
// scope="fleet" gauge; and back to zero when the requests end.
func TestRoutersShareTheirLoad(t *testing.T) {
	f := startFleet(t, 3, func(_ int, c *fakeengine.Config) { c.Faults.HangBeforeFirstToken = 2 * time.Second })
	ix := startIndexer(t, f)
	rs := startRouters(t, 3, f, ix, func(c *Config) { c.Policy = PolicyRoundRobin })
	var wg sync.WaitGroup
	for i := range 7 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if code, _, raw := postAside(t, rs[i%3].url, "/v1/completions", completionBody(fmt.Sprintf("spray %d", i), 1)); code != http.StatusOK {
				t.Errorf("request %d: %d %s", i, code, raw)
			}
		}()
	}
	targets := []Target{{Worker: "w0"}, {Worker: "w1"}, {Worker: "w2"}}
	waitFor(t, 10*time.Second, "all 7 requests in flight", func() bool {
		n := 0
		for _, tg := range targets {
			n += sumLocal(rs, tg)
		}
		return n == 7
	})
	for _, r := range rs {
		waitFor(t, 5*time.Second, r.cfg.RouterID+"'s fleet view to equal the routers' sum", func() bool {
			for _, tg := range targets {
				if r.loadOf(tg).InFlight != sumLocal(rs, tg) {
					return false
				}
				if g := testutil.ToFloat64(r.metrics.inflight.WithLabelValues(tg.Worker, "fleet")); int(g) != sumLocal(rs, tg) {
					// the gauge is refreshed at scrape time
					if _, err := r.reg.Gather(); err != nil {
						t.Fatal(err)
					}
					return false
				}
			}
			return true
		})
	}
	// Each router counts three on the ledger and uses a view of some age; so
	// does the leader.
	for _, r := range rs {
		if n := testutil.ToFloat64(r.metrics.ledgerRouters); n != 3 {
			t.Errorf("%s: kvindex_router_ledger_routers = %v, want 3", r.cfg.RouterID, n)
		}
		if s := r.shared.staleness(); s < 0 {
			t.Errorf("%s: ledger staleness %v while connected, want >= 0", r.cfg.RouterID, s)
		}
	}
	if n := counterValue(t, ix, "kvindex_ledger_routers"); n != 3 {
		t.Errorf("the leader's kvindex_ledger_routers = %v, want 3", n)
	}
	wg.Wait()
	for _, r := range rs {
		waitFor(t, 5*time.Second, r.cfg.RouterID+"'s fleet view to empty", func() bool {
			for _, tg := range targets {
				if r.loadOf(tg).InFlight != 0 {
					return false
				}
			}
			return true
		})
	}
}

// A router with load on more targets than one message carries (20,000 with
// long names: its whole state, and the leader's whole view of it, are over
// the 4 MiB gRPC receives) shares it as it shares a few: taken while the
// indexer was down, the router re-sends it whole when the indexer is back,
// the leader pushes it whole to the other router, whose view then equals the
// reservations, and loses the targets released.
func TestRoutersShareALoadListOverAMessage(t *testing.T) {
	f := startFleet(t, 1, nil)
	ix := startIndexer(t, f)
	rs := startRouters(t, 2, f, ix, nil)
	ix.stop()
	waitFor(t, 20*time.Second, "the routers to lose the ledger", func() bool {
		return !rs[0].shared.connected.Load() && !rs[1].shared.connected.Load()
	})
	targets := make([]Target, 20_000)
	held := make([]*Reservation, len(targets))
	for i := range targets {
		targets[i] = Target{Worker: fmt.Sprintf("%0250d", i), Rank: uint32(i % 4)}
		held[i] = rs[0].ledger.Reserve(targets[i], Demand{Keys: []uint64{uint64(i)}, BlockSize: 4, PromptTokens: 6, Prefill: true})
	}
	seesRouter0 := func() bool {
		if !rs[1].shared.connected.Load() {
			return false
		}
		for _, tg := range targets {
			if rs[1].shared.remoteLoad(tg) != rs[0].ledger.Load(tg) {
				return false
			}
		}
		return true
	}
	ix.start(t)
	waitFor(t, 30*time.Second, "router 1 to see router 0's load on every target", seesRouter0)
	if rs[1].shared.remoteLoad(targets[len(targets)-1]).InFlight != 1 {
		t.Fatal("router 1's view is empty")
	}
	for _, r := range held[:len(held)/2] {
		r.Release()
	}
	waitFor(t, 20*time.Second, "router 1 to see router 0's load on the targets it still holds, and none elsewhere", func() bool {
		return rs[0].ledger.Load(targets[0]) == (Load{}) && seesRouter0()
	})
}

// A burst of siblings entering through three routers lands on one worker: the
// routers share their decisions, so the second router already sees the first
// one's prediction for the prefix. Each sibling is sent once the previous one's
// decision has reached the other routers: how long that takes (a report and a
// push interval, more on a loaded machine) is the route bench's to measure, not
// a fixed sleep's to assume (a 60 ms spacing failed about one run in eight
// under load).
func TestBurstAcrossRoutersCoLocates(t *testing.T) {
	f := startFleet(t, 4, func(_ int, c *fakeengine.Config) { c.Faults.HangBeforeFirstToken = 5 * time.Second })
	ix := startIndexer(t, f)
	rs := startRouters(t, 3, f, ix, nil)
	prefix := words("burst-over-routers", 300)
	var wg sync.WaitGroup
	for i := range 8 {
		body := completionBody(fmt.Sprintf("%s sibling %d", prefix, i), 1)
		from := rs[i%3]
		wg.Add(1)
		go func() {
			defer wg.Done()
			if code, _, raw := postAside(t, from.url, "/v1/completions", body); code != http.StatusOK {
				t.Errorf("sibling %d: %d %s", i, code, raw)
			}
		}()
		// Every other router holds from's decision of this sibling (its
		// prediction, with the load it came with).
		for _, o := range rs {
			if o == from {
				continue
			}
			p, err := o.prepare(http.Header{}, "/v1/completions", endpointCompletions, []byte(body))
			if err != nil {
				t.Fatal(err)
			}
			targets := make([]Target, len(f.ids))
			for j, id := range f.ids {
				targets[j] = o.shared.others.target(Target{Worker: id}, from.cfg.RouterID)
			}
			matched := make([]int, len(targets))
			waitFor(t, 10*time.Second, fmt.Sprintf("%s to hear of sibling %d from %s", o.cfg.RouterID, i, from.cfg.RouterID), func() bool {
				o.shared.others.o.Match(p.route.Keys, targets, o.now(), matched, nil)
				return slices.Contains(matched, len(p.route.Keys))
			})
		}
	}
	wg.Wait()
	used := map[string]int{}
	for _, r := range rs {
		for _, id := range f.ids {
			used[id] += r.servedCount(id)
		}
	}
	busy := 0
	for _, n := range used {
		if n > 0 {
			busy++
		}
	}
	if busy != 1 {
		t.Errorf("the burst through three routers went to %d workers (%v), want 1", busy, used)
	}
}

// A session binding made by one router is honoured by the others: once router 0
// has routed a session, router 1's decision for the same session marks the
// worker router 0 chose as session-bound (kv-aware's session bonus); another
// session's decision marks none.
func TestSessionBindingAcrossRouters(t *testing.T) {
	f := startFleet(t, 3, nil)
	ix := startIndexer(t, f)
	rs := startRouters(t, 2, f, ix, nil)
	body := func(session, prompt string) string {
		return fmt.Sprintf(`{"model":%q,"prompt":%s,"max_tokens":1,"session_id":%q}`, testModel, quote(prompt), session)
	}
	bound := func(session string) []string {
		var ws []string
		for _, c := range dryRun(t, rs[1].url, body(session, "a later turn of "+session)).Candidates {
			if c.SessionBound {
				ws = append(ws, c.Worker)
			}
		}
		return ws
	}
	if ws := bound("conv-42"); len(ws) != 0 {
		t.Fatalf("router 1 binds conv-42 to %v before any request of it", ws)
	}
	w := rs[0].servedBy(t, f.ids, func() {
		if code, _, raw := post(t, rs[0].url, "/v1/completions", body("conv-42", "the first turn")); code != http.StatusOK {
			t.Fatalf("%d %s", code, raw)
		}
	})
	waitFor(t, 10*time.Second, "router 1 to honour router 0's binding of conv-42 to "+w, func() bool {
		ws := bound("conv-42")
		return len(ws) == 1 && ws[0] == w
	})
	if ws := bound("conv-7"); len(ws) != 0 {
		t.Errorf("router 1 binds conv-7, never routed, to %v", ws)
	}
}

// Other routers' decisions and bindings hold for the TTL they came with, not the
// receiver's: a peer (a router's stream, opened by the test) reports, in one
// report, a prediction and a binding with 60 s and the same with 0 s; the router
// uses the first two and not the others, which arrived with them.
func TestLedgerHonoursTheSendersTTL(t *testing.T) {
	f := startFleet(t, 3, nil)
	ix := startIndexer(t, f)
	r := startRouters(t, 1, f, ix, nil)[0]
	body := func(session, tag string) string {
		return fmt.Sprintf(`{"model":%q,"prompt":%s,"max_tokens":1,"session_id":%q}`, testModel, quote(words(tag, 64)), session)
	}
	keys := func(b string) []uint64 {
		p, err := r.prepare(http.Header{}, "/v1/completions", endpointCompletions, []byte(b))
		if err != nil {
			t.Fatal(err)
		}
		return p.route.Keys
	}
	live, expired := body("live", "live-prediction"), body("expired", "expired-prediction")

	cc, err := grpc.NewClient(ix.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	peer, err := kvindexv1.NewLoadServiceClient(cc).Report(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, rep := range []*kvindexv1.ReportRequest{
		{RouterId: "peer", Full: true},
		{RouterId: "peer", Predicted: []*kvindexv1.PredictedPrefix{
			{Worker: "w1", Keys: keys(live), TtlMs: 60_000, RouterId: "peer"},
			{Worker: "w2", Keys: keys(expired), TtlMs: 0, RouterId: "peer"},
		}, Sessions: []*kvindexv1.SessionBinding{
			{Key: "s:live", Worker: "w1", TtlMs: 60_000},
			{Key: "s:expired", Worker: "w2", TtlMs: 0},
		}},
	} {
		if err := peer.Send(rep); err != nil {
			t.Fatal(err)
		}
	}
	// held reports the workers the dry run finds bound to the session and with
	// a predicted overlap.
	held := func(b string) (bound, predicted []string) {
		for _, c := range dryRun(t, r.url, b).Candidates {
			if c.SessionBound {
				bound = append(bound, c.Worker)
			}
			if c.Overlap > 0 {
				predicted = append(predicted, c.Worker)
			}
		}
		return bound, predicted
	}
	waitFor(t, 10*time.Second, "the peer's 60 s prediction and binding to reach the router", func() bool {
		bound, predicted := held(live)
		return fmt.Sprint(bound, predicted) == "[w1] [w1]"
	})
	if bound, predicted := held(expired); len(bound)+len(predicted) != 0 {
		t.Errorf("the peer's 0 s binding and prediction still hold: bound to %v, predicted on %v", bound, predicted)
	}
}

var routerBinary struct {
	once sync.Once
	path string
	err  error
}

// buildRouter builds bin/router once per test binary, to run as a process that
// can be killed.
func buildRouter(t *testing.T) string {
	t.Helper()
	routerBinary.once.Do(func() {
		dir, err := os.MkdirTemp("", "kvindex-router-bin-")
		if err != nil {
			routerBinary.err = err
			return
		}
		routerBinary.path = filepath.Join(dir, "router")
		out, err := exec.Command("go", "build", "-o", routerBinary.path, "github.com/kvindex/kvindex/cmd/router").CombinedOutput()
		if err != nil {
			routerBinary.err = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if routerBinary.err != nil {
		t.Fatal(routerBinary.err)
	}
	return routerBinary.path
}

// A router killed -9 cannot report its load gone: the others keep counting it
// until its lease runs out on the leader, then stop.
func TestKilledRouterLoadExpiresWithItsLease(t *testing.T) {
	bin := buildRouter(t)
	f := startFleet(t, 2, func(_ int, c *fakeengine.Config) { c.Faults.HangBeforeFirstToken = time.Minute })
	ix := startIndexerWith(t, f, func(c *server.Config) { c.LedgerLease = 2 * time.Second })
	rs := startRouters(t, 1, f, ix, nil)
	survivor := rs[0]

	l, err := listenFree()
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"--listen", l, "--indexer", ix.addr, "--router-id", "doomed", "--block-size", "4", "--log-level", "warn"}
	for _, s := range f.specs(t) {
		args = append(args, "--worker", s.String())
	}
	cmd := exec.Command(bin, args...)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	waitFor(t, 20*time.Second, "the doomed router to serve", func() bool {
		resp, err := http.Get("http://" + l + "/readyz")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil && resp.StatusCode == http.StatusOK
	})
	for i := range 2 {
		go http.Post("http://"+l+"/v1/completions", "application/json", strings.NewReader(completionBody(fmt.Sprintf("doomed %d", i), 1)))
	}
	remote := func() int {
		return survivor.shared.remoteLoad(Target{Worker: "w0"}).InFlight + survivor.shared.remoteLoad(Target{Worker: "w1"}).InFlight
	}
	waitFor(t, 20*time.Second, "the survivor to see the doomed router's 2 requests", func() bool { return remote() == 2 })
	expired := func() float64 { return counterValue(t, ix, "kvindex_ledger_leases_expired_total") }
	before := expired()
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	waitFor(t, 30*time.Second, "the doomed router's load to expire", func() bool { return remote() == 0 })
	if got := expired() - before; got != 1 {
		t.Errorf("leases expired = %v, want 1 (the load must go by the lease, not by a report)", got)
	}
}

// listenFree returns a loopback address nobody listens on now.
func listenFree() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// counterValue reads one metric of the indexer's /metrics (summed over labels).
func counterValue(t *testing.T, ix *indexer, name string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + ix.srv.HTTPAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	total := 0.0
	for _, line := range strings.Split(string(body), "\n") {
		if line == name || strings.HasPrefix(line, name+" ") || strings.HasPrefix(line, name+"{") {
			var v float64
			fmt.Sscan(line[strings.LastIndexByte(line, ' ')+1:], &v)
			total += v
		}
	}
	return total
}

// The outbox sends what is left of each TTL: a decision that waited while the
// stream was down is not taken as fresh, and one that expired is not sent.
// It holds at most maxOutboxKeys predicted keys, dropping the oldest.
func TestLedgerOutboxSendsTheTTLLeftAndIsBoundedInKeys(t *testing.T) {
	clk := newFakeClock()
	f := &fleetLedger{r: &Router{now: clk.Now}, id: "r1"}
	a, b := Target{Worker: "a"}, Target{Worker: "b"}
	f.queue([]uint64{1, 2}, a, "s1", 10*time.Second, 30*time.Second)
	clk.Advance(4 * time.Second)
	f.queue([]uint64{3}, b, "s2", 2*time.Second, 30*time.Second)
	clk.Advance(3 * time.Second) // a: 3 s of 10 left; b's 2 s ran out
	pred, sess := f.takeOutbox()
	if len(pred) != 1 || pred[0].Worker != "a" || pred[0].TtlMs != 3000 {
		t.Errorf("predictions sent %v, want only a's with 3000 ms left", pred)
	}
	if len(sess) != 2 || sess[0].TtlMs != 23000 || sess[1].TtlMs != 27000 {
		t.Errorf("bindings sent %v, want s1 with 23000 ms and s2 with 27000 ms left", sess)
	}
	if pred, sess := f.takeOutbox(); len(pred)+len(sess) != 0 {
		t.Errorf("the outbox still held %v %v after it was taken", pred, sess)
	}

	// A prompt longer than the leader accepts in one prediction is reported cut
	// to its leading keys (sent whole, the leader would refuse the report).
	long := make([]uint64, kvindexv1.LedgerMaxPredictionKeys+5)
	for i := range long {
		long[i] = uint64(i)
	}
	f.queue(long, a, "", time.Minute, 0)
	if pred, _ := f.takeOutbox(); len(pred) != 1 || !slices.Equal(pred[0].Keys, long[:kvindexv1.LedgerMaxPredictionKeys]) {
		t.Errorf("a prompt of %d keys was not sent as its first %d", len(long), kvindexv1.LedgerMaxPredictionKeys)
	}
	// Many long prompts: the keys stay within the bound, the newest kept.
	perPrompt := kvindexv1.LedgerMaxQueuedKeys / kvindexv1.LedgerMaxPredictionKeys
	for i := range perPrompt + 3 {
		f.queue(long, Target{Worker: fmt.Sprint(i)}, "", time.Minute, 0)
		if f.outbox.Keys() > kvindexv1.LedgerMaxQueuedKeys {
			t.Fatalf("outbox holds %d keys after %d prompts, bound %d", f.outbox.Keys(), i+1, kvindexv1.LedgerMaxQueuedKeys)
		}
	}
	// They go a report's worth at a time (ledgerq.Take), all of them.
	pred = nil
	for i := 0; f.outbox.Keys() > 0; i++ {
		if i > perPrompt {
			t.Fatalf("the outbox still holds %d keys after %d reports", f.outbox.Keys(), i)
		}
		p, _ := f.takeOutbox()
		pred = append(pred, p...)
	}
	if len(pred) != perPrompt || pred[0].Worker != "3" || pred[len(pred)-1].Worker != fmt.Sprint(perPrompt+2) {
		t.Errorf("kept %d predictions from %s on, want the newest %d", len(pred), pred[0].Worker, perPrompt)
	}
}

// --max-pending counts the fleet's load, so a request may queue at one router
// because of another router's request; it must be served as soon as that load
// stops counting, not left to wait out --queue-timeout for a 429: when the other
// router's request ends (the ledger's view shows the load going down), and when
// the ledger becomes unreachable (the others' load no longer counts at all).
func TestRequestQueuedOnAnotherRoutersLoadIsServedWhenThatLoadGoes(t *testing.T) {
	for _, tc := range []struct {
		name string
		hold time.Duration // router 0's request, on the engine
		// release is called once router 1's request is queued: it makes router
		// 0's load stop counting (nothing to do when that request just ends).
		release func(ix *indexer)
		// whileHeld: router 1's request is served while router 0's still runs.
		whileHeld bool
	}{
		{name: "the other router's request ends", hold: 2 * time.Second, release: func(*indexer) {}},
		{name: "the ledger becomes unreachable", hold: 8 * time.Second, release: func(ix *indexer) { ix.stop() }, whileHeld: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := startFleet(t, 1, func(_ int, c *fakeengine.Config) { c.Faults.HangBeforeFirstToken = tc.hold })
			ix := startIndexer(t, f)
			rs := startRouters(t, 2, f, ix, func(c *Config) {
				c.MaxPending = 1
				c.QueueTimeout = 30 * time.Second // far beyond either case's wait
			})
			w0 := Target{Worker: "w0"}
			held := make(chan int, 1)
			go func() {
				code, _, _ := postAside(t, rs[0].url, "/v1/completions", completionBody("held by router 0", 1))
				held <- code
			}()
			waitFor(t, 10*time.Second, "router 1 to see router 0's request", func() bool { return rs[1].loadOf(w0).InFlight == 1 })
			// Router 1's own request hangs no longer than it takes to answer.
			faults := f.engines["w0"].Faults()
			faults.HangBeforeFirstToken = 0
			if err := f.engines["w0"].SetFaults(faults); err != nil {
				t.Fatal(err)
			}
			queued := make(chan int, 1)
			go func() {
				code, _, _ := postAside(t, rs[1].url, "/v1/completions", completionBody("queued at router 1", 1))
				queued <- code
			}()
			waitFor(t, 5*time.Second, "router 1's request to queue", func() bool { return rs[1].adm.depth() == 1 })
			tc.release(ix)
			if code := <-queued; code != http.StatusOK {
				t.Fatalf("router 1's request: %d, want 200: it was queued behind load that stopped counting long before --queue-timeout", code)
			}
			if tc.whileHeld && rs[0].ledger.Load(w0).InFlight != 1 {
				t.Fatalf("router 0's request ended before router 1's was served: the case did not test the ledger going away")
			}
			if code := <-held; code != http.StatusOK {
				t.Fatalf("router 0's request: %d", code)
			}
			if n := testutil.ToFloat64(rs[1].metrics.rejected.WithLabelValues("queue_timeout")); n != 0 {
				t.Fatalf("router 1 rejected %v requests for the queue timeout, want none", n)
			}
			for _, r := range rs {
				r.assertNoLoad(t, f.ids)
			}
		})
	}
}

// wentDown is what wakes requests queued on the other routers' load: any term
// of any target lower, or a target gone, and nothing else.
func TestRemoteViewWentDown(t *testing.T) {
	a, b := Target{Worker: "a"}, Target{Worker: "b"}
	base := map[Target]Load{a: {InFlight: 2, PrefillTokens: 10, DecodeBlocks: 5}, b: {InFlight: 1}}
	with := func(t Target, l Load) map[Target]Load {
		m := maps.Clone(base)
		m[t] = l
		return m
	}
	for _, c := range []struct {
		name  string
		after map[Target]Load
		want  bool
	}{
		{"unchanged", base, false},
		{"up", with(a, Load{InFlight: 3, PrefillTokens: 20, DecodeBlocks: 6}), false},
		{"a new target", with(Target{Worker: "c"}, Load{InFlight: 1}), false},
		{"fewer in flight", with(a, Load{InFlight: 1, PrefillTokens: 10, DecodeBlocks: 5}), true},
		{"prefill done (first byte)", with(a, Load{InFlight: 2, DecodeBlocks: 5}), true},
		{"fewer decode blocks", with(a, Load{InFlight: 2, PrefillTokens: 10, DecodeBlocks: 4}), true},
		{"one down, another up", with(b, Load{}), true},
		{"a target gone", map[Target]Load{a: base[a]}, true},
		{"everything gone", map[Target]Load{}, true},
	} {
		if got := wentDown(base, c.after); got != c.want {
			t.Errorf("%s: wentDown = %v, want %v", c.name, got, c.want)
		}
	}
}

// silentLeader answers the first report of its first stream with a view and
// then goes silent without closing the stream, and pushes nothing on the
// streams after: a hung leader process, or a partition that drops packets (no
// FIN/RST reaches the router).
type silentLeader struct {
	kvindexv1.UnimplementedLoadServiceServer
	streams atomic.Int64
}

func (l *silentLeader) Report(s kvindexv1.LoadService_ReportServer) error {
	if _, err := s.Recv(); err != nil {
		return err
	}
	if l.streams.Add(1) > 1 {
		<-s.Context().Done()
		return nil
	}
	if err := s.Send(&kvindexv1.ReportResponse{Full: true, Routers: 2, Version: 1,
		Loads: []*kvindexv1.TargetLoad{{Worker: "w0", InFlight: 5}}}); err != nil {
		return err
	}
	<-s.Context().Done()
	return nil
}

// The leader pushes at least once a heartbeat, so a router tells a quiet fleet
// from a dead stream: a leader silent for ledgerSilence ends the session, and
// its last view no longer counts.
func TestLedgerSilentLeaderStopsCounting(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	leader := &silentLeader{}
	kvindexv1.RegisterLoadServiceServer(gs, leader)
	go gs.Serve(l)
	t.Cleanup(gs.Stop)

	f := startFleet(t, 1, nil)
	cfg := testConfig(t, f)
	cfg.Indexer = []string{l.Addr().String()}
	cfg.RouterID = "r"
	r := startRouter(t, cfg)
	w0 := Target{Worker: "w0"}
	waitFor(t, 10*time.Second, "the first view", func() bool { return r.shared.remoteLoad(w0).InFlight == 5 })
	waitFor(t, 10*time.Second, "the silent leader's view to stop counting", func() bool { // ten heartbeats
		return r.shared.remoteLoad(w0).InFlight == 0 && !r.shared.connected.Load() &&
			testutil.ToFloat64(r.metrics.ledgerConnected) == 0
	})
	// The router went on trying: a session that never gets a push ends too.
	waitFor(t, 10*time.Second, "the router to reconnect and give up on silence again", func() bool { return leader.streams.Load() >= 3 })
	if r.shared.connected.Load() {
		t.Errorf("the router is connected to a leader that never pushed on this stream")
	}
}
