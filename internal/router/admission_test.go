package router

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvindex/kvindex/bench/fakeengine"
	"github.com/kvindex/kvindex/internal/workerspec"
)

// slots is a fake fleet for the admission queue: workers with free slots. A
// request's decide takes a slot on the first worker of its set that has one and
// is not held for an earlier waiter; freeing one wakes the waiters (as the
// ledger's Changed does).
type slots struct {
	mu      sync.Mutex
	free    map[string]int // by worker
	changed chan struct{}
	calls   map[string]int // decide calls per waiter
}

func newSlots() *slots {
	return &slots{free: map[string]int{}, changed: make(chan struct{}), calls: map[string]int{}}
}

func (s *slots) Changed() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.changed
}

func (s *slots) release(worker string, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.free[worker] += n
	close(s.changed)
	s.changed = make(chan struct{})
}

// decide is the decision of the waiter name, whose candidates are set (w0 when
// empty); the Decision's Reason names the waiter.
func (s *slots) decide(name string, set ...string) func(held func(*Worker) bool) (*Decision, error) {
	if len(set) == 0 {
		set = []string{"w0"}
	}
	return func(held func(*Worker) bool) (*Decision, error) {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.calls[name]++
		for _, w := range set {
			if s.free[w] > 0 && !held(&Worker{ID: w}) {
				s.free[w]--
				return &Decision{Reason: name, Target: Target{Worker: w}}, nil
			}
		}
		return nil, errBusy
	}
}

// servesOf is the candidate set of workers (w0 when empty).
func servesOf(set ...string) func(*Worker) bool {
	if len(set) == 0 {
		set = []string{"w0"}
	}
	return func(w *Worker) bool { return slices.Contains(set, w.ID) }
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
			d, err := a.admit(ctx, "m", servesOf(), s.Changed, s.decide(name))
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
		s.release("w0", 1)
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
			d, err := a.admit(context.Background(), w.pool, servesOf("w"+w.pool), w.s.Changed, w.s.decide(w.pool, "w"+w.pool))
			res <- admitResult{w.pool, d, err}
		}()
		waitFor(t, 5*time.Second, "the "+w.pool+" waiter to queue", func() bool { return w.s.callsOf(w.pool) >= 1 && a.depth() >= 1 })
	}
	waitFor(t, 5*time.Second, "both waiters to queue", func() bool { return a.depth() == 2 })
	if _, err := a.admit(context.Background(), "z", servesOf("wz"), newSlots().Changed, newSlots().decide("z", "wz")); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("a third waiter (another pool) beyond --queue-size 2: %v, want ErrQueueFull", err)
	}
	sy.release("wy", 1)
	if r := <-res; r.name != "y" || r.err != nil {
		t.Fatalf("got (%s, %v), want y admitted while x's head still waits", r.name, r.err)
	}
	if a.depth() != 1 {
		t.Fatalf("depth %d, want 1 (x)", a.depth())
	}
	sx.release("wx", 1)
	if r := <-res; r.name != "x" || r.err != nil {
		t.Fatalf("got (%s, %v), want x admitted", r.name, r.err)
	}
}

// admitAsync runs one request through the admission queue as the waiter name
// of queue (its candidate set, which is also its queue) and sends its result.
func admitAsync(ctx context.Context, a *admission, s *slots, res chan<- admitResult, name string, set ...string) {
	go func() {
		d, err := a.admit(ctx, name, servesOf(set...), s.Changed, s.decide(name, set...))
		res <- admitResult{name, d, err}
	}()
}

func nextResult(t *testing.T, res <-chan admitResult, what string) admitResult {
	t.Helper()
	select {
	case r := <-res:
		return r
	case <-time.After(10 * time.Second):
		t.Fatalf("nobody admitted within 10s: %s", what)
	}
	return admitResult{}
}

