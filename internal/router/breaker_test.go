package router

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvindex/kvindex/bench/fakeengine"
	"github.com/kvindex/kvindex/internal/workerspec"
)

// breakerRig is a Breakers on a fake clock whose metric hooks are recorded.
type breakerRig struct {
	b      *Breakers
	clk    *fakeClock
	states []BreakerState // every state the hook saw, in order
	trips  int
}

func newBreakerRig(threshold int, cooldown, maxCooldown time.Duration) *breakerRig {
	g := &breakerRig{clk: newFakeClock()}
	g.b = newBreakers(threshold, cooldown, maxCooldown, g.clk.Now)
	g.b.onState = func(w string, s BreakerState) {
		if w == "w" {
			g.states = append(g.states, s)
		}
	}
	g.b.onTrip = func(w string) {
		if w == "w" {
			g.trips++
		}
	}
	return g
}

func (g *breakerRig) fail(n int) {
	for range n {
		g.b.Record("w", OutcomeFailure, g.b.Begin("w"))
	}
}

func (g *breakerRig) wantState(t *testing.T, want BreakerState, wantCooldown time.Duration) {
	t.Helper()
	s, cd := g.b.State("w")
	if s != want || cd != wantCooldown {
		t.Fatalf("breaker is %s with cooldown %s, want %s with %s", s, cd, want, wantCooldown)
	}
}

func TestBreakerTripsOnlyAfterThresholdConsecutiveFailures(t *testing.T) {
	g := newBreakerRig(3, 5*time.Second, time.Minute)
	g.fail(2)
	g.b.Record("w", OutcomeSuccess, false) // resets the run of failures
	g.fail(2)
	if !g.b.Allows("w") || g.trips != 0 {
		t.Fatalf("2 consecutive failures (after a success broke the run) excluded the worker: allows=%v trips=%d", g.b.Allows("w"), g.trips)
	}
	g.wantState(t, BreakerClosed, 5*time.Second)
	g.fail(1)
	if g.b.Allows("w") {
		t.Fatal("3 consecutive failures: the worker is still allowed")
	}
	g.wantState(t, BreakerOpen, 5*time.Second)
	if g.trips != 1 || fmt.Sprint(g.states) != "[open]" {
		t.Fatalf("hooks saw trips=%d states=%v, want 1 trip and [open]", g.trips, g.states)
	}
	if !g.b.Allows("other") {
		t.Fatal("another worker is excluded by w's breaker")
	}
}

func TestBreakerAdmitsExactlyOneProbeAfterTheCooldownAndSuccessRestores(t *testing.T) {
	g := newBreakerRig(3, 5*time.Second, time.Minute)
	g.fail(3)
	g.clk.Advance(5*time.Second - time.Millisecond)
	if g.b.Allows("w") || g.b.Begin("w") {
		t.Fatal("the worker is allowed (or probed) before its cooldown ended")
	}
	g.clk.Advance(time.Millisecond)
	if !g.b.Allows("w") {
		t.Fatal("the cooldown ended but no probe is allowed")
	}
	g.wantState(t, BreakerHalfOpen, 5*time.Second)
	if !g.b.Begin("w") {
		t.Fatal("the first dispatch after the cooldown is not the probe")
	}
	for i := range 3 {
		if g.b.Allows("w") || g.b.Begin("w") {
			t.Fatalf("check %d: a second request is admitted while the probe is in flight", i)
		}
	}
	g.b.Record("w", OutcomeSuccess, true)
	g.wantState(t, BreakerClosed, 5*time.Second)
	if !g.b.Allows("w") || g.b.Begin("w") {
		t.Fatal("after a successful probe the worker is not plainly allowed (or a non-probe counts as a probe)")
	}
	if got := fmt.Sprint(g.states); got != "[open half-open closed]" {
		t.Fatalf("state hook saw %s, want [open half-open closed]", got)
	}
	// Restored means a full threshold again: two failures do not trip.
	g.fail(2)
	g.wantState(t, BreakerClosed, 5*time.Second)
}

