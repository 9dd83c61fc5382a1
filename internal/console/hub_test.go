package console

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// counterHub is a hub whose state is {"n": <value of n>}.
func counterHub(n *atomic.Int64, max int) *Hub {
	return NewHub(HubConfig{Interval: 10 * time.Millisecond, MaxSubscribers: max,
		Snapshot: func(context.Context) (any, error) { return map[string]int64{"n": n.Load()}, nil }})
}

// readEvent reads one SSE event (skipping comments and retry lines).
func readEvent(t *testing.T, r *bufio.Reader) (name, data string) {
	t.Helper()
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("reading the stream: %v (event %q, data %q)", err, name, data)
		}
		line = strings.TrimRight(line, "\n")
		switch {
		case line == "" && name != "":
			return name, data
		case strings.HasPrefix(line, "event: "):
			name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			data = strings.TrimPrefix(line, "data: ")
		}
	}
}

func stream(t *testing.T, url string) (*http.Response, *bufio.Reader) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req.Header.Set("Accept", "text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp, bufio.NewReader(resp.Body)
}

func TestHubStreamsStateChanges(t *testing.T) {
	var n atomic.Int64
	h := counterHub(&n, 4)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	resp, r := stream(t, srv.URL)
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Errorf("Content-Type %q", ct)
	}
	for want := int64(0); want < 3; want++ {
		name, data := readEvent(t, r)
		var got map[string]int64
		if err := json.Unmarshal([]byte(data), &got); err != nil || name != "state" || got["n"] != want {
			t.Fatalf("event %q %q (%v), want state {n:%d}", name, data, err, want)
		}
		n.Add(1) // the next event carries the change; unchanged states are not re-sent
	}
}

func TestHubWithoutEventStreamAcceptAnswersOneEvent(t *testing.T) {
	var n atomic.Int64
	n.Store(7)
	h := counterHub(&n, 1)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	if got, want := rec.Body.String(), "event: state\ndata: {\"n\":7}\n\n"; got != want {
		t.Errorf("body %q, want %q", got, want)
	}
	if h.Subscribers() != 0 {
		t.Errorf("%d subscribers after a one-shot answer", h.Subscribers())
	}
}

func TestHubBoundsSubscribers(t *testing.T) {
	var n atomic.Int64
	h := counterHub(&n, 2)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	for range 2 {
		_, r := stream(t, srv.URL)
		readEvent(t, r)
	}
	req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
	req.Header.Set("Accept", "text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Errorf("third subscriber: %d, Retry-After %q; want 503 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
}

// TestHubSlowSubscriberDoesNotBlock: a subscriber that never reads keeps at
// most one pending snapshot, the newest, and publishing never waits for it.
func TestHubSlowSubscriberDoesNotBlock(t *testing.T) {
	h := NewHub(HubConfig{Snapshot: func(context.Context) (any, error) { return nil, nil }})
	slow := &subscriber{ch: make(chan []byte, 1)}
	h.mu.Lock()
	h.subs[slow] = struct{}{}
	h.mu.Unlock()
	done := make(chan struct{})
	go func() {
		for i := range 1000 {
			h.publish([]byte{byte(i), byte(i >> 8)})
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("publish blocked on a subscriber that does not read")
	}
	if got := <-slow.ch; got[0] != byte(999%256) || got[1] != byte(999>>8) {
		t.Errorf("pending snapshot %v, want the newest (999)", got)
	}
}

// TestHubStopsWhenNobodyWatches: the snapshot goroutine ends when the last
// stream does, not at its next tick (here an hour away), so that nothing it
// owns outlives the streams.
func TestHubStopsWhenNobodyWatches(t *testing.T) {
	var n atomic.Int64
	h := counterHub(&n, 2)
	h.cfg.Interval = time.Hour
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	resp, r := stream(t, srv.URL)
	readEvent(t, r)
	resp.Body.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		h.mu.Lock()
		running, subs := h.running, len(h.subs)
		h.mu.Unlock()
		if !running && subs == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("running=%v with %d subscribers after the only client left", running, subs)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestHubSnapshotErrorOnOneShot(t *testing.T) {
	h := NewHub(HubConfig{Snapshot: func(context.Context) (any, error) { return nil, errors.New("no leader") }})
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "no leader") {
		t.Errorf("%d %q", rec.Code, rec.Body.String())
	}
}

func TestEvent(t *testing.T) {
	for _, tc := range []struct{ name, data, want string }{
		{"state", `{"a":1}`, "event: state\ndata: {\"a\":1}\n\n"},
		{"ping", ``, "event: ping\ndata: \n\n"},
	} {
		if got := string(Event(tc.name, []byte(tc.data))); got != tc.want {
			t.Errorf("Event(%q, %q) = %q, want %q", tc.name, tc.data, got, tc.want)
		}
	}
}
