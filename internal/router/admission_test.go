package router

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvindex/kvindex/bench/fakeengine"
)

// slots is a fake fleet for the admission queue: decide succeeds while a slot is
// free; freeing one wakes the waiters (as the ledger's Changed does).
type slots struct {
	mu      sync.Mutex
	free    int
	changed chan struct{}
	calls   map[string]int // decide calls per waiter
}

func newSlots() *slots { return &slots{changed: make(chan struct{}), calls: map[string]int{}} }

func (s *slots) Changed() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.changed
}

func (s *slots) release(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.free += n
	close(s.changed)
	s.changed = make(chan struct{})
}

func (s *slots) decide(name string) func() (*Decision, error) {
	return func() (*Decision, error) {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.calls[name]++
		if s.free == 0 {
			return nil, errBusy
		}
		s.free--
		return &Decision{Reason: name}, nil
	}
}

func (s *slots) callsOf(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[name]
}

type admitResult struct {
	name string
	d    *Decision
	err  error
}

// waiters starts the named waiters one after another, each enqueued before the
// next starts, and returns where their results arrive.
func startWaiters(t *testing.T, a *admission, s *slots, ctxs map[string]context.Context, names ...string) <-chan admitResult {
	t.Helper()
	out := make(chan admitResult, len(names))
	for i, name := range names {
		ctx := ctxs[name]
		if ctx == nil {
			ctx = context.Background()
		}
		go func() {
			d, err := a.admit(ctx, "m", s.Changed, s.decide(name))
			out <- admitResult{name, d, err}
		}()
		waitFor(t, 5*time.Second, fmt.Sprintf("%s to be queued", name), func() bool { return a.depth() == i+1 })
	}
	return out
}

func TestAdmissionServesWaitersInArrivalOrderAndOnlyTheHeadDecides(t *testing.T) {
	a := newAdmission(8, time.Minute)
	var mu sync.Mutex
	var depths []int
	a.onDepth = func(n int) { mu.Lock(); depths = append(depths, n); mu.Unlock() }
	s := newSlots()
	res := startWaiters(t, a, s, nil, "first", "second", "third")
	for i, want := range []string{"first", "second", "third"} {
		// Waiters behind the head never decide: those that arrived while others
		// waited joined the queue without trying (no barging past the head).
		for _, behind := range []string{"first", "second", "third"}[i+1:] {
			if n := s.callsOf(behind); n != 0 {
				t.Fatalf("%s (not head) decided %d times, want none", behind, n)
			}
		}
		s.release(1)
		r := <-res
		if r.err != nil || r.name != want || r.d.Reason != want {
			t.Fatalf("admission %d: %s got (%v, %v), want %s admitted", i, r.name, r.d, r.err, want)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if got := fmt.Sprint(depths); got != "[1 2 3 2 1 0]" {
		t.Fatalf("depth hook saw %s, want [1 2 3 2 1 0]", got)
	}
}

// Each pool has its own FIFO: the head of one pool's queue does not hold up a
// waiter of another pool; the queue size bounds them together.
func TestAdmissionPoolsQueueIndependently(t *testing.T) {
	a := newAdmission(2, time.Minute)
	sx, sy := newSlots(), newSlots()
	res := make(chan admitResult, 2)
	for _, w := range []struct {
		pool string
		s    *slots
	}{{"x", sx}, {"y", sy}} {
		go func() {
			d, err := a.admit(context.Background(), w.pool, w.s.Changed, w.s.decide(w.pool))
			res <- admitResult{w.pool, d, err}
		}()
		waitFor(t, 5*time.Second, "the "+w.pool+" waiter to queue", func() bool { return w.s.callsOf(w.pool) >= 1 && a.depth() >= 1 })
	}
	waitFor(t, 5*time.Second, "both waiters to queue", func() bool { return a.depth() == 2 })
	if _, err := a.admit(context.Background(), "z", newSlots().Changed, newSlots().decide("z")); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("a third waiter (another pool) beyond --queue-size 2: %v, want ErrQueueFull", err)
	}
	sy.release(1)
	if r := <-res; r.name != "y" || r.err != nil {
		t.Fatalf("got (%s, %v), want y admitted while x's head still waits", r.name, r.err)
	}
	if a.depth() != 1 {
		t.Fatalf("depth %d, want 1 (x)", a.depth())
	}
	sx.release(1)
	if r := <-res; r.name != "x" || r.err != nil {
		t.Fatalf("got (%s, %v), want x admitted", r.name, r.err)
	}
}

func TestAdmissionRefusesBeyondTheQueueSize(t *testing.T) {
	s := newSlots()
	if _, err := newAdmission(0, time.Minute).admit(context.Background(), "m", s.Changed, s.decide("x")); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("queue size 0: %v, want ErrQueueFull", err)
	}
	a := newAdmission(2, time.Minute)
	res := startWaiters(t, a, s, nil, "a", "b")
	if _, err := a.admit(context.Background(), "m", s.Changed, s.decide("c")); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("third waiter on a queue of 2: %v, want ErrQueueFull", err)
	}
	if a.depth() != 2 {
		t.Fatalf("depth %d after a refusal, want 2", a.depth())
	}
	s.release(2)
	for range 2 {
		if r := <-res; r.err != nil {
			t.Fatalf("%s: %v", r.name, r.err)
		}
	}
}