func TestBreakerFailedProbeDoublesTheCooldownUpToTheMaximum(t *testing.T) {
	g := newBreakerRig(3, 5*time.Second, 17*time.Second)
	g.fail(3)
	// Each failed probe doubles: 5s -> 10s -> 17s (capped) -> 17s.
	for i, want := range []time.Duration{10 * time.Second, 17 * time.Second, 17 * time.Second} {
		_, cd := g.b.State("w")
		g.clk.Advance(cd)
		if !g.b.Allows("w") {
			t.Fatalf("probe %d: not allowed after the cooldown %s", i, cd)
		}
		probe := g.b.Begin("w")
		if !probe {
			t.Fatalf("probe %d: Begin did not return the probe", i)
		}
		g.b.Record("w", OutcomeFailure, probe)
		g.wantState(t, BreakerOpen, want)
		g.clk.Advance(want - time.Millisecond)
		if g.b.Allows("w") {
			t.Fatalf("probe %d failed: allowed again before the doubled cooldown %s", i, want)
		}
		g.clk.Advance(-(want - time.Millisecond))
	}
	if g.trips != 4 {
		t.Fatalf("trips = %d, want 4 (the first trip and three failed probes)", g.trips)
	}
	// A successful probe resets the cooldown to the configured one.
	g.clk.Advance(17 * time.Second)
	g.b.Allows("w")
	g.b.Record("w", OutcomeSuccess, g.b.Begin("w"))
	g.wantState(t, BreakerClosed, 5*time.Second)
	g.fail(3)
	g.clk.Advance(5 * time.Second)
	if !g.b.Allows("w") {
		t.Fatal("after a restore and a new trip the cooldown is not back to 5s")
	}
}

func TestBreakerNeverTripsOnNeutralOrClientErrorOutcomes(t *testing.T) {
	for _, o := range []struct {
		name    string
		outcome Outcome
	}{{"429 or cancel (neutral)", OutcomeNeutral}, {"4xx (success)", OutcomeSuccess}} {
		t.Run(o.name, func(t *testing.T) {
			g := newBreakerRig(3, 5*time.Second, time.Minute)
			for range 100 {
				g.b.Record("w", o.outcome, g.b.Begin("w"))
			}
			if !g.b.Allows("w") || g.trips != 0 {
				t.Fatalf("100 outcomes %v excluded the worker (trips=%d)", o.outcome, g.trips)
			}
			g.wantState(t, BreakerClosed, 5*time.Second)
		})
	}
}

// A probe that ends neutral (429, cancelled by its client) says nothing: the
// breaker stays half-open and the next request may probe.
func TestBreakerNeutralProbeFreesTheProbeSlot(t *testing.T) {
	g := newBreakerRig(3, 5*time.Second, time.Minute)
	g.fail(3)
	g.clk.Advance(5 * time.Second)
	g.b.Allows("w")
	g.b.Record("w", OutcomeNeutral, g.b.Begin("w"))
	g.wantState(t, BreakerHalfOpen, 5*time.Second)
	if !g.b.Allows("w") || !g.b.Begin("w") {
		t.Fatal("after a neutral probe no new probe is admitted")
	}
}

func TestBreakerThresholdZeroDisablesIt(t *testing.T) {
	g := newBreakerRig(0, 5*time.Second, time.Minute)
	g.fail(100)
	if !g.b.Allows("w") || g.trips != 0 || len(g.states) != 0 {
		t.Fatalf("threshold 0: allows=%v trips=%d states=%v after 100 failures, want allowed and no hook calls", g.b.Allows("w"), g.trips, g.states)
	}
}

// --- end to end: real fake engines behind the router ---

