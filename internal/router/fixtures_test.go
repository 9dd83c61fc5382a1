package router

import (
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeClock is a settable clock for the breaker, the ledger and the overlays;
// its timers (AfterFunc) fire when Advance reaches them.
type fakeClock struct {
	mu     sync.Mutex
	t      time.Time
	timers []*fakeTimer // pending; guarded by mu
}

type fakeTimer struct {
	c  *fakeClock
	at time.Time
	f  func()
}

func newFakeClock() *fakeClock {
	return &fakeClock{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Advance moves the clock on and runs, in order, the timers it reached.
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	var due []*fakeTimer
	c.timers = slices.DeleteFunc(c.timers, func(ft *fakeTimer) bool {
		if ft.at.After(c.t) {
			return false
		}
		due = append(due, ft)
		return true
	})
	c.mu.Unlock()
	slices.SortStableFunc(due, func(a, b *fakeTimer) int { return a.at.Compare(b.at) })
	for _, ft := range due {
		ft.f()
	}
}

// AfterFunc is time.AfterFunc on this clock: f runs in the Advance that
// reaches d from now.
func (c *fakeClock) AfterFunc(d time.Duration, f func()) stopper {
	c.mu.Lock()
	defer c.mu.Unlock()
	ft := &fakeTimer{c: c, at: c.t.Add(d), f: f}
	c.timers = append(c.timers, ft)
	return ft
}

func (ft *fakeTimer) Stop() bool {
	ft.c.mu.Lock()
	defer ft.c.mu.Unlock()
	n := len(ft.c.timers)
	ft.c.timers = slices.DeleteFunc(ft.c.timers, func(x *fakeTimer) bool { return x == ft })
	return len(ft.c.timers) < n
}

// drive puts the router's breakers on this clock, their cooldown timers too.
func (c *fakeClock) drive(r *Router) {
	r.breakers.now, r.breakers.afterFunc = c.Now, c.AfterFunc
}

// upstreamCounter sits between the router and one engine and counts the
// generation requests (POST /v1/...) that reach it, and the most that were in
// flight at once. Polls of /v1/models, /tokenize and /metrics are not counted.
type upstreamCounter struct {
	srv      *httptest.Server
	posts    atomic.Int64
	inflight atomic.Int64
	maxIn    atomic.Int64
}

func (u *upstreamCounter) count() int { return int(u.posts.Load()) }

// countUpstream puts an upstreamCounter in front of every worker of cfg and
// returns them by worker id.
func countUpstream(t *testing.T, cfg *Config) map[string]*upstreamCounter {
	t.Helper()
	out := map[string]*upstreamCounter{}
	for i := range cfg.Workers {
		target, err := url.Parse(cfg.Workers[i].HTTP)
		if err != nil {
			t.Fatal(err)
		}
		rp := httputil.NewSingleHostReverseProxy(target)
		rp.FlushInterval = -1
		u := &upstreamCounter{}
		u.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodPost && strings.HasPrefix(r.URL.Path, "/v1/") {
				u.posts.Add(1)
				n := u.inflight.Add(1)
				defer u.inflight.Add(-1)
				for {
					m := u.maxIn.Load()
					if n <= m || u.maxIn.CompareAndSwap(m, n) {
						break
					}
				}
			}
			rp.ServeHTTP(w, r)
		}))
		t.Cleanup(u.srv.Close)
		cfg.Workers[i].HTTP = u.srv.URL
		out[cfg.Workers[i].ID] = u
	}
	return out
}

// counts returns each counter's count.
func counts(us map[string]*upstreamCounter) map[string]int {
	out := map[string]int{}
	for id, u := range us {
		out[id] = u.count()
	}
	return out
}
