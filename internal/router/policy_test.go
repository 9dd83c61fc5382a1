package router

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvindex/kvindex/bench/fakeengine"
	"github.com/kvindex/kvindex/internal/workerspec"
)

// cands are candidates on workers c0..c(n-1) with the given requests in flight.
func cands(inflight ...int) []Candidate {
	out := make([]Candidate, len(inflight))
	for i, n := range inflight {
		out[i] = Candidate{Worker: &Worker{ID: fmt.Sprintf("c%d", i), Ranks: 1}, Load: Load{InFlight: n}}
	}
	return out
}

// pickCounts runs n picks on fresh copies of cs and counts each index.
func pickCounts(t *testing.T, p Policy, req *RouteRequest, cs []Candidate, n int) []int {
	t.Helper()
	got := make([]int, len(cs))
	for range n {
		i := p.Pick(req, append([]Candidate(nil), cs...))
		if i < 0 || i >= len(cs) {
			t.Fatalf("%s picked index %d of %d", p.Name(), i, len(cs))
		}
		got[i]++
	}
	return got
}

// within checks count against n·p with 6 standard deviations of slack (a false
// failure has odds below one in 10^8).
func within(t *testing.T, what string, count, n int, p float64) {
	t.Helper()
	mean, sd := float64(n)*p, math.Sqrt(float64(n)*p*(1-p))
	if math.Abs(float64(count)-mean) > 6*sd {
		t.Errorf("%s: %d of %d, want %.0f ± %.0f", what, count, n, mean, 6*sd)
	}
}