// breakerFleet is two engines, w0 failing every request with status, behind a
// round-robin router whose breakers run on a fake clock (cooldown 5s, max 60s).
func breakerFleet(t *testing.T, status int) (*testRouter, *fleet, map[string]*upstreamCounter, *fakeClock) {
	t.Helper()
	f := startFleet(t, 2, func(i int, c *fakeengine.Config) {
		if i == 0 {
			c.Faults = fakeengine.Faults{FailRate: 1, FailStatus: status}
		}
	})
	cfg := testConfig(t, f)
	cfg.Policy = PolicyRoundRobin
	cfg.BreakerCooldown = 5 * time.Second
	cfg.BreakerMaxCooldown = time.Minute
	up := countUpstream(t, &cfg)
	clk := newFakeClock()
	rt := startRouterWith(t, cfg, func(r *Router) { r.breakers.now = clk.Now })
	return rt, f, up, clk
}

func (r *testRouter) breakerState(w string) float64 {
	return testutil.ToFloat64(r.metrics.breakerState.WithLabelValues(w))
}

func (r *testRouter) breakerTrips(w string) float64 {
	return testutil.ToFloat64(r.metrics.breakerTrips.WithLabelValues(w))
}

// halfOpen trips each worker's breaker and lets the cooldown pass: each then
// admits one probe.
func (r *testRouter) halfOpen(t *testing.T, clk *fakeClock, workers ...string) {
	t.Helper()
	for _, w := range workers {
		for range r.cfg.BreakerFailureThreshold {
			r.breakers.Record(w, OutcomeFailure, false)
		}
	}
	clk.Advance(r.cfg.BreakerCooldown)
	for _, w := range workers {
		if !r.breakers.Allows(w) {
			t.Fatalf("%s: no probe admitted right after its first cooldown", w)
		}
	}
}

// admitsAProbeAgain fails w until its breaker is open, lets the longest
// cooldown pass and checks that a probe is admitted: the breaker holds no probe
// that was never handed back.
func (r *testRouter) admitsAProbeAgain(t *testing.T, clk *fakeClock, w string) {
	t.Helper()
	for i := 0; ; i++ {
		if s, _ := r.breakers.State(w); s == BreakerOpen {
			break
		}
		if i == r.cfg.BreakerFailureThreshold {
			t.Fatalf("%s: breaker not open after %d more failures", w, i)
		}
		r.breakers.Record(w, OutcomeFailure, false)
	}
	clk.Advance(r.cfg.BreakerMaxCooldown)
	if !r.breakers.Allows(w) {
		t.Errorf("%s failed again and its cooldown passed, yet its breaker admits no probe: an earlier probe was never handed back, so it stays excluded for good", w)
	}
}

// okUntil sends requests (each must succeed: a failure on w0 is retried on w1)
// until cond holds, at most max of them.
func okUntil(t *testing.T, rt *testRouter, max int, what string, cond func() bool) {
	t.Helper()
	for i := 0; !cond(); i++ {
		if i == max {
			t.Fatalf("%d requests and still not %s", max, what)
		}
		if code, _, raw := post(t, rt.url, "/v1/completions", completionBody(fmt.Sprintf("breaker probe %d", i), 2)); code != http.StatusOK {
			t.Fatalf("request %d: %d %s", i, code, raw)
		}
	}
}