// Queues of different candidate sets share workers: when one frees, every head
// is woken, and the oldest waiter whose set includes that worker gets it,
// whichever head decides first; a later waiter of another set does not win it
// by a race.
func TestAdmissionAFreedWorkerGoesToTheOldestWaiterThatCanUseIt(t *testing.T) {
	a := newAdmission(8, time.Minute)
	s := newSlots()
	res := make(chan admitResult, 4)
	for i, w := range []struct {
		name string
		set  []string
	}{{"A", []string{"w0"}}, {"B", []string{"w0", "w1"}}, {"C", []string{"w1"}}, {"D", []string{"w0"}}} {
		admitAsync(context.Background(), a, s, res, w.name, w.set...)
		waitFor(t, 5*time.Second, w.name+" to queue", func() bool { return a.depth() == i+1 })
	}
	for _, step := range []struct{ free, want string }{{"w1", "B"}, {"w0", "A"}, {"w1", "C"}, {"w0", "D"}} {
		s.release(step.free, 1)
		r := nextResult(t, res, step.free+" freed")
		if r.err != nil || r.name != step.want || r.d.Target.Worker != step.free {
			t.Fatalf("%s freed: %s got (%v, %v), want %s, the oldest waiter that can use it, admitted there", step.free, r.name, r.d, r.err, step.want)
		}
	}
}

// A worker can free without load going down (a breaker's cooldown ends, the
// fleet grows), so nothing wakes the waiters: a later request of another set
// that finds it free leaves it to the older waiter that can use it and wakes
// that one, and waits itself.
func TestAdmissionALaterRequestLeavesAFreeWorkerToAnOlderWaiter(t *testing.T) {
	a := newAdmission(8, time.Minute)
	s := newSlots()
	res := make(chan admitResult, 2)
	admitAsync(context.Background(), a, s, res, "old", "w0")
	waitFor(t, 5*time.Second, "old to queue", func() bool { return a.depth() == 1 })
	s.mu.Lock()
	s.free["w0"] = 1 // freed without a wake-up
	s.mu.Unlock()
	admitAsync(context.Background(), a, s, res, "new", "w0", "w1")
	if r := nextResult(t, res, "w0 free"); r.err != nil || r.name != "old" || r.d.Target.Worker != "w0" {
		t.Fatalf("%s got (%v, %v), want old admitted on w0: new came later", r.name, r.d, r.err)
	}
	waitFor(t, 5*time.Second, "new to wait", func() bool { return a.depth() == 1 })
	s.release("w1", 1)
	if r := nextResult(t, res, "w1 freed"); r.err != nil || r.name != "new" || r.d.Target.Worker != "w1" {
		t.Fatalf("%s got (%v, %v), want new admitted on w1", r.name, r.d, r.err)
	}
}

// A waiter that leaves hands on the workers it held: here the older waiter
// cannot take the freed w0 (it needs more than w0, which stays busy), so the
// later one waits for it; when the older one is cancelled, the later one gets
// w0 at once, not at the next release.
func TestAdmissionAWaiterThatLeavesHandsTheWorkersItHeldOn(t *testing.T) {
	a := newAdmission(8, time.Minute)
	s := newSlots()
	res := make(chan admitResult, 2)
	oldCtx, cancelOld := context.WithCancelCause(context.Background())
	go func() {
		// Its candidates include w0, but it also needs a prefill worker, which
		// stays busy.
		needsMore := func(func(*Worker) bool) (*Decision, error) { return nil, errBusy }
		d, err := a.admit(oldCtx, "old", servesOf("w0"), s.Changed, needsMore)
		res <- admitResult{"old", d, err}
	}()
	waitFor(t, 5*time.Second, "old to queue", func() bool { return a.depth() == 1 })
	admitAsync(context.Background(), a, s, res, "new", "w0")
	waitFor(t, 5*time.Second, "new to queue", func() bool { return a.depth() == 2 })
	before := s.callsOf("new")
	s.release("w0", 1)
	waitFor(t, 5*time.Second, "new to decide after the release", func() bool { return s.callsOf("new") > before })
	select {
	case r := <-res:
		t.Fatalf("%s returned (%v, %v) while old waited: w0 is left to old", r.name, r.d, r.err)
	default:
	}
	gone := errors.New("client went away")
	cancelOld(gone)
	got := map[string]admitResult{}
	for range 2 {
		r := nextResult(t, res, "old cancelled")
		got[r.name] = r
	}
	if r := got["old"]; !errors.Is(r.err, gone) {
		t.Fatalf("old: %v, want its cancel cause", r.err)
	}
	if r := got["new"]; r.err != nil || r.d == nil || r.d.Target.Worker != "w0" {
		t.Fatalf("new: (%v, %v), want admitted on w0 once old left", r.d, r.err)
	}
}