func TestRoundRobinCyclesExactly(t *testing.T) {
	p := &roundRobin{}
	cs := cands(0, 0, 0, 0, 0)
	for k := range 1000 {
		if i := p.Pick(&RouteRequest{}, cs); i != k%5 {
			t.Fatalf("pick %d = %d, want %d", k, i, k%5)
		}
	}
	// Concurrent picks: still exactly even.
	counts := make([]int, 5)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 250 {
				i := p.Pick(&RouteRequest{}, cs)
				mu.Lock()
				counts[i]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if fmt.Sprint(counts) != "[400 400 400 400 400]" {
		t.Fatalf("2000 concurrent picks over 5 = %v, want 400 each", counts)
	}
	// Load does not matter to round-robin.
	if got := pickCounts(t, &roundRobin{}, &RouteRequest{}, cands(9, 0, 0), 300); fmt.Sprint(got) != "[100 100 100]" {
		t.Fatalf("round-robin over loaded candidates = %v, want [100 100 100]", got)
	}
}

func TestRandomIsUniform(t *testing.T) {
	const n = 40000
	got := pickCounts(t, random{}, &RouteRequest{}, cands(0, 5, 0, 9), n)
	chi2 := 0.0
	for i, c := range got {
		within(t, fmt.Sprintf("candidate %d", i), c, n, 0.25)
		d := float64(c) - n/4.0
		chi2 += d * d / (n / 4.0)
	}
	// 3 degrees of freedom: P(χ² > 30) ≈ 1.4e-6.
	if chi2 > 30 {
		t.Errorf("χ² = %.1f over %v, want a uniform spread (< 30)", chi2, got)
	}
}

func TestPowerOfTwoTakesTheLessLoadedOfTwoDistinctSamples(t *testing.T) {
	// Two candidates: the sample is both of them, so the idle one always wins.
	if got := pickCounts(t, powerOfTwo{}, &RouteRequest{}, cands(3, 0), 500); fmt.Sprint(got) != "[0 500]" {
		t.Fatalf("loads [3 0]: picks %v, want all on the idle one", got)
	}
	// Loads 0 < 1 < 2 < 3: a candidate wins when sampled with a busier one. Of the
	// 6 pairs, 3 contain c0, 2 have c1 as the less loaded, 1 has c2; c3 never wins.
	const n = 30000
	got := pickCounts(t, powerOfTwo{}, &RouteRequest{}, cands(0, 1, 2, 3), n)
	if got[3] != 0 {
		t.Fatalf("the most loaded candidate won %d times", got[3])
	}
	for i, p := range []float64{3.0 / 6, 2.0 / 6, 1.0 / 6} {
		within(t, fmt.Sprintf("candidate with load %d", i), got[i], n, p)
	}
	// The engine's own count (other routers' requests) is load too.
	cs := cands(0, 1)
	cs[0].Engine = EngineLoad{Waiting: 2, Running: 3}
	if got := pickCounts(t, powerOfTwo{}, &RouteRequest{}, cs, 200); fmt.Sprint(got) != "[0 200]" {
		t.Fatalf("engine-reported load ignored: picks %v, want all on c1", got)
	}
}

func TestLeastLoadedPicksTheMinimumAndSpreadsTies(t *testing.T) {
	if got := pickCounts(t, leastLoaded{}, &RouteRequest{}, cands(2, 0, 1), 300); fmt.Sprint(got) != "[0 300 0]" {
		t.Fatalf("loads [2 0 1]: picks %v, want all on c1", got)
	}
	const n = 30000
	got := pickCounts(t, leastLoaded{}, &RouteRequest{}, cands(0, 0, 5, 0), n)
	if got[2] != 0 {
		t.Fatalf("the loaded candidate won %d ties", got[2])
	}
	for _, i := range []int{0, 1, 3} {
		within(t, fmt.Sprintf("tied candidate %d", i), got[i], n, 1.0/3)
	}
}

// The ring policies keep a key on one target, move it only when that target is
// not a candidate, and send keyless requests to the least loaded.
func TestRingPolicyKeepsKeysAndSkipsMissingCandidates(t *testing.T) {
	cs := cands(0, 0, 0, 0)
	targets := func() []Target {
		var ts []Target
		for _, c := range cs {
			ts = append(ts, c.Target())
		}
		return ts
	}
	p := &ringPolicy{name: PolicySession, rings: newRingCache(160), key: func(q *RouteRequest) string { return q.SessionKey }}
	req := func(key string) *RouteRequest {
		return &RouteRequest{SessionKey: key, pool: &poolRef{name: "m\x00both", version: 1, targets: targets}}
	}
	owner := map[string]string{}
	used := map[string]bool{}
	for k := range 40 {
		key := fmt.Sprintf("s:%d", k)
		first := cs[p.Pick(req(key), cs)].Worker.ID
		for range 5 {
			if got := cs[p.Pick(req(key), cs)].Worker.ID; got != first {
				t.Fatalf("key %s went to %s, then %s", key, first, got)
			}
		}
		owner[key] = first
		used[first] = true
	}
	if len(used) != 4 {
		t.Fatalf("40 keys used %d of 4 targets", len(used))
	}
	// Without c1 (excluded by the filters) its keys move, the others stay.
	sub := []Candidate{cs[0], cs[2], cs[3]}
	for key, w := range owner {
		got := sub[p.Pick(req(key), sub)].Worker.ID
		if w != "c1" && got != w {
			t.Fatalf("key %s moved from %s to %s when only c1 left", key, w, got)
		}
	}
	// No key: least loaded.
	if got := pickCounts(t, p, req(""), cands(3, 1, 0, 2), 50); fmt.Sprint(got) != "[0 0 50 0]" {
		t.Fatalf("keyless requests: %v, want all on the least loaded", got)
	}
}

// --- end to end ---

// A burst on least-loaded spreads before any request finishes: 8 concurrent
// requests (each hanging 1s in the engine) over 4 workers give exactly 2 each,
// because every pick sees the reservations of the picks before it.
func TestLeastLoadedBurstSpreadsEvenlyEndToEnd(t *testing.T) {
	f := startFleet(t, 4, func(_ int, c *fakeengine.Config) { c.Faults.HangBeforeFirstToken = time.Second })
	cfg := testConfig(t, f)
	cfg.Policy = PolicyLeastLoaded
	up := countUpstream(t, &cfg)
	rt := startRouter(t, cfg)
	prefix := words("same prompt for everyone", 100) // equal prompts: no reason to co-locate in least-loaded
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			if code, _, raw := postAside(t, rt.url, "/v1/completions", completionBody(prefix, 2)); code != http.StatusOK {
				t.Errorf("request %d: %d %s", i, code, raw)
			}
		}()
	}
	close(start)
	wg.Wait()
	for _, w := range f.ids {
		if n, u := rt.servedCount(w), up[w].count(); n != 2 || u != 2 {
			t.Errorf("%s served %d (engine saw %d) of the burst of 8, want 2", w, n, u)
		}
	}
	rt.assertNoLoad(t, f.ids)
}