func TestAdmissionTimesOutHeadAndWaitersBehindIt(t *testing.T) {
	a := newAdmission(4, 150*time.Millisecond)
	s := newSlots()
	res := startWaiters(t, a, s, nil, "head", "behind")
	for range 2 {
		if r := <-res; !errors.Is(r.err, ErrQueueTimeout) {
			t.Fatalf("%s: %v, want ErrQueueTimeout", r.name, r.err)
		}
	}
	if a.depth() != 0 {
		t.Fatalf("depth %d after the timeouts, want 0", a.depth())
	}
}

// A cancelled waiter leaves the queue; when it was head, the next one decides.
func TestAdmissionCancelLeavesTheQueue(t *testing.T) {
	a := newAdmission(4, time.Minute)
	s := newSlots()
	headCtx, cancelHead := context.WithCancelCause(context.Background())
	midCtx, cancelMid := context.WithCancelCause(context.Background())
	res := startWaiters(t, a, s, map[string]context.Context{"head": headCtx, "mid": midCtx}, "head", "mid", "last")
	gone := errors.New("client went away")
	cancelMid(gone)
	if r := <-res; r.name != "mid" || !errors.Is(r.err, gone) {
		t.Fatalf("%s: %v, want mid to leave with its cancel cause", r.name, r.err)
	}
	if a.depth() != 2 {
		t.Fatalf("depth %d after mid left, want 2", a.depth())
	}
	s.mu.Lock()
	s.free = 1 // freed without a wake-up: only a new head deciding can take it
	s.mu.Unlock()
	cancelHead(gone)
	for _, want := range []string{"head", "last"} {
		r := <-res
		if r.name != want {
			t.Fatalf("got %s, want %s", r.name, want)
		}
		if want == "last" && (r.err != nil || r.d.Reason != "last") {
			t.Fatalf("last, head after the head left: (%v, %v), want admitted", r.d, r.err)
		}
	}
	if a.depth() != 0 {
		t.Fatalf("depth %d, want 0", a.depth())
	}
}

func TestAdmissionPassesNonBusyAnswersThrough(t *testing.T) {
	a := newAdmission(4, time.Minute)
	calls := 0
	_, err := a.admit(context.Background(), "m", func() <-chan struct{} { return nil }, func() (*Decision, error) {
		calls++
		return nil, ErrNoWorkers
	})
	if !errors.Is(err, ErrNoWorkers) || calls != 1 || a.depth() != 0 {
		t.Fatalf("got %v after %d calls (depth %d), want ErrNoWorkers at once, unqueued", err, calls, a.depth())
	}
}

// --- end to end ---

// oneSlowWorker is one engine that hangs hang before every answer, behind a
// router with --max-pending 1.
func oneSlowWorker(t *testing.T, hang time.Duration, adjust func(*Config)) (*testRouter, *fleet, map[string]*upstreamCounter) {
	t.Helper()
	f := startFleet(t, 1, func(_ int, c *fakeengine.Config) { c.Faults.HangBeforeFirstToken = hang })
	cfg := testConfig(t, f)
	cfg.MaxPending = 1
	adjust(&cfg)
	up := countUpstream(t, &cfg)
	return startRouter(t, cfg), f, up
}