func TestBreakerEndToEndExcludesProbesAndRestoresAFailingWorker(t *testing.T) {
	rt, f, up, clk := breakerFleet(t, http.StatusInternalServerError)

	// Round-robin alternates, so w0 sees every other request; each of its 500s
	// is retried on w1 and the client still gets a 200.
	okUntil(t, rt, 10, "3 requests on w0", func() bool { return up["w0"].count() == 3 })
	if s, n := rt.breakerState("w0"), rt.breakerTrips("w0"); s != float64(BreakerOpen) || n != 1 {
		t.Fatalf("after 3 failures on w0: breaker_state=%v trips=%v, want 2 and 1", s, n)
	}
	if s := rt.breakerState("w1"); s != float64(BreakerClosed) {
		t.Fatalf("healthy w1 breaker_state=%v, want 0", s)
	}
	uiBreakers(t, rt.url, map[string]string{"w0": "open", "w1": "closed"}, map[string]float64{"w0": 1, "w1": 0})

	// Open: nothing goes to w0 during the cooldown.
	excludedBefore := testutil.ToFloat64(rt.metrics.excluded.WithLabelValues(ExcludeBreaker))
	clk.Advance(5*time.Second - time.Millisecond)
	before := up["w1"].count()
	okUntil(t, rt, 6, "6 requests served", func() bool { return up["w1"].count() == before+6 })
	if n := up["w0"].count(); n != 3 {
		t.Fatalf("w0 received %d requests, want 3: it got traffic while its breaker was open", n)
	}
	if got := testutil.ToFloat64(rt.metrics.excluded.WithLabelValues(ExcludeBreaker)) - excludedBefore; got != 6 {
		t.Fatalf("breaker exclusions while open = %v, want 6", got)
	}

	// Cooldown over: a dry run (/debug/route) sees w0 half-open without probing it.
	clk.Advance(time.Millisecond)
	resp, err := http.Post(rt.url+"/debug/route", "application/json", strings.NewReader(completionBody("dry run", 2)))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if s := rt.breakerState("w0"); resp.StatusCode != http.StatusOK || s != float64(BreakerHalfOpen) {
		t.Fatalf("after the cooldown: /debug/route %d, breaker_state=%v, want 200 and 1 (half-open)", resp.StatusCode, s)
	}
	if n := up["w0"].count(); n != 3 {
		t.Fatalf("a dry run sent w0 a request (%d)", n)
	}
	uiBreakers(t, rt.url, map[string]string{"w0": "half-open", "w1": "closed"}, map[string]float64{"w0": 1, "w1": 0})
	// Exactly one probe; it fails, the cooldown doubles to 10s.
	okUntil(t, rt, 4, "the probe sent to w0", func() bool { return up["w0"].count() == 4 })
	if s, n := rt.breakerState("w0"), rt.breakerTrips("w0"); s != float64(BreakerOpen) || n != 2 {
		t.Fatalf("after the failed probe: breaker_state=%v trips=%v, want 2 and 2", s, n)
	}
	if _, cd := rt.breakers.State("w0"); cd != 10*time.Second {
		t.Fatalf("cooldown after a failed probe = %s, want 10s", cd)
	}
	clk.Advance(5 * time.Second) // half the doubled cooldown
	before = up["w1"].count()
	okUntil(t, rt, 4, "4 requests served", func() bool { return up["w1"].count() == before+4 })
	if n := up["w0"].count(); n != 4 {
		t.Fatalf("w0 received %d requests, want 4: probed again before the doubled cooldown ended", n)
	}

	// The engine heals; the next probe succeeds and restores it.
	if err := f.engines["w0"].SetFaults(fakeengine.Faults{FailStatus: http.StatusInternalServerError}); err != nil {
		t.Fatal(err)
	}
	clk.Advance(5 * time.Second)
	okUntil(t, rt, 4, "the second probe sent to w0", func() bool { return up["w0"].count() == 5 })
	if s := rt.breakerState("w0"); s != float64(BreakerClosed) {
		t.Fatalf("after a successful probe breaker_state=%v, want 0", s)
	}
	if _, cd := rt.breakers.State("w0"); cd != 5*time.Second {
		t.Fatalf("cooldown after the restore = %s, want 5s again", cd)
	}
	uiBreakers(t, rt.url, map[string]string{"w0": "closed", "w1": "closed"}, map[string]float64{"w0": 2, "w1": 0})
	// Restored: round-robin gives it every other request again.
	b0, b1 := up["w0"].count(), up["w1"].count()
	okUntil(t, rt, 4, "4 requests served", func() bool { return up["w0"].count()+up["w1"].count() == b0+b1+4 })
	if d0, d1 := up["w0"].count()-b0, up["w1"].count()-b1; d0 != 2 || d1 != 2 {
		t.Fatalf("after the restore 4 requests went w0:%d w1:%d, want 2:2", d0, d1)
	}
	rt.assertNoLoad(t, f.ids)
}

