package console

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"
)

// HubConfig configures a Hub.
type HubConfig struct {
	// Snapshot returns the state the pages show; it is marshalled to JSON and
	// sent as the data of an SSE "state" event whenever it changes.
	Snapshot func(ctx context.Context) (any, error)
	// Interval is how often the state is rebuilt while someone watches
	// (default 1s).
	Interval time.Duration
	// MaxSubscribers bounds the open event streams (default 64).
	MaxSubscribers int
	// WriteTimeout bounds one write to a client (default 10s).
	WriteTimeout time.Duration
	// Heartbeat is how often an idle stream gets a comment line (default 15s).
	Heartbeat time.Duration
	Log       *slog.Logger
}

// Hub broadcasts the state built by its Snapshot function to the pages that
// subscribe to it over Server-Sent Events (ServeHTTP).
type Hub struct {
	cfg HubConfig

	mu      sync.Mutex
	subs    map[*subscriber]struct{}
	running bool
	last    []byte // the last snapshot sent, JSON
	wake    chan struct{}
}

type subscriber struct {
	ch chan []byte // capacity 1: the newest snapshot not yet written
}

// NewHub returns a Hub; it starts no goroutine until someone subscribes.
func NewHub(cfg HubConfig) *Hub {
	cfg.Interval = cmp.Or(cfg.Interval, time.Second)
	cfg.MaxSubscribers = cmp.Or(cfg.MaxSubscribers, 64)
	cfg.WriteTimeout = cmp.Or(cfg.WriteTimeout, 10*time.Second)
	cfg.Heartbeat = cmp.Or(cfg.Heartbeat, 15*time.Second)
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &Hub{cfg: cfg, subs: map[*subscriber]struct{}{}, wake: make(chan struct{}, 1)}
}

// Subscribers is the number of open event streams.
func (h *Hub) Subscribers() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.subs)
}

// Kick asks for a snapshot now instead of at the next tick (for example after
// new events were applied). It never blocks.
func (h *Hub) Kick() {
	select {
	case h.wake <- struct{}{}:
	default:
	}
}

// State builds a snapshot now, as JSON (GET .../state).
func (h *Hub) State(ctx context.Context) ([]byte, error) {
	v, err := h.cfg.Snapshot(ctx)
	if err != nil {
		return nil, err
	}
	return json.Marshal(v)
}

// ErrTooManySubscribers is answered (503) past MaxSubscribers.
var ErrTooManySubscribers = fmt.Errorf("console: too many open event streams")

func (h *Hub) subscribe() (*subscriber, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.subs) >= h.cfg.MaxSubscribers {
		return nil, ErrTooManySubscribers
	}
	s := &subscriber{ch: make(chan []byte, 1)}
	if h.last != nil {
		s.ch <- h.last
	}
	h.subs[s] = struct{}{}
	if !h.running {
		h.running = true
		go h.run()
	}
	return s, nil
}

func (h *Hub) unsubscribe(s *subscriber) {
	h.mu.Lock()
	delete(h.subs, s)
	last := len(h.subs) == 0
	h.mu.Unlock()
	if last {
		// run returns now rather than at its next tick (up to an Interval
		// later): the goroutine ends with the last stream, not after it.
		h.Kick()
	}
}

// run builds snapshots while anyone is subscribed, and returns when nobody is.
func (h *Hub) run() {
	t := time.NewTicker(h.cfg.Interval)
	defer t.Stop()
	for {
		h.mu.Lock()
		if len(h.subs) == 0 {
			h.running = false
			h.last = nil
			h.mu.Unlock()
			return
		}
		h.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), 5*h.cfg.Interval)
		data, err := h.State(ctx)
		cancel()
		if err != nil {
			h.cfg.Log.Warn("console snapshot", "err", err)
		} else {
			h.publish(data)
		}
		select {
		case <-t.C:
		case <-h.wake:
		}
	}
}

// publish hands data to every subscriber without blocking: a subscriber that
// has not written the previous snapshot yet gets this one instead.
func (h *Hub) publish(data []byte) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if bytes.Equal(data, h.last) {
		return
	}
	h.last = data
	for s := range h.subs {
		select {
		case <-s.ch:
		default:
		}
		s.ch <- data
	}
}

// ServeHTTP streams the state as SSE "state" events until the client leaves.
// A request that does not accept text/event-stream (EventSource always does)
// gets the current state as one event, and the response ends.
func (h *Hub) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !strings.Contains(r.Header.Get("Accept"), "text/event-stream") {
		data, err := h.State(r.Context())
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Cache-Control", "no-cache")
		w.Write(Event("state", data))
		return
	}
	s, err := h.subscribe()
	if err != nil {
		w.Header().Set("Retry-After", "5")
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	defer h.unsubscribe(s)
	h.Kick()
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	write := func(b []byte) bool {
		rc.SetWriteDeadline(time.Now().Add(h.cfg.WriteTimeout))
		if _, err := w.Write(b); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	if !write([]byte("retry: 2000\n\n")) {
		return
	}
	beat := time.NewTicker(h.cfg.Heartbeat)
	defer beat.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case <-beat.C:
			if !write([]byte(": keep-alive\n\n")) {
				return
			}
		case data := <-s.ch:
			if !write(Event("state", data)) {
				return
			}
		}
	}
}

// Event formats one SSE event: data must be one line (compact JSON is).
func Event(name string, data []byte) []byte {
	b := make([]byte, 0, len(name)+len(data)+16)
	b = append(b, "event: "...)
	b = append(b, name...)
	b = append(b, "\ndata: "...)
	b = append(b, data...)
	return append(b, "\n\n"...)
}