// startHanging sends a request in the background and waits until it holds w0.
func startHanging(t *testing.T, rt *testRouter, wg *sync.WaitGroup, codes chan<- int) {
	t.Helper()
	wg.Add(1)
	go func() {
		defer wg.Done()
		code, _, _ := post(t, rt.url, "/v1/completions", completionBody("the first request", 2))
		codes <- code
	}()
	waitFor(t, 5*time.Second, "the first request to be in flight on w0", func() bool {
		return rt.ledger.Load(Target{Worker: "w0"}).InFlight == 1
	})
}

// A request for a worker that is full (--max-pending) or busy (a busy threshold)
// waits in the queue and is served when the first one lets go, instead of being
// refused or sent anyway.
func TestAdmissionEndToEndASecondRequestWaitsForTheFullWorker(t *testing.T) {
	for _, tc := range []struct {
		name   string
		adjust func(*Config)
		reason string
		// oneAtATime: the first request holds the limit to its end, so the engine
		// never sees both at once (a prefill threshold frees at the first byte).
		oneAtATime bool
	}{
		{"max-pending", func(*Config) {}, ExcludeFull, true},
		{"max-active-decode-blocks", func(c *Config) { c.MaxPending, c.MaxActiveDecodeBlocks = 0, 1 }, ExcludeBusy, true},
		{"max-active-prefill-tokens", func(c *Config) { c.MaxPending, c.MaxActivePrefillTokens = 0, 1 }, ExcludeBusy, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rt, f, up := oneSlowWorker(t, time.Second, tc.adjust)
			var wg sync.WaitGroup
			codes := make(chan int, 2)
			startHanging(t, rt, &wg, codes)
			wg.Add(1)
			go func() {
				defer wg.Done()
				code, _, _ := post(t, rt.url, "/v1/completions", completionBody("the second request", 2))
				codes <- code
			}()
			waitFor(t, 5*time.Second, "the second request to queue", func() bool {
				return testutil.ToFloat64(rt.metrics.queueDepth) == 1
			})
			wg.Wait()
			for range 2 {
				if c := <-codes; c != http.StatusOK {
					t.Fatalf("a request got %d, want both served", c)
				}
			}
			if got := testutil.ToFloat64(rt.metrics.excluded.WithLabelValues(tc.reason)); got < 1 {
				t.Errorf("excluded{reason=%s} = %v, want the waiting request's exclusions counted", tc.reason, got)
			}
			if n, m := up["w0"].count(), up["w0"].maxIn.Load(); n != 2 || tc.oneAtATime && m != 1 {
				t.Fatalf("the engine got %d requests with at most %d at once, want 2 and 1", n, m)
			}
			if q := testutil.ToFloat64(rt.metrics.queueDepth); q != 0 {
				t.Fatalf("queue depth %v after both finished, want 0", q)
			}
			rt.assertNoLoad(t, f.ids)
		})
	}
}

func TestAdmissionEndToEndRefusesWith429AndRetryAfter(t *testing.T) {
	for _, tc := range []struct {
		name, reason string
		adjust       func(*Config)
	}{
		{"queue full", "queue_full", func(c *Config) { c.QueueSize = 0 }},
		{"queue timeout", "queue_timeout", func(c *Config) { c.QueueSize = 4; c.QueueTimeout = 100 * time.Millisecond }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rt, f, up := oneSlowWorker(t, 1500*time.Millisecond, tc.adjust)
			var wg sync.WaitGroup
			codes := make(chan int, 1)
			startHanging(t, rt, &wg, codes)

			req, _ := http.NewRequest(http.MethodPost, rt.url+"/v1/completions", strings.NewReader(completionBody("refused", 2)))
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			var body errorBody
			decErr := json.NewDecoder(resp.Body).Decode(&body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
				t.Fatalf("extra request: %d Retry-After=%q, want 429 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
			}
			if decErr != nil || body.Error.Type != "RateLimitError" || body.Error.Code != 429 || body.Error.Message == "" {
				t.Fatalf("429 body %+v (%v), want an OpenAI RateLimitError", body, decErr)
			}
			if got := testutil.ToFloat64(rt.metrics.rejected.WithLabelValues(tc.reason)); got != 1 {
				t.Fatalf("rejected{reason=%s} = %v, want 1", tc.reason, got)
			}
			wg.Wait()
			if c := <-codes; c != http.StatusOK {
				t.Fatalf("the first request got %d", c)
			}
			if n := up["w0"].count(); n != 1 {
				t.Fatalf("the engine got %d requests, want 1: the refused one must not reach it", n)
			}
			rt.assertNoLoad(t, f.ids)
		})
	}
}

