package server

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/protobuf/encoding/protojson"

	kvindexv1 "github.com/kvindex/kvindex/api/proto/kvindex/v1"
	"github.com/kvindex/kvindex/internal/ingest"
)

const readHeaderTimeout = 10 * time.Second

// Handler serves the HTTP endpoints of a single node:
//
//	GET /metrics  Prometheus metrics
//	GET /healthz  200 while the process serves
//	GET /readyz   200 once ingest and the apply loop run, 503 before and after
//	GET /workers  kvindex.v1.WorkersResponse as JSON (?model= filters)
//
// Request bodies are limited to --max-body-bytes.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{ErrorLog: slog2log{s}}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if !s.ingest.Running() || !s.sinkRunning.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			w.Write([]byte("not ready: ingest is starting or stopping\n"))
			return
		}
		w.Write([]byte("ready\n"))
	})
	mux.HandleFunc("GET /workers", s.handleWorkers)
	limit := s.cfg.MaxBodyBytes
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Body = http.MaxBytesReader(w, r.Body, limit)
		mux.ServeHTTP(w, r)
	})
}

// slog2log lets promhttp log through the server's logger.
type slog2log struct{ s *Server }

func (l slog2log) Println(v ...any) { l.s.log.Warn("metrics endpoint", "err", v) }

var workerRoles = map[string]kvindexv1.WorkerRole{
	"":           kvindexv1.WorkerRole_WORKER_ROLE_UNSPECIFIED,
	"aggregated": kvindexv1.WorkerRole_WORKER_ROLE_AGGREGATED,
	"prefill":    kvindexv1.WorkerRole_WORKER_ROLE_PREFILL,
	"decode":     kvindexv1.WorkerRole_WORKER_ROLE_DECODE,
}

// handleWorkers lists the registered workers with their streams' state and the
// last applied seq of each dp rank. Per-tier block counts are not reported yet
// (the index does not count blocks per worker).
func (s *Server) handleWorkers(w http.ResponseWriter, r *http.Request) {
	model := r.URL.Query().Get("model")
	running := s.ingest.Running()
	resp := &kvindexv1.WorkersResponse{}
	for _, ws := range s.ingest.Workers() {
		if model != "" && ws.Spec.Model != model {
			continue
		}
		info := &kvindexv1.WorkerInfo{Spec: specProto(ws.Spec), State: workerState(running, ws.Streams)}
		for _, st := range ws.Streams {
			rank := &kvindexv1.DpRankStatus{DpRank: st.DPRank}
			if c, ok := s.applier.Cursor(ingest.Stream{Worker: ws.Spec.ID, DPRank: st.DPRank}); ok {
				rank.LastSeq = c.Seq
			}
			info.DpRanks = append(info.DpRanks, rank)
		}
		resp.Workers = append(resp.Workers, info)
	}
	body, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(resp)
	if err != nil {
		http.Error(w, "encoding workers: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(body)
}

func specProto(s ingest.WorkerSpec) *kvindexv1.WorkerSpec {
	return &kvindexv1.WorkerSpec{
		Id: s.ID, Model: s.Model, BlockSize: uint32(s.BlockSize), DpSize: uint32(s.DPSize),
		EventsEndpoint: s.Endpoint, EventsTopic: s.Topic, ReplayEndpoint: s.Replay, HttpEndpoint: s.HTTP,
		Role: workerRoles[s.Role], Labels: s.Labels,
	}
}

// workerState summarises a worker's streams: replaying if any is, live once every
// stream it has has applied a batch, connecting before.
func workerState(running bool, streams []ingest.StreamStatus) kvindexv1.WorkerState {
	if !running {
		return kvindexv1.WorkerState_WORKER_STATE_UNSPECIFIED
	}
	state := kvindexv1.WorkerState_WORKER_STATE_CONNECTING
	live := len(streams) > 0
	for _, st := range streams {
		switch st.State {
		case ingest.StateReplaying:
			return kvindexv1.WorkerState_WORKER_STATE_REPLAYING
		case ingest.StateConnecting:
			live = false
		}
	}
	if live {
		state = kvindexv1.WorkerState_WORKER_STATE_LIVE
	}
	return state
}