func TestAdmissionRefusesBeyondTheQueueSize(t *testing.T) {
	s := newSlots()
	if _, err := newAdmission(0, time.Minute).admit(context.Background(), "m", servesOf(), s.Changed, s.decide("x")); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("queue size 0: %v, want ErrQueueFull", err)
	}
	a := newAdmission(2, time.Minute)
	res := startWaiters(t, a, s, nil, "a", "b")
	if _, err := a.admit(context.Background(), "m", servesOf(), s.Changed, s.decide("c")); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("third waiter on a queue of 2: %v, want ErrQueueFull", err)
	}
	if a.depth() != 2 {
		t.Fatalf("depth %d after a refusal, want 2", a.depth())
	}
	s.release("w0", 2)
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
	s.free["w0"] = 1 // freed without a wake-up: only a new head deciding can take it
	s.mu.Unlock()
	cancelHead(gone)
	// The head's leaving starts last's turn before the head's admit returns, so
	// either result may come first.
	got := map[string]admitResult{}
	for range 2 {
		r := <-res
		got[r.name] = r
	}
	if r := got["head"]; !errors.Is(r.err, gone) {
		t.Fatalf("head: %v, want its cancel cause", r.err)
	}
	if r := got["last"]; r.err != nil || r.d == nil || r.d.Reason != "last" {
		t.Fatalf("last, head after the head left: (%v, %v), want admitted", r.d, r.err)
	}
	if a.depth() != 0 {
		t.Fatalf("depth %d, want 0", a.depth())
	}
}