// The queue must not let a request for one model hold up requests for another:
// a waiter for model B, whose only worker frees up after 200ms, is served before
// the waiter ahead of it, which waits for model A's worker (busy for 3s) until
// its queue timeout.
func TestAdmissionWaiterIsNotBlockedByAnotherModelsHead(t *testing.T) {
	const modelB = "test/model-b"
	f := startFleet(t, 2, func(i int, c *fakeengine.Config) {
		c.Faults.HangBeforeFirstToken = 3 * time.Second
		if i == 1 {
			c.Model = modelB
			c.Faults.HangBeforeFirstToken = 200 * time.Millisecond
		}
	})
	cfg := testConfig(t, f)
	cfg.MaxPending = 1
	cfg.QueueTimeout = 2500 * time.Millisecond
	rt := startRouter(t, cfg)
	var wg sync.WaitGroup
	var mu sync.Mutex
	codes := map[string]int{}
	var order []string
	send := func(name, model string) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, _, _ := post(t, rt.url, "/v1/completions", fmt.Sprintf(`{"model":%q,"prompt":%s,"max_tokens":2}`, model, quote(name)))
			mu.Lock()
			codes[name] = code
			order = append(order, name)
			mu.Unlock()
		}()
	}
	send("a1", testModel)
	send("b1", modelB)
	waitFor(t, 5*time.Second, "a1 and b1 in flight", func() bool {
		return rt.ledger.Load(Target{Worker: "w0"}).InFlight == 1 && rt.ledger.Load(Target{Worker: "w1"}).InFlight == 1
	})
	send("a2", testModel)
	waitFor(t, 5*time.Second, "a2 to queue", func() bool { return rt.adm.depth() == 1 })
	send("b2", modelB)
	waitFor(t, 5*time.Second, "b2 to queue", func() bool { return rt.adm.depth() == 2 })
	wg.Wait()
	if codes["a1"] != http.StatusOK || codes["b1"] != http.StatusOK || codes["b2"] != http.StatusOK {
		t.Errorf("a1/b1/b2 got %d/%d/%d, want 200s", codes["a1"], codes["b1"], codes["b2"])
	}
	if codes["a2"] != http.StatusTooManyRequests {
		t.Errorf("a2 got %d, want 429 (its model's worker stayed busy past the queue timeout)", codes["a2"])
	}
	if fmt.Sprint(order) != "[b1 b2 a2 a1]" {
		t.Errorf("requests finished in the order %v, want [b1 b2 a2 a1]: b2 must not wait behind a2, which waits for another model", order)
	}
	rt.assertNoLoad(t, f.ids)
}

// Requests share an admission queue exactly when they draw from the same
// candidates: the model as requested (base or LoRA adapter), the EPP's subset
// hint (in any order) and the workers already tried.
func TestQueueKeyNamesTheCandidateSet(t *testing.T) {
	req := func(model, subset string) *prepared {
		return &prepared{route: RouteRequest{Model: model, BaseModel: testModel}, subset: subset}
	}
	for _, c := range []struct {
		name   string
		a, b   string
		shared bool
	}{
		{"same model", queueKey(req(testModel, ""), nil), queueKey(req(testModel, ""), nil), true},
		{"base model and its adapter", queueKey(req(testModel, ""), nil), queueKey(req("sql-adapter", ""), nil), false},
		{"two adapters", queueKey(req("sql-adapter", ""), nil), queueKey(req("chat-adapter", ""), nil), false},
		{"a hint and none", queueKey(req(testModel, "hint:10.0.0.1:8000"), nil), queueKey(req(testModel, ""), nil), false},
		{"an empty hint and none", queueKey(req(testModel, "hint:"), nil), queueKey(req(testModel, ""), nil), false},
		{"two hints", queueKey(req(testModel, "hint:10.0.0.1:8000"), nil), queueKey(req(testModel, "hint:10.0.0.2:8000"), nil), false},
		{"a retry and a first try", queueKey(req(testModel, ""), map[string]bool{"w0": true}), queueKey(req(testModel, ""), nil), false},
		{"retries after the same failures", queueKey(req(testModel, ""), map[string]bool{"w0": true, "w1": true}),
			queueKey(req(testModel, ""), map[string]bool{"w1": true, "w0": true}), true},
		{"retries after different failures", queueKey(req(testModel, ""), map[string]bool{"w0": true}),
			queueKey(req(testModel, ""), map[string]bool{"w1": true}), false},
	} {
		if got := c.a == c.b; got != c.shared {
			t.Errorf("%s: keys %q and %q shared %v, want %v", c.name, c.a, c.b, got, c.shared)
		}
	}
}

