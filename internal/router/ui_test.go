package router

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

func getUIState(t *testing.T, url string) uiState {
	t.Helper()
	resp, err := http.Get(url + "/ui/api/state")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st uiState
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&st) != nil {
		t.Fatalf("GET /ui/api/state: %d", resp.StatusCode)
	}
	return st
}

func chatBody(content string) string {
	return fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%s}],"max_tokens":2}`, testModel, quote(content))
}

// TestUIStateAndDecisions: the console's state carries the router's metrics
// (the /metrics numbers), the last decisions newest first, and each decision's
// full /debug/route shape by its number.
func TestUIStateAndDecisions(t *testing.T) {
	f := startFleet(t, 3, nil)
	r := startRouter(t, testConfig(t, f))
	for i := range 5 {
		if code, _, body := post(t, r.url, "/v1/chat/completions", chatBody(words(fmt.Sprintf("conv%d", i%2), 40))); code != http.StatusOK {
			t.Fatalf("request %d: %d %s", i, code, body)
		}
	}
	// A request's load is released and its result counted just after its
	// last byte left: wait until all five are done.
	var st uiState
	waitFor(t, 30*time.Second, "5 requests served and released", func() bool {
		st = getUIState(t, r.url)
		n := 0.0
		for _, w := range st.Workers {
			if w.InFlight != 0 || w.PrefillTokens != 0 || w.DecodeBlocks != 0 {
				return false
			}
			n += w.Served
		}
		return n == 5
	})
	if st.Policy != PolicyKVAware || st.Indexer || len(st.Workers) != 3 || len(st.Models) != 1 {
		t.Fatalf("state %+v", st)
	}
	served := 0.0
	for _, w := range st.Workers {
		want := uiWorker{ID: w.ID, Model: testModel, Role: w.Role, Breaker: "closed",
			Served: testutil.ToFloat64(r.metrics.requests.WithLabelValues(PolicyKVAware, resultOK, w.ID)),
			Trips:  testutil.ToFloat64(r.metrics.breakerTrips.WithLabelValues(w.ID))}
		if w != want {
			t.Errorf("worker %+v, metrics say %+v", w, want)
		}
		served += w.Served
	}
	if served != 5 {
		t.Errorf("%v requests served in the console, 5 sent", served)
	}
	var decisions float64
	for _, d := range st.Decisions {
		if got := testutil.ToFloat64(r.metrics.decisions.WithLabelValues(d.Policy, d.Source)); got != d.Count {
			t.Errorf("decisions %s/%s: console %v, metrics %v", d.Policy, d.Source, d.Count, got)
		}
		decisions += d.Count
	}
	if decisions != 5 {
		t.Errorf("%v decisions counted, 5 made", decisions)
	}
	if st.Hit.Available != testutil.ToFloat64(r.metrics.hitAvailable) || st.Hit.Captured != testutil.ToFloat64(r.metrics.hitCaptured) ||
		st.Hit.Captured == 0 || len(st.HitSeries) == 0 {
		t.Errorf("hit %+v (series %d points), metrics %v/%v", st.Hit, len(st.HitSeries),
			testutil.ToFloat64(r.metrics.hitAvailable), testutil.ToFloat64(r.metrics.hitCaptured))
	}
	if len(st.Recent) != 5 {
		t.Fatalf("%d recent decisions, want 5", len(st.Recent))
	}
	for i, s := range st.Recent {
		if s.Seq != uint64(5-i) || s.Candidates != 3 || s.Model != testModel || s.PromptBlocks == 0 {
			t.Errorf("recent[%d] = %+v, want seq %d with 3 candidates", i, s, 5-i)
		}
	}
	for _, tc := range []struct {
		path string
		code int
	}{
		{fmt.Sprintf("/ui/api/decisions/%d", st.Recent[0].Seq), http.StatusOK},
		{"/ui/api/decisions/999", http.StatusNotFound},
		{"/ui/api/decisions/x", http.StatusNotFound},
	} {
		resp, err := http.Get(r.url + tc.path)
		if err != nil {
			t.Fatal(err)
		}
		var d uiDecision
		err = json.NewDecoder(resp.Body).Decode(&d)
		resp.Body.Close()
		if resp.StatusCode != tc.code || err != nil {
			t.Errorf("%s: %d (%v), want %d", tc.path, resp.StatusCode, err, tc.code)
			continue
		}
		if tc.code != http.StatusOK {
			continue
		}
		s := st.Recent[0]
		if d.Seq != s.Seq || d.Worker != s.Worker || d.Cost != s.Cost || d.OverlapBlocks != s.OverlapBlocks ||
			d.PromptBlocks != s.PromptBlocks || len(d.Candidates) != 3 {
			t.Errorf("decision %+v, summary %+v", d, s)
		}
		for _, c := range d.Candidates {
			if c.Terms.PromptBlocks < float64(s.PromptBlocks) || c.Terms.PromptBlocks >= float64(s.PromptBlocks+1) {
				t.Errorf("candidate %s: terms %+v, want prompt_blocks in [%d, %d)", c.Worker, c.Terms, s.PromptBlocks, s.PromptBlocks+1)
			}
		}
	}
}

// TestUIRecentIsBounded: the ring keeps the last uiRecentSize decisions.
func TestUIRecentIsBounded(t *testing.T) {
	rd := newRecentDecisions(uiRecentSize)
	p := &prepared{route: RouteRequest{Model: "m", LocalKeys: make([]uint64, 3)}}
	for i := range uiRecentSize + 10 {
		rd.add(&Decision{Policy: "p", Target: Target{Worker: fmt.Sprint("w", i)}}, p, time.Unix(int64(i), 0))
	}
	got := rd.ring.Values()
	if len(got) != uiRecentSize || got[0].seq != 11 || got[len(got)-1].seq != uiRecentSize+10 {
		t.Fatalf("%d kept, seqs %d..%d", len(got), got[0].seq, got[len(got)-1].seq)
	}
	if _, ok := rd.find(10); ok {
		t.Error("decision 10 is still found")
	}
	if e, ok := rd.find(uiRecentSize + 10); !ok || e.summary().Worker != fmt.Sprint("w", uiRecentSize+9) || e.summary().PromptBlocks != 3 {
		t.Errorf("newest: %+v %v", e.summary(), ok)
	}
}

// TestUIEventsPushDecisions: the event stream sends a new state after a request.
func TestUIEventsPushDecisions(t *testing.T) {
	f := startFleet(t, 2, nil)
	r := startRouter(t, testConfig(t, f))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, r.url+"/ui/api/events", nil)
	req.Header.Set("Accept", "text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("%d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	br := bufio.NewReaderSize(resp.Body, 1<<20)
	next := func() uiState {
		t.Helper()
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				t.Fatalf("reading events: %v", err)
			}
			if data, ok := strings.CutPrefix(line, "data: "); ok {
				var st uiState
				if err := json.Unmarshal([]byte(data), &st); err != nil {
					t.Fatal(err)
				}
				return st
			}
		}
	}
	if st := next(); len(st.Recent) != 0 || len(st.Workers) != 2 {
		t.Fatalf("first state: %+v", st)
	}
	if code, _, body := post(t, r.url, "/v1/chat/completions", chatBody(words("live", 30))); code != http.StatusOK {
		t.Fatalf("%d %s", code, body)
	}
	for st := next(); len(st.Recent) != 1; st = next() {
		if len(st.Recent) > 1 {
			t.Fatalf("%d decisions after one request", len(st.Recent))
		}
	}
}
