package router

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/kvindex/kvindex/internal/console"
)

// The router's web console (docs/console.md):
//
//	GET  /ui                       the page (embedded, internal/console)
//	GET  /ui/assets/{file}         its CSS and JavaScript
//	GET  /ui/api/state             the state the page shows, JSON (uiState)
//	GET  /ui/api/events            the same state as Server-Sent Events ("state"), sent when it changes
//	GET  /ui/api/decisions/{seq}   one of the last decisions with every candidate's cost terms
//
// The dry-run form posts to POST /debug/route. The numbers are the router's own
// (its metrics registry, the same series /metrics serves, and its breakers),
// read once per uiInterval while a page watches (console.Hub).

// uiInterval is how often the console's state is rebuilt while a page watches.
var uiInterval = time.Second

// uiHitPoints is how many samples of the hit counters the chart keeps.
const uiHitPoints = 120

type routerUI struct {
	r      *Router
	hub    *console.Hub
	recent *recentDecisions
	hits   *console.Series[uiHitSample]
}

// uiState is GET /ui/api/state and the data of every "state" event.
type uiState struct {
	Policy     string              `json:"policy"`
	Indexer    bool                `json:"indexer"`     // --indexer is set
	IndexerUp  bool                `json:"indexer_up"`  // its last answer was good
	QueueDepth float64             `json:"queue_depth"` // admission queue
	Workers    []uiWorker          `json:"workers"`
	Decisions  []uiDecisionCount   `json:"decisions"`
	Hit        uiHitSample         `json:"hit"`
	HitSeries  []uiHitSample       `json:"hit_series"`
	Recent     []uiDecisionSummary `json:"recent"` // newest first
	Models     []string            `json:"models"`
}

type uiWorker struct {
	ID            string  `json:"id"`
	Model         string  `json:"model"`
	Role          string  `json:"role"`
	InFlight      float64 `json:"inflight"`
	PrefillTokens float64 `json:"prefill_tokens"`
	DecodeBlocks  float64 `json:"decode_blocks"`
	Breaker       string  `json:"breaker"`
	Trips         float64 `json:"breaker_trips"`
	Served        float64 `json:"served"` // requests finished on it, any result
}

type uiDecisionCount struct {
	Policy string  `json:"policy"`
	Source string  `json:"source"`
	Count  float64 `json:"count"`
}

// uiHitSample is the hit counters (kvindex_router_hit_*_blocks_total) at At.
type uiHitSample struct {
	At        int64   `json:"at"`
	Available float64 `json:"available"`
	Captured  float64 `json:"captured"`
}

func (r *Router) newUI() *routerUI {
	u := &routerUI{r: r, recent: newRecentDecisions(uiRecentSize), hits: console.NewSeries[uiHitSample](uiHitPoints)}
	u.hub = console.NewHub(console.HubConfig{Interval: uiInterval, Log: r.log,
		Snapshot: func(context.Context) (any, error) { return u.state() }})
	return u
}

// register adds the console's routes to mux.
func (u *routerUI) register(mux *http.ServeMux) {
	mux.HandleFunc("GET /ui", func(w http.ResponseWriter, _ *http.Request) { console.ServePage(w, "router.html") })
	mux.Handle("GET /ui/assets/{file}", console.AssetHandler("/ui/assets/"))
	mux.HandleFunc("GET /ui/api/state", func(w http.ResponseWriter, _ *http.Request) {
		st, err := u.state()
		if err != nil {
			writeError(w, err)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(st)
	})
	mux.Handle("GET /ui/api/events", u.hub)
	mux.HandleFunc("GET /ui/api/decisions/{seq}", func(w http.ResponseWriter, req *http.Request) {
		seq, err := strconv.ParseUint(req.PathValue("seq"), 10, 64)
		e, ok := u.recent.find(seq)
		if err != nil || !ok {
			http.Error(w, `{"error":{"code":"not_found","message":"no such recent decision (the console keeps the last `+strconv.Itoa(uiRecentSize)+`)"}}`, http.StatusNotFound)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(e.json())
	})
}

// state reads the router's metrics registry (the numbers /metrics serves) and
// breakers.
func (u *routerUI) state() (*uiState, error) {
	r := u.r
	families, err := r.reg.Gather()
	if err != nil {
		return nil, err
	}
	m := map[string][]*dto.Metric{}
	for _, f := range families {
		if strings.HasPrefix(f.GetName(), "kvindex_router_") {
			m[f.GetName()] = f.GetMetric()
		}
	}
	st := &uiState{Policy: r.policy.Name(), Indexer: r.index != nil, Workers: []uiWorker{}, Decisions: []uiDecisionCount{},
		Recent: []uiDecisionSummary{}, Models: []string{}}
	st.IndexerUp = st.Indexer && value(m["kvindex_router_indexer_up"], nil) == 1
	st.QueueDepth = value(m["kvindex_router_queue_depth"], nil)
	for _, w := range r.fleet.Workers() {
		id := map[string]string{"worker": w.ID}
		state, _ := r.breakers.State(w.ID)
		served := 0.0
		for _, mt := range m["kvindex_router_requests_total"] {
			if label(mt, "worker") == w.ID {
				served += mt.GetCounter().GetValue()
			}
		}
		st.Workers = append(st.Workers, uiWorker{ID: w.ID, Model: w.Model, Role: w.Role.String(),
			InFlight:      value(m["kvindex_router_worker_inflight"], map[string]string{"worker": w.ID, "scope": "local"}),
			PrefillTokens: value(m["kvindex_router_worker_prefill_tokens"], id),
			DecodeBlocks:  value(m["kvindex_router_worker_decode_blocks"], id),
			Breaker:       state.String(), Trips: value(m["kvindex_router_worker_breaker_trips_total"], id), Served: served})
		if !slices.Contains(st.Models, w.Model) {
			st.Models = append(st.Models, w.Model)
		}
	}
	slices.Sort(st.Models)
	for _, mt := range m["kvindex_router_decisions_total"] {
		st.Decisions = append(st.Decisions, uiDecisionCount{Policy: label(mt, "policy"), Source: label(mt, "source"), Count: mt.GetCounter().GetValue()})
	}
	st.Hit = uiHitSample{At: time.Now().UnixMilli(), Available: value(m["kvindex_router_hit_available_blocks_total"], nil),
		Captured: value(m["kvindex_router_hit_captured_blocks_total"], nil)}
	if last, ok := u.hits.Last(); !ok || last.Available != st.Hit.Available || last.Captured != st.Hit.Captured {
		u.hits.Add(st.Hit)
	}
	st.HitSeries = u.hits.Values()
	st.Hit.At = 0 // the state changes only when the router's does
	recent := u.recent.ring.Values()
	for i := len(recent) - 1; i >= 0; i-- {
		st.Recent = append(st.Recent, recent[i].summary())
	}
	return st, nil
}

// value is the value of the metric of ms whose labels include want (the
// first; 0 when none).
func value(ms []*dto.Metric, want map[string]string) float64 {
next:
	for _, mt := range ms {
		for k, v := range want {
			if label(mt, k) != v {
				continue next
			}
		}
		switch {
		case mt.Counter != nil:
			return mt.GetCounter().GetValue()
		case mt.Gauge != nil:
			return mt.GetGauge().GetValue()
		}
	}
	return 0
}

func label(mt *dto.Metric, name string) string {
	for _, l := range mt.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}