// A request whose candidates are free is served at once, though a request for
// other candidates waits: a base-model request with an idle worker must not
// wait behind an adapter request whose only worker is full (head-of-line
// blocking until that one is served or times out).
func TestAdmissionRequestWithAFreeWorkerDoesNotWaitBehindAnAdaptersQueue(t *testing.T) {
	const adapter = "sql-adapter"
	f := startFleet(t, 2, func(i int, c *fakeengine.Config) {
		if i == 0 {
			c.LoRAModules = []string{adapter}
			c.Faults.HangBeforeFirstToken = 4 * time.Second
		}
	})
	cfg := testConfig(t, f)
	cfg.MaxPending = 1
	cfg.QueueTimeout = 20 * time.Second // the adapter's waiter is served when w0 frees, not timed out
	rt := startRouter(t, cfg)
	waitFor(t, 10*time.Second, "the router to learn w0's adapter", func() bool {
		w := rt.fleet.View().byID["w0"]
		_, ok := w.Serves(adapter)
		return ok
	})
	body := fmt.Sprintf(`{"model":%q,"prompt":%s,"max_tokens":1}`, adapter, quote(words("lora", 20)))
	codes := make(chan int, 2)
	for i, what := range []string{"the first adapter request to hold w0", "the second to queue for w0"} {
		go func() {
			code, _, _ := post(t, rt.url, "/v1/completions", body)
			codes <- code
		}()
		waitFor(t, 10*time.Second, what, func() bool {
			return rt.ledger.Load(Target{Worker: "w0"}).InFlight == 1 && rt.adm.depth() == i
		})
	}
	resp, raw := send(t, rt.url, "/v1/completions", completionBody(words("base", 20), 1))
	if resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderServedBy) != "w1" {
		t.Fatalf("base-model request: %d by %q (%s), want 200 by the idle w1", resp.StatusCode, resp.Header.Get(HeaderServedBy), raw)
	}
	if n := rt.adm.depth(); n != 1 {
		t.Fatalf("%d waiting when the base-model request was answered, want the adapter's waiter still queued: the base-model request waited behind it", n)
	}
	for range 2 {
		if c := <-codes; c != http.StatusOK {
			t.Fatalf("an adapter request got %d, want both served on w0 in turn", c)
		}
	}
	rt.assertNoLoad(t, f.ids)
}

// A request naming its worker (direct mode) is never busy, so it never waits in
// the queue, not even behind a policy-routed request of its model that waits.
func TestAdmissionDirectRequestNeverQueues(t *testing.T) {
	f := startFleet(t, 1, func(_ int, c *fakeengine.Config) { c.Faults.HangBeforeFirstToken = 4 * time.Second })
	cfg := testConfig(t, f)
	cfg.Mode = ModeDirect
	cfg.MaxPending = 1
	cfg.QueueTimeout = 20 * time.Second
	rt := startRouter(t, cfg)
	w0 := Target{Worker: "w0"}
	codes := make(chan int, 3)
	postAsync := func(name string, header ...string) {
		go func() {
			code, _, _ := post(t, rt.url, "/v1/completions", completionBody(name, 1), header...)
			codes <- code
		}()
	}
	postAsync("held by the policy's pick")
	waitFor(t, 10*time.Second, "the first request to hold w0", func() bool { return rt.ledger.Load(w0).InFlight == 1 })
	postAsync("queued for the policy")
	waitFor(t, 10*time.Second, "the second request to queue", func() bool { return rt.adm.depth() == 1 })
	postAsync("direct to w0", "X-Worker-Instance-Id", "w0")
	waitFor(t, 10*time.Second, "the direct request in flight beside the first while the second still waits", func() bool {
		return rt.ledger.Load(w0).InFlight == 2 && rt.adm.depth() == 1
	})
	for range 3 {
		if c := <-codes; c != http.StatusOK {
			t.Fatalf("a request got %d, want all three served", c)
		}
	}
	rt.assertNoLoad(t, f.ids)
}