// The session policy keeps every session on one worker across many requests,
// whether the id comes from X-Session-ID or the session_id field, and spreads
// different sessions over the workers.
func TestSessionPolicySticksSessionsEndToEnd(t *testing.T) {
	f := startFleet(t, 4, nil)
	cfg := testConfig(t, f)
	cfg.Policy = PolicySession
	rt := startRouter(t, cfg)
	type via struct {
		name string
		send func(session string, turn int) (int, string)
	}
	vias := []via{
		{"header", func(s string, turn int) (int, string) {
			code, _, raw := post(t, rt.url, "/v1/completions", completionBody(fmt.Sprintf("turn %d of %s", turn, s), 2), "X-Session-ID", s)
			return code, raw
		}},
		{"body", func(s string, turn int) (int, string) {
			body := fmt.Sprintf(`{"model":%q,"prompt":%s,"max_tokens":2,"session_id":%q}`, testModel, quote(fmt.Sprintf("turn %d of %s", turn, s)), s)
			code, _, raw := post(t, rt.url, "/v1/completions", body)
			return code, raw
		}},
	}
	where := map[string]map[string]string{} // via -> session -> worker
	total := 0
	for _, v := range vias {
		where[v.name] = map[string]string{}
		for s := range 8 {
			session := fmt.Sprintf("user-%d-conversation", s)
			for turn := range 4 {
				w := rt.servedBy(t, f.ids, func() {
					if code, raw := v.send(session, turn); code != http.StatusOK {
						t.Fatalf("%s %s turn %d: %d %s", v.name, session, turn, code, raw)
					}
				})
				total++
				if prev, ok := where[v.name][session]; ok && prev != w {
					t.Fatalf("session %s (%s) went to %s, then to %s", session, v.name, prev, w)
				}
				where[v.name][session] = w
			}
		}
	}
	used := map[string]bool{}
	for s, w := range where["header"] {
		used[w] = true
		if b := where["body"][s]; b != w {
			t.Errorf("session %s: X-Session-ID went to %s, session_id to %s; the same id must route the same", s, w, b)
		}
	}
	if len(used) < 3 {
		t.Errorf("8 sessions used %d of 4 workers, want them spread over at least 3", len(used))
	}
	if got := testutil.ToFloat64(rt.metrics.decisions.WithLabelValues(PolicySession, string(SourceSession))); got != float64(total) {
		t.Errorf("session decisions = %v, want %d", got, total)
	}
	rt.assertNoLoad(t, f.ids)
}

// prefix-hash keeps every request with the same system prompt on one worker
// whatever the user turn, spreads different system prompts, and an explicit
// X-Cache-Key groups requests regardless of their content.
func TestPrefixHashPolicyGroupsBySystemPromptEndToEnd(t *testing.T) {
	f := startFleet(t, 4, nil)
	cfg := testConfig(t, f)
	cfg.Policy = PolicyPrefixHash
	rt := startRouter(t, cfg)
	chat := func(system, user string) string {
		return fmt.Sprintf(`{"model":%q,"max_tokens":2,"messages":[{"role":"system","content":%s},{"role":"user","content":%s}]}`,
			testModel, quote(system), quote(user))
	}
	send := func(body string, hdr ...string) string {
		return rt.servedBy(t, f.ids, func() {
			if code, _, raw := post(t, rt.url, "/v1/chat/completions", body, hdr...); code != http.StatusOK {
				t.Fatalf("%d %s", code, raw)
			}
		})
	}
	used := map[string]bool{}
	for s := range 8 {
		system := fmt.Sprintf("You are assistant number %d of tenant %d.", s, s*7)
		first := send(chat(system, "first question"))
		for q := range 3 {
			if w := send(chat(system, fmt.Sprintf("question %d", q))); w != first {
				t.Fatalf("system prompt %d went to %s, then %s", s, first, w)
			}
		}
		used[first] = true
	}
	if len(used) < 3 {
		t.Errorf("8 system prompts used %d of 4 workers, want at least 3", len(used))
	}
	first := send(chat("some system prompt", "q"), "X-Cache-Key", "tenant-a/doc-42")
	for s := range 4 {
		if w := send(chat(fmt.Sprintf("system %d", s), "q"), "X-Cache-Key", "tenant-a/doc-42"); w != first {
			t.Fatalf("X-Cache-Key tenant-a/doc-42 went to %s, then %s", first, w)
		}
	}
	rt.assertNoLoad(t, f.ids)
}

// Round-robin is even within each pool: requests of two models interleaved
// (A, B, A, B, …) still alternate over each model's workers, and so do the
// prefill picks of disaggregated requests.
func TestRoundRobinIsEvenPerModelEndToEnd(t *testing.T) {
	const modelB = "test/model-b"
	f := startFleet(t, 4, func(i int, c *fakeengine.Config) {
		if i >= 2 {
			c.Model = modelB
		}
	})
	cfg := testConfig(t, f)
	cfg.Policy = PolicyRoundRobin
	up := countUpstream(t, &cfg)
	rt := startRouter(t, cfg)
	for i := range 4 {
		for _, m := range []string{testModel, modelB} {
			body := fmt.Sprintf(`{"model":%q,"prompt":%s,"max_tokens":2}`, m, quote(fmt.Sprintf("request %d", i)))
			if code, _, raw := post(t, rt.url, "/v1/completions", body); code != http.StatusOK {
				t.Fatalf("%s request %d: %d %s", m, i, code, raw)
			}
		}
	}
	if c := counts(up); c["w0"] != 2 || c["w1"] != 2 || c["w2"] != 2 || c["w3"] != 2 {
		t.Fatalf("4 interleaved requests per model went %v, want 2 on every worker", c)
	}
}