// uiBreakers checks the console's worker table (/ui/api/state) shows each
// worker's breaker state and trips.
func uiBreakers(t *testing.T, url string, states map[string]string, trips map[string]float64) {
	t.Helper()
	for _, w := range getUIState(t, url).Workers {
		if w.Breaker != states[w.ID] || w.Trips != trips[w.ID] {
			t.Errorf("console shows %s breaker %q with %v trips, want %q and %v", w.ID, w.Breaker, w.Trips, states[w.ID], trips[w.ID])
		}
	}
}

func TestBreakerEndToEndA429WorkerNeverTrips(t *testing.T) {
	rt, f, up, _ := breakerFleet(t, http.StatusTooManyRequests)
	okUntil(t, rt, 30, "10 requests on w0", func() bool { return up["w0"].count() == 10 })
	if s, n := rt.breakerState("w0"), rt.breakerTrips("w0"); s != float64(BreakerClosed) || n != 0 {
		t.Fatalf("after 10 429s: breaker_state=%v trips=%v, want 0 and 0", s, n)
	}
	if got := testutil.ToFloat64(rt.metrics.retries.WithLabelValues("status_429")); got != 10 {
		t.Fatalf("retries on 429 = %v, want 10", got)
	}
	rt.assertNoLoad(t, f.ids)
}

func TestBreakerEndToEndAllOpenStillDispatches(t *testing.T) {
	f := startFleet(t, 2, func(_ int, c *fakeengine.Config) {
		c.Faults = fakeengine.Faults{FailRate: 1, FailStatus: http.StatusInternalServerError}
	})
	cfg := testConfig(t, f)
	cfg.Policy = PolicyRoundRobin
	up := countUpstream(t, &cfg)
	clk := newFakeClock() // never advanced: the breakers stay open
	rt := startRouterWith(t, cfg, func(r *Router) { r.breakers.now = clk.Now })

	// Every request fails on one worker and is retried on the other: after 3
	// requests both breakers are open.
	for i := range 3 {
		if code, _, raw := post(t, rt.url, "/v1/completions", completionBody(fmt.Sprintf("all fail %d", i), 2)); code != http.StatusInternalServerError {
			t.Fatalf("request %d: %d %s, want the engines' 500", i, code, raw)
		}
	}
	for _, w := range f.ids {
		if s := rt.breakerState(w); s != float64(BreakerOpen) {
			t.Fatalf("%s breaker_state=%v, want 2", w, s)
		}
	}
	// The breaker is the router's private opinion: the fleet still lists both.
	if n := len(rt.fleet.Workers()); n != 2 {
		t.Fatalf("the fleet has %d workers with both breakers open, want 2", n)
	}
	if resp, err := http.Get(rt.url + "/readyz"); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("/readyz with both breakers open: %v %v, want 200", resp, err)
	} else {
		resp.Body.Close()
	}
	before := counts(up)
	code, _, raw := post(t, rt.url, "/v1/completions", completionBody("every breaker open", 2))
	if code == http.StatusServiceUnavailable || code != http.StatusInternalServerError {
		t.Fatalf("with every breaker open: %d %s, want the request dispatched (the engines' 500), not 503", code, raw)
	}
	if after := counts(up); after["w0"]+after["w1"] <= before["w0"]+before["w1"] {
		t.Fatalf("with every breaker open nothing reached an engine (%v -> %v)", before, after)
	}

	// Healed engines: a request dispatched to an open worker succeeds and closes it.
	for _, w := range f.ids {
		if err := f.engines[w].SetFaults(fakeengine.Faults{FailStatus: http.StatusInternalServerError}); err != nil {
			t.Fatal(err)
		}
	}
	if code, _, raw := post(t, rt.url, "/v1/completions", completionBody("healed", 2)); code != http.StatusOK {
		t.Fatalf("after healing: %d %s", code, raw)
	}
	closed := 0
	for _, w := range f.ids {
		if rt.breakerState(w) == float64(BreakerClosed) {
			closed++
		}
	}
	if closed != 1 {
		t.Fatalf("%d breakers closed after one successful request to an open worker, want 1", closed)
	}
	rt.assertNoLoad(t, f.ids)
}

