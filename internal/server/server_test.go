package server

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/bench/fakeengine"
	"github.com/kvindex/kvindex/bench/fakeengine/fakeenginetest"
	"github.com/kvindex/kvindex/internal/workerspec"
)

func startEngine(t *testing.T) *fakeengine.Engine {
	t.Helper()
	return fakeenginetest.Start(t, fakeenginetest.Config())
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(body)
}

// workersJSON is GET /workers as a client reads it (kvindex.v1.WorkersResponse).
type workersJSON struct {
	Workers []struct {
		Spec struct {
			ID             string `json:"id"`
			Model          string `json:"model"`
			BlockSize      int    `json:"block_size"`
			EventsEndpoint string `json:"events_endpoint"`
			ReplayEndpoint string `json:"replay_endpoint"`
			Role           string `json:"role"`
		} `json:"spec"`
		State   string `json:"state"`
		DpRanks []struct {
			DpRank  int    `json:"dp_rank"`
			LastSeq string `json:"last_seq"`
		} `json:"dp_ranks"`
	} `json:"workers"`
}

func TestServerFollowsAnEngineAndReportsIt(t *testing.T) {
	e := startEngine(t)
	cfg := testConfig(t)
	cfg.Ingest.PollInterval = 10 * time.Millisecond
	cfg.Ingest.IdleReplayInterval = 20 * time.Millisecond
	cfg.Ingest.DefaultBlockSize = 4
	spec, err := workerspec.Parse("id=e1,model=" + e.Config().Model + ",endpoint=" + e.EventEndpoints()[0] +
		",replay=" + e.ReplayEndpoints()[0] + ",role=prefill")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Ingest.Workers = []workerspec.Spec{spec}
	s, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + s.HTTPAddr()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
		if _, err := http.Get(base + "/healthz"); err == nil {
			t.Error("HTTP still served after Run returned")
		}
	}()

	for i := range 12 {
		prompt := make([]uint32, 10+i)
		for j := range prompt {
			prompt[j] = uint32(i*7 + j)
		}
		if _, err := e.Generate(ctx, fakeengine.Request{Prompt: prompt, MaxTokens: 3}); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	last := e.CacheTruth().Ranks[0].LastSeq
	var ws workersJSON
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, body := get(t, base+"/workers")
		if code != http.StatusOK {
			t.Fatalf("GET /workers = %d %s", code, body)
		}
		if err := json.Unmarshal([]byte(body), &ws); err != nil {
			t.Fatalf("GET /workers: %v in %s", err, body)
		}
		if len(ws.Workers) == 1 && len(ws.Workers[0].DpRanks) == 1 && ws.Workers[0].DpRanks[0].LastSeq == strconv.FormatInt(last, 10) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET /workers never reached seq %d: %s", last, body)
		}
		time.Sleep(10 * time.Millisecond)
	}
	w := ws.Workers[0]
	if w.Spec.ID != "e1" || w.Spec.Model != e.Config().Model || w.Spec.EventsEndpoint != e.EventEndpoints()[0] ||
		w.Spec.Role != "WORKER_ROLE_PREFILL" || (w.State != "WORKER_STATE_LIVE" && w.State != "WORKER_STATE_REPLAYING") {
		// REPLAYING: a live stream asks for what it may have missed while idle.
		t.Errorf("worker = %+v", w)
	}
	if code, body := get(t, base+"/workers?model=other"); code != http.StatusOK || strings.Contains(body, "e1") {
		t.Errorf("model filter: %d %s", code, body)
	}
	if code, body := get(t, base+"/readyz"); code != http.StatusOK {
		t.Errorf("GET /readyz = %d %s", code, body)
	}
	if code, _ := get(t, base+"/healthz"); code != http.StatusOK {
		t.Errorf("GET /healthz = %d", code)
	}
	code, metrics := get(t, base+"/metrics")
	if code != http.StatusOK {
		t.Fatalf("GET /metrics = %d", code)
	}
	for _, want := range []string{
		`kvindex_ingest_block_events_total{type="BlockStored",worker="e1"}`,
		`kvindex_ingest_last_seq{dp_rank="0",worker="e1"} ` + strconv.FormatInt(last, 10),
		`kvindex_raft_commit_seconds_bucket`,
		`kvindex_raft_leader_sessions_total 1`,
		`go_goroutines `,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("GET /metrics lacks %q", want)
		}
	}
	if st := s.Index().Stats(); st.Residencies == 0 {
		t.Error("the index is empty")
	}
}