// A dry run (POST /debug/route) shows the pick the next request would get and
// takes nothing: no load, no request upstream, and round-robin's turn stays with
// the next real request.
func TestDryRunShowsTheNextPickWithoutTakingIt(t *testing.T) {
	f := startFleet(t, 2, nil)
	cfg := testConfig(t, f)
	cfg.Policy = PolicyRoundRobin
	cfg.MaxActiveDecodeBlocks = 1 // any request in flight makes its worker busy
	up := countUpstream(t, &cfg)
	rt := startRouter(t, cfg)
	served := make([]string, 0, 4)
	for i := range 4 {
		body := completionBody(fmt.Sprintf("dry %d", i), 2)
		var shown []string
		for range 3 {
			shown = append(shown, dryRun(t, rt.url, body).Worker)
		}
		if n := len(rt.ledger.Loads()); n != 0 {
			t.Fatalf("dry runs hold load on %d targets", n)
		}
		w := rt.servedBy(t, f.ids, func() {
			if code, _, raw := post(t, rt.url, "/v1/completions", body); code != http.StatusOK {
				t.Fatalf("%d %s", code, raw)
			}
		})
		for _, s := range shown {
			if s != w {
				t.Fatalf("request %d: dry runs showed %v, the request then went to %s", i, shown, w)
			}
		}
		served = append(served, w)
	}
	if served[0] == served[1] || served[0] != served[2] || served[1] != served[3] {
		t.Errorf("with dry runs between them, 4 requests went %v: round-robin lost its turn", served)
	}
	if c := counts(up); c["w0"] != 2 || c["w1"] != 2 {
		t.Errorf("engines received %v, want the 4 real requests, 2 each", c)
	}

	// With a worker over --max-active-decode-blocks the dry run shows it
	// excluded, and counts nothing: kvindex_router_excluded_total is the real
	// decisions'.
	for _, id := range f.ids {
		if err := f.engines[id].SetFaults(fakeengine.Faults{FailStatus: 500, HangBeforeFirstToken: 3 * time.Second}); err != nil {
			t.Fatal(err)
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		postAside(t, rt.url, "/v1/completions", completionBody("busy", 2))
	}()
	waitFor(t, 10*time.Second, "a request in flight", func() bool { return len(rt.ledger.Loads()) == 1 })
	busyBefore := testutil.ToFloat64(rt.metrics.excluded.WithLabelValues(ExcludeBusy))
	d := dryRun(t, rt.url, completionBody("dry while busy", 2))
	if len(d.Excluded) != 1 || d.Excluded[0].Reason != ExcludeBusy || d.Excluded[0].Target.Worker == d.Worker {
		t.Errorf("dry run with one worker busy: worker %s, excluded %+v", d.Worker, d.Excluded)
	}
	if got := testutil.ToFloat64(rt.metrics.excluded.WithLabelValues(ExcludeBusy)); got != busyBefore {
		t.Errorf("excluded{reason=busy} went %v -> %v on a dry run", busyBefore, got)
	}
	<-done
	rt.assertNoLoad(t, f.ids)
}

func TestRoundRobinAlternatesPrefillWorkers(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Policy = PolicyRoundRobin
	cfg.BlockSize = 4
	for _, w := range []struct{ id, role string }{{"d0", "decode"}, {"p0", "prefill"}, {"p1", "prefill"}} {
		cfg.Workers = append(cfg.Workers, workerspec.Spec{ID: w.id, Model: testModel, Role: w.role, HTTP: "http://127.0.0.1:9"})
	}
	r, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.close()
	per := map[string]int{}
	for i := range 6 {
		p, err := r.prepare(http.Header{}, "/v1/completions", endpointCompletions, []byte(completionBody(words(fmt.Sprintf("pd %d", i), 50), 2)))
		if err != nil {
			t.Fatal(err)
		}
		d, err := r.decide(context.Background(), p, map[string]bool{}, false) // a dry run would not take a turn
		if err != nil {
			t.Fatal(err)
		}
		d.release()
		if d.Prefill == nil {
			t.Fatalf("decision %d is not disaggregated", i)
		}
		per[d.Prefill.Worker]++
	}
	if per["p0"] != 3 || per["p1"] != 3 {
		t.Fatalf("6 round-robin prefill picks went %v, want 3 and 3", per)
	}
}