// Concurrent requests are all decided before any is dispatched: once one of them
// took a half-open worker's probe, no other decision may choose that worker until
// the probe's outcome is in ("one probe request is admitted", seeds/000).
func TestBreakerHalfOpenAdmitsOneProbeAcrossConcurrentDecisions(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Policy = PolicyRoundRobin
	cfg.BlockSize = 4
	cfg.Workers = []workerspec.Spec{{ID: "w0", Model: testModel, HTTP: "http://127.0.0.1:9"}, {ID: "w1", Model: testModel, HTTP: "http://127.0.0.1:9"}}
	r, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.close()
	clk := newFakeClock()
	r.breakers.now = clk.Now
	for range 3 {
		r.breakers.Record("w0", OutcomeFailure, false)
	}
	clk.Advance(cfg.BreakerCooldown)

	decideN := func(n int) (toW0 int, ds []*Decision) {
		for i := range n {
			p, err := r.prepare(http.Header{}, "/v1/completions", endpointCompletions, []byte(completionBody(fmt.Sprintf("concurrent %d", i), 2)))
			if err != nil {
				t.Fatal(err)
			}
			d, err := r.decide(context.Background(), p, map[string]bool{}, false)
			if err != nil {
				t.Fatal(err)
			}
			if d.Target.Worker == "w0" {
				toW0++
			}
			ds = append(ds, d)
		}
		return toW0, ds
	}
	toW0, ds := decideN(6)
	if toW0 != 1 {
		t.Fatalf("%d of 6 concurrent decisions chose the half-open w0, want exactly 1 (the probe)", toW0)
	}
	// The probe succeeds: w0 is closed and takes its share again.
	for _, d := range ds {
		if d.Target.Worker == "w0" {
			r.breakers.Record("w0", OutcomeSuccess, d.probe)
		}
		d.release()
	}
	if s, _ := r.breakers.State("w0"); s != BreakerClosed {
		t.Fatalf("after the probe succeeded w0 is %s, want closed", s)
	}
	if toW0, ds = decideN(4); toW0 != 2 {
		t.Fatalf("after the restore w0 got %d of 4 round-robin decisions, want 2", toW0)
	}
	for _, d := range ds {
		d.release()
	}
}

// An engine's 4xx is the request's fault, not the worker's: relayed as is, it
// never trips the breaker (seeds/000: one bad client must not trip a healthy fleet).
func TestBreakerEndToEndClientErrorsNeverTrip(t *testing.T) {
	f := startFleet(t, 1, nil)
	cfg := testConfig(t, f)
	up := countUpstream(t, &cfg)
	rt := startRouter(t, cfg)
	// max_tokens beyond the engine's context window: the engine answers 400.
	body := fmt.Sprintf(`{"model":%q,"prompt":"too long an answer","max_tokens":100000}`, testModel)
	for i := range 5 {
		code, _, raw := post(t, rt.url, "/v1/completions", body)
		if code != http.StatusBadRequest || !strings.Contains(raw, "BadRequestError") {
			t.Fatalf("request %d: %d %s, want the engine's 400 relayed", i, code, raw)
		}
	}
	if n := up["w0"].count(); n != 5 {
		t.Fatalf("the engine saw %d requests, want 5 (a 4xx is not retried)", n)
	}
	if s, n := rt.breakerState("w0"), rt.breakerTrips("w0"); s != float64(BreakerClosed) || n != 0 {
		t.Fatalf("after 5 engine 400s: breaker_state=%v trips=%v, want 0 and 0", s, n)
	}
	if code, _, raw := post(t, rt.url, "/v1/completions", completionBody("fine", 2)); code != http.StatusOK {
		t.Fatalf("a good request after the 400s: %d %s", code, raw)
	}
	rt.assertNoLoad(t, f.ids)
}