func TestAdmissionPassesNonBusyAnswersThrough(t *testing.T) {
	a := newAdmission(4, time.Minute)
	calls := 0
	_, err := a.admit(context.Background(), "m", servesOf(), func() <-chan struct{} { return nil }, func(func(*Worker) bool) (*Decision, error) {
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
		code, _, _ := postAside(t, rt.url, "/v1/completions", completionBody("the first request", 2))
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
				code, _, _ := postAside(t, rt.url, "/v1/completions", completionBody("the second request", 2))
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
			code, _, _ := postAside(t, rt.url, "/v1/completions", fmt.Sprintf(`{"model":%q,"prompt":%s,"max_tokens":2}`, model, quote(name)))
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
			code, _, _ := postAside(t, rt.url, "/v1/completions", body)
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
			code, _, _ := postAside(t, rt.url, "/v1/completions", completionBody(name, 1), header...)
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

// Queues of different candidate sets share workers, and a worker that frees goes
// to the oldest waiter that can use it, whichever queue it is in: a later request
// of another set neither takes it on arrival nor wins it from the older waiter
// when both are woken. Through the EPP, whose subset hints make the sets: A
// (hint w0,w1) waits while w0 is full and w1's breaker is open; when w1's
// cooldown ends (no load went down, so nothing woke A), B (no hint), which came
// later, must not take w1 from A. Then B and C (hint w0, later than B) both wait
// for w0: when it frees, B gets it, and C only after B.
func TestAdmissionAFreedWorkerGoesToTheOldestWaiterOfAnySet(t *testing.T) {
	f := startFleet(t, 2, nil)
	cfg := testConfig(t, f)
	cfg.MaxPending = 1
	cfg.QueueTimeout = 30 * time.Second
	cfg.BreakerCooldown, cfg.BreakerMaxCooldown = 5*time.Second, time.Minute
	clk := newFakeClock()
	rt, client, _ := startEPPWith(t, cfg, func(r *Router) { r.breakers.now = clk.Now })
	w0 := strings.TrimPrefix(f.engines["w0"].URL(), "http://")
	w1 := strings.TrimPrefix(f.engines["w1"].URL(), "http://")
	q := newEPPRequests(t, client)
	queued := func(n int, what string) {
		t.Helper()
		waitFor(t, 10*time.Second, what, func() bool { return rt.adm.depth() == n })
	}

	for range rt.cfg.BreakerFailureThreshold {
		rt.breakers.Record("w1", OutcomeFailure, false)
	}
	q.send("hold", nil)
	if a := q.next("the first request"); a.dest != w0 {
		t.Fatalf("the first request got %q, want w0 (w1's breaker is open)", a.dest)
	}
	q.send("A", subsetMetadata(w0, w1))
	queued(1, "A to queue: w0 is full, w1's breaker open")
	// Only the breakers' clock is fake, not their timers: the end of the
	// cooldown wakes nobody here, and B's arrival must leave w1 to A.
	clk.Advance(cfg.BreakerCooldown)
	q.send("B", nil)
	if a := q.next("A or B to be admitted on w1"); a.who != "A" || a.dest != w1 {
		t.Fatalf("%s was admitted to %q while A, which came first and can use the half-open w1, waited; want A on w1", a.who, a.dest)
	}
	queued(1, "B to wait: w0 and w1 are full")

	q.send("C", subsetMetadata(w0))
	queued(2, "C to queue behind B")
	q.exchanges["hold"].cancel() // w0 frees: B and C can use it, B came first
	if a := q.next("B or C to be admitted on w0"); a.who != "B" || a.dest != w0 {
		t.Fatalf("%s was admitted to %q when w0 freed; want B, which waited longer than C", a.who, a.dest)
	}
	queued(1, "C to wait for w0 again")
	q.exchanges["A"].cancel() // w1 frees: C cannot use it
	q.exchanges["B"].cancel() // w0 frees: C's turn
	if a := q.next("C to be admitted"); a.who != "C" || a.dest != w0 {
		t.Fatalf("%s was admitted to %q, want C on w0", a.who, a.dest)
	}
	q.exchanges["C"].cancel()
	rt.assertNoLoad(t, f.ids)
}

// dryRunAnswer is a POST /debug/route answer as the wire has it.
type dryRunAnswer struct {
	Worker   string      `json:"worker"`
	Excluded []Exclusion `json:"excluded"`
	Wait     *struct {
		Reason string   `json:"reason"`
		Ahead  int      `json:"queued_ahead"`
		Held   []string `json:"held_for_earlier"`
	} `json:"wait"`
}

// The dry run (POST /debug/route) decides as the admission queue decides a
// request on arrival, without its side effects. A worker that an older waiter
// of another candidate set can use is left to it where the real decision
// leaves it (excluded as "queued"); a request the real path would queue is
// shown waiting, with the workers it leaves to earlier waiters or the requests
// of its own set ahead of it; one the real path would refuse gets the same
// 429. The dry run neither wakes the older waiter nor holds load; the real
// decision that leaves it a worker wakes it.
func TestDryRunLeavesAWorkerToAnOlderWaiterAsTheRealDecisionDoes(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Policy = PolicyLeastLoaded
	cfg.BlockSize = 4
	cfg.MaxPending = 2
	cfg.QueueSize = 3
	for _, id := range []string{"w0", "w1"} {
		cfg.Workers = append(cfg.Workers, workerspec.Spec{ID: id, Model: testModel, HTTP: "http://127.0.0.1:9"})
	}
	r, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.close()
	body := completionBody(words("dry run", 20), 2)
	dry := func(what string) (int, dryRunAnswer) {
		t.Helper()
		rec := httptest.NewRecorder()
		r.handleDebugRoute(rec, httptest.NewRequest(http.MethodPost, "/debug/route", strings.NewReader(body)))
		var a dryRunAnswer
		if rec.Code == http.StatusOK {
			if err := json.Unmarshal(rec.Body.Bytes(), &a); err != nil {
				t.Fatalf("%s: /debug/route answered %q: %v", what, rec.Body, err)
			}
		}
		if n := len(r.ledger.Loads()); n != 1 {
			t.Fatalf("%s: load on %d targets after the dry run, want only w0's", what, n)
		}
		return rec.Code, a
	}
	prepare := func() *prepared {
		t.Helper()
		p, err := r.prepare(http.Header{}, "/v1/completions", endpointCompletions, []byte(body))
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	// waits runs the real request until it is queued, with the others waiting
	// (queued) beside it, then cancels it: it must not have been decided.
	waits := func(what string, queued int) {
		t.Helper()
		ctx, cancel := context.WithCancelCause(context.Background())
		defer cancel(nil)
		res := make(chan admitResult, 1)
		p := prepare()
		go func() {
			d, err := r.admit(ctx, p, map[string]bool{})
			res <- admitResult{"real", d, err}
		}()
		waitFor(t, 10*time.Second, what+": the real request to queue", func() bool { return r.adm.depth() == queued+1 })
		gone := errors.New("client went away")
		cancel(gone)
		if got := nextResult(t, res, what+": the real request to give up"); !errors.Is(got.err, gone) {
			t.Fatalf("%s: the real request got (%v, %v), want it waiting until cancelled", what, got.d, got.err)
		}
	}

	w0 := Target{Worker: "w0"}
	load := r.ledger.Reserve(w0, Demand{})
	defer load.Release()
	if code, a := dry("nobody waits"); code != http.StatusOK || a.Worker != "w1" || a.Wait != nil {
		t.Fatalf("nobody waits, w0 has a request in flight: %d %+v, want w1, the least-loaded pick", code, a)
	}

	// An older request of another candidate set waits, and can use w1.
	older, err := r.adm.enqueue("sql-adapter", servesOf("w1"))
	if err != nil {
		t.Fatal(err)
	}
	defer r.adm.leave("sql-adapter", older)
	code, a := dry("w1 held")
	if held := (Exclusion{Target{Worker: "w1"}, ExcludeQueued}); code != http.StatusOK || a.Worker != "w0" || a.Wait != nil || !slices.Contains(a.Excluded, held) {
		t.Fatalf("an older waiter can use w1: %d %+v, want w0, with w1 excluded as queued", code, a)
	}
	if len(older.poke) != 0 {
		t.Fatal("the dry run woke the older waiter")
	}
	d, err := r.admit(context.Background(), prepare(), map[string]bool{})
	if err != nil || d.Target.Worker != a.Worker {
		t.Fatalf("the real decision: (%v, %v), the dry run showed %s", d, err, a.Worker)
	}
	d.release()
	if len(older.poke) != 1 {
		t.Fatal("the real decision left w1 to the older waiter without waking it")
	}
	<-older.poke

	// w0 full (--max-pending 2): the only free worker is the older waiter's.
	full := r.ledger.Reserve(w0, Demand{})
	defer full.Release()
	code, a = dry("w0 full, w1 held")
	if code != http.StatusOK || a.Worker != "" || a.Wait == nil || !slices.Equal(a.Wait.Held, []string{"w1"}) || a.Wait.Ahead != 0 {
		t.Fatalf("w0 full and w1 held for an older waiter: %d %+v (wait %+v), want no worker, waiting, w1 held", code, a, a.Wait)
	}
	if len(older.poke) != 0 {
		t.Fatal("the dry run woke the older waiter")
	}
	waits("w0 full, w1 held", 1)

	// A request of its own set waits already: it would queue behind it.
	same, err := r.adm.enqueue(testModel, servesOf("w0", "w1"))
	if err != nil {
		t.Fatal(err)
	}
	defer r.adm.leave(testModel, same)
	code, a = dry("one of its set ahead")
	if code != http.StatusOK || a.Worker != "" || a.Wait == nil || a.Wait.Ahead != 1 {
		t.Fatalf("one request of its set waits: %d %+v (wait %+v), want no worker, waiting behind 1", code, a, a.Wait)
	}
	waits("one of its set ahead", 2)

	// The queue full (--queue-size 3): both refuse.
	last, err := r.adm.enqueue(testModel, servesOf("w0", "w1"))
	if err != nil {
		t.Fatal(err)
	}
	defer r.adm.leave(testModel, last)
	if code, a := dry("queue full"); code != http.StatusTooManyRequests {
		t.Fatalf("the queue full: %d %+v, want 429", code, a)
	}
	if _, err := r.admit(context.Background(), prepare(), map[string]bool{}); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("the real request with the queue full: %v, want ErrQueueFull", err)
	}
}

// eppRequests plays Envoy for several requests at once, each on its own
// ext_proc stream, kept open (the request in flight) until the test cancels it.
type eppRequests struct {
	t         *testing.T
	client    extprocv3.ExternalProcessorClient
	answers   chan eppDest
	exchanges map[string]*envoy // by request name; used by the test's goroutine only
}

// eppDest is where the EPP sent the request who: the destination header, or
// "immediate " and the status of its immediate response.
type eppDest struct{ who, dest string }

func newEPPRequests(t *testing.T, client extprocv3.ExternalProcessorClient) *eppRequests {
	return &eppRequests{t: t, client: client, answers: make(chan eppDest, 16), exchanges: map[string]*envoy{}}
}

// send starts the request who (a completion; md: its metadata, such as a
// subset hint) in the background; next returns its answer.
func (q *eppRequests) send(who string, md *corev3.Metadata) {
	e := newEnvoy(q.t, q.client, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED)
	q.exchanges[who] = e
	go func() {
		a, err := e.tryRequest("/v1/completions", completionBody(words(who, 20), 2), md)
		dest := a.header[EPPDestinationHeader]
		switch {
		case err != nil:
			q.t.Errorf("%s: %v", who, err)
			dest = "failed"
		case a.immediate != nil:
			dest = "immediate " + a.immediate.Status.Code.String()
		}
		q.answers <- eppDest{who, dest}
	}()
}

// next is the next answer; what says what the test waits for.
func (q *eppRequests) next(what string) eppDest {
	q.t.Helper()
	select {
	case a := <-q.answers:
		return a
	case <-time.After(20 * time.Second):
		q.t.Fatalf("no answer within 20s while waiting for %s", what)
	}
	return eppDest{}
}

// A worker can become usable while no load goes down and no request arrives:
// its breaker's cooldown ends. The request waiting for it (its other worker is
// full) is admitted then, not at its queue timeout.
func TestAdmissionAWaiterIsWokenWhenABreakersCooldownEnds(t *testing.T) {
	f := startFleet(t, 2, nil)
	cfg := testConfig(t, f)
	cfg.MaxPending = 1
	cfg.QueueTimeout = time.Minute // longer than next waits: only a wake-up admits A in time
	cfg.BreakerCooldown, cfg.BreakerMaxCooldown = 5*time.Second, time.Minute
	clk := newFakeClock()
	rt, client, _ := startEPPWith(t, cfg, clk.drive)
	eps := f.endpoints()
	q := newEPPRequests(t, client)
	for range rt.cfg.BreakerFailureThreshold {
		rt.breakers.Record("w1", OutcomeFailure, false)
	}
	q.send("hold", nil)
	if a := q.next("the first request"); eps[a.dest] != "w0" {
		t.Fatalf("the first request got %q, want w0 (w1's breaker is open)", a.dest)
	}
	q.send("A", nil)
	waitFor(t, 10*time.Second, "A to queue: w0 is full, w1's breaker open", func() bool { return rt.adm.depth() == 1 })
	clk.Advance(cfg.BreakerCooldown)
	if a := q.next("A to be admitted when w1's cooldown ended"); a.who != "A" || eps[a.dest] != "w1" {
		t.Fatalf("%s got %q, want A admitted on w1, whose cooldown ended", a.who, a.dest)
	}
	q.exchanges["A"].cancel()
	q.exchanges["hold"].cancel()
	rt.assertNoLoad(t, f.ids)
}

// A worker can become usable while no load goes down and no request arrives:
// it joins the fleet (here from the workers file). The request waiting while
// the fleet's only worker is full is admitted on it then, not at its queue
// timeout.
func TestAdmissionAWaiterIsWokenWhenAWorkerJoins(t *testing.T) {
	f := startFleet(t, 2, nil)
	path := filepath.Join(t.TempDir(), "workers.yaml")
	write := func(ids ...string) { writeWorkersFile(t, f, path, ids...) }
	write("w0")
	cfg := testConfig(t, f)
	cfg.Workers, cfg.WorkersFile = nil, path
	cfg.MaxPending = 1
	cfg.QueueTimeout = time.Minute // longer than next waits: only a wake-up admits A in time
	rt, client, _ := startEPPWith(t, cfg, nil)
	waitFor(t, 10*time.Second, "w0 from the file", func() bool { return len(rt.fleet.Workers()) == 1 })
	eps := f.endpoints()
	q := newEPPRequests(t, client)
	q.send("hold", nil)
	if a := q.next("the first request"); eps[a.dest] != "w0" {
		t.Fatalf("the first request got %q, want w0", a.dest)
	}
	q.send("A", nil)
	waitFor(t, 10*time.Second, "A to queue: w0 is full", func() bool { return rt.adm.depth() == 1 })
	write("w0", "w1")
	if a := q.next("A to be admitted when w1 joined"); a.who != "A" || eps[a.dest] != "w1" {
		t.Fatalf("%s got %q, want A admitted on w1, which joined", a.who, a.dest)
	}
	q.exchanges["A"].cancel()
	q.exchanges["hold"].cancel()
	rt.assertNoLoad(t, f.ids)
}