// The same holds for prefill workers: once a decision took a half-open prefill
// worker's probe, concurrent decisions pick other prefill workers.
func TestBreakerHalfOpenPrefillWorkerGetsOneProbe(t *testing.T) {
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
	clk := newFakeClock()
	r.breakers.now = clk.Now
	for range 3 {
		r.breakers.Record("p0", OutcomeFailure, false)
	}
	clk.Advance(cfg.BreakerCooldown)
	toP0 := 0
	var ds []*Decision
	for i := range 6 {
		p, err := r.prepare(http.Header{}, "/v1/completions", endpointCompletions, []byte(completionBody(words(fmt.Sprintf("pd %d", i), 50), 2)))
		if err != nil {
			t.Fatal(err)
		}
		d, err := r.decide(context.Background(), p, map[string]bool{}, false)
		if err != nil {
			t.Fatal(err)
		}
		if d.Prefill == nil {
			t.Fatalf("decision %d is not disaggregated", i)
		}
		if d.Prefill.Worker == "p0" {
			toP0++
		}
		ds = append(ds, d)
	}
	for _, d := range ds {
		d.release()
	}
	if toP0 != 1 {
		t.Fatalf("%d of 6 concurrent decisions chose the half-open prefill worker p0, want exactly 1 (the probe)", toP0)
	}
}

// A breaker that stops excluding its worker says so (onUsable), whatever made
// it: the end of the cooldown (its timer, with no request asking), the probe
// handed back, or the breaker closing; the admission queue is woken by it.
func TestBreakerAnnouncesAWorkerItStopsExcluding(t *testing.T) {
	g := newBreakerRig(2, 5*time.Second, time.Minute)
	g.b.afterFunc = g.clk.AfterFunc
	announced := 0
	g.b.onUsable = func() { announced++ }
	step := func(what string, want int, do func()) {
		t.Helper()
		before := announced
		do()
		if got := announced - before; got != want {
			t.Fatalf("%s: announced %d times, want %d", what, got, want)
		}
	}
	step("a failure below the threshold", 0, func() { g.fail(1) })
	step("the failure that opens it", 0, func() { g.fail(1) })
	step("part of the cooldown", 0, func() { g.clk.Advance(4 * time.Second) })
	step("the end of the cooldown", 1, func() { g.clk.Advance(time.Second) })
	// Half-open as soon as the cooldown ends (the state gauge shows it), not
	// only once a decision asks.
	if st, _ := g.b.State("w"); st != BreakerHalfOpen {
		t.Fatalf("state %v at the end of the cooldown, before any decision, want half-open", st)
	}
	if !g.b.Allows("w") {
		t.Fatal("no probe admitted after the cooldown")
	}
	probe := g.b.Begin("w")
	step("an outcome while the probe is out", 0, func() { g.b.Record("w", OutcomeNeutral, false) })
	step("the probe handed back neutral", 1, func() { g.b.Record("w", OutcomeNeutral, probe) })
	g.b.Allows("w")
	probe = g.b.Begin("w")
	step("the failed probe (reopened, cooldown 10s)", 0, func() { g.b.Record("w", OutcomeFailure, probe) })
	step("the first cooldown's length", 0, func() { g.clk.Advance(5 * time.Second) })
	step("a late success of an earlier request, which closes it", 1, func() { g.b.Record("w", OutcomeSuccess, false) })
	step("the end of the cooldown it was closed in", 0, func() { g.clk.Advance(5 * time.Second) })
	step("a success while closed", 0, func() { g.b.Record("w", OutcomeSuccess, false) })
	g.fail(2)
	g.b.stop()
	step("the end of a cooldown after stop", 0, func() { g.clk.Advance(time.Minute) })
}
