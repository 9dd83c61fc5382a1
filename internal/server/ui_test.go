package server

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	kvindexv1 "github.com/kvindex/kvindex/api/proto/kvindex/v1"
)

// workersNow is GET /workers, decoded.
func (f *fixture) workersNow() *kvindexv1.WorkersResponse {
	f.t.Helper()
	code, body := f.get("/workers")
	if code != http.StatusOK {
		f.t.Fatalf("GET /workers: %d %s", code, body)
	}
	resp := &kvindexv1.WorkersResponse{}
	if err := protoUnJSON.Unmarshal([]byte(body), resp); err != nil {
		f.t.Fatal(err)
	}
	return resp
}

func (f *fixture) uiState() uiState {
	f.t.Helper()
	code, body := f.get("/ui/api/state")
	if code != http.StatusOK {
		f.t.Fatalf("GET /ui/api/state: %d %s", code, body)
	}
	var st uiState
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		f.t.Fatal(err)
	}
	return st
}

// TestUIStateMatchesTheAPIs: the console's state carries the numbers of GET
// /workers, GET /cluster and GET /v1/stats.
func TestUIStateMatchesTheAPIs(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	f.generate("e0", 0, tokens(0, 40), "")
	f.generate("e1", 0, tokens(0, 24), "")
	f.generate("e2", 1, tokens(100, 16), "")
	// The console and /workers are read one after the other, and a stream's
	// state can move in between (connecting, replaying, live: idle replays run
	// every 50 ms in tests), so the two reads are repeated until they agree.
	var st uiState
	var diffs []string
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		st = f.uiState()
		diffs = uiWorkerDiffs(st, f.workersNow())
		if len(diffs) == 0 || time.Now().After(deadline) {
			break
		}
	}
	for _, d := range diffs {
		t.Error(d)
	}
	if len(st.Models) != 1 || st.Models[0] != testModel {
		t.Errorf("models %v, want [%s]", st.Models, testModel)
	}
	var cluster clusterJSON
	code, body := f.get("/cluster")
	if code != http.StatusOK {
		t.Fatalf("/cluster: %d %s", code, body)
	}
	decodeInto(t, body, &cluster)
	if st.NodeID != cluster.NodeID || st.Cluster.Leader != cluster.Leader || st.Cluster.Term != cluster.Term ||
		len(st.Cluster.Members) != len(cluster.Members) || !st.Cluster.Members[0].IsLeader {
		t.Errorf("cluster: console %+v, /cluster %+v", st.Cluster, cluster)
	}
	if len(st.Timeline) == 0 || st.Timeline[len(st.Timeline)-1].Term != cluster.Term || st.Timeline[len(st.Timeline)-1].Leader != cluster.Leader {
		t.Errorf("timeline %+v does not end with term %d led by %s", st.Timeline, cluster.Term, cluster.Leader)
	}
	stats := f.srv.api.stats()
	if uint64(st.Index.Nodes) != stats.Nodes || uint64(st.Index.Residencies) != stats.Residencies ||
		uint32(st.Index.Namespaces) != stats.Namespaces || st.Index.HeapBytes == 0 {
		t.Errorf("index: console %+v, stats %+v", st.Index, stats)
	}
}

// uiWorkerDiffs compares the console's workers with GET /workers' answer.
func uiWorkerDiffs(st uiState, workers *kvindexv1.WorkersResponse) []string {
	if len(st.Workers) != len(workers.Workers) {
		return []string{fmt.Sprintf("%d workers in the console, %d in /workers", len(st.Workers), len(workers.Workers))}
	}
	var diffs []string
	for i, w := range workers.Workers {
		var lastSeq uint64
		for _, r := range w.DpRanks {
			lastSeq = max(lastSeq, r.LastSeq)
		}
		got := st.Workers[i]
		want := uiWorker{ID: w.Spec.Id, Model: w.Spec.Model, GPUBlocks: w.GpuBlocks, CPUBlocks: w.CpuBlocks, DiskBlocks: w.DiskBlocks,
			LastSeq: lastSeq, State: stateJSON(w.State), BlockSize: 4, DPSize: w.Spec.DpSize}
		if got.ID != want.ID || got.Model != want.Model || got.GPUBlocks != want.GPUBlocks || got.CPUBlocks != want.CPUBlocks ||
			got.DiskBlocks != want.DiskBlocks || got.LastSeq != want.LastSeq || got.State != want.State ||
			got.BlockSize != want.BlockSize || got.DPSize != want.DPSize {
			diffs = append(diffs, fmt.Sprintf("worker %d: console %+v, /workers says %+v", i, got, want))
		}
		if got.GPUBlocks+got.CPUBlocks == 0 {
			diffs = append(diffs, fmt.Sprintf("worker %s holds no blocks after generating", got.ID))
		}
	}
	return diffs
}

// TestUITryMatchesHitRate: the try panel's answer is POST /kv-cache/hit-rate's,
// with the tiers' blocks and a block path that agrees with it.
func TestUITryMatchesHitRate(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	shared := tokens(0, 24)
	f.generate("e0", 0, concat(shared, tokens(50, 16)), "")
	f.generate("e1", 0, shared, "")
	prompt := concat(shared, tokens(50, 16), tokens(200, 8))
	for _, tc := range []struct {
		name     string
		body     map[string]any
		wantCode int
	}{
		{"token ids", map[string]any{"model": testModel, "token_ids": prompt}, http.StatusOK},
		{"text", map[string]any{"model": testModel, "prompt": "hello world, hello world, hello world, hello"}, http.StatusOK},
		{"chat", map[string]any{"model": testModel, "messages": []map[string]string{{"role": "user", "content": "hi there"}}}, http.StatusOK},
		{"some workers", map[string]any{"model": testModel, "token_ids": prompt, "pods": []string{"e1"}}, http.StatusOK},
		{"no model", map[string]any{"token_ids": prompt}, http.StatusBadRequest},
		{"two prompts", map[string]any{"model": testModel, "token_ids": prompt, "prompt": "x"}, http.StatusBadRequest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, body := f.postJSON("/ui/api/try", tc.body)
			hcode, hbody := f.postJSON("/kv-cache/hit-rate", tc.body)
			if code != tc.wantCode || hcode != tc.wantCode {
				t.Fatalf("try: %d %s; hit-rate: %d %s; want %d", code, body, hcode, hbody, tc.wantCode)
			}
			if code != http.StatusOK {
				return
			}
			var try uiTryResponse
			var hit hitRateResponse
			decodeInto(t, body, &try)
			decodeInto(t, hbody, &hit)
			if try.TotalBlocks != hit.TotalBlocks || try.PromptTokens != hit.PromptTokens || len(try.Workers) != len(hit.Pods) {
				t.Fatalf("try %+v\nhit-rate %+v", try, hit)
			}
			for i, p := range hit.Pods {
				w := try.Workers[i]
				if w.Worker != p.Pod || w.MatchedBlocks != p.MatchedBlocks || w.HitRate != p.HitRate ||
					w.GPUHitRate != p.GPUHitRate || w.CPUHitRate != p.CPUHitRate || w.DiskHitRate != p.DiskHitRate {
					t.Errorf("worker %d: try %+v, hit-rate %+v", i, w, p)
				}
				if w.GPUBlocks+w.CPUBlocks+w.DiskBlocks != w.MatchedBlocks {
					t.Errorf("%s: tiers %d+%d+%d != matched %d", w.Worker, w.GPUBlocks, w.CPUBlocks, w.DiskBlocks, w.MatchedBlocks)
				}
			}
			if len(try.Path) != try.TotalBlocks {
				t.Fatalf("path of %d blocks, prompt of %d", len(try.Path), try.TotalBlocks)
			}
			for i, b := range try.Path {
				holders := 0
				for _, w := range try.Workers {
					if w.MatchedBlocks > i {
						holders++
					}
				}
				if b.Block != i || b.Holders != holders || len(b.Key) != 16 {
					t.Errorf("path block %d = %+v, want %d holders", i, b, holders)
				}
			}
		})
	}
	// The token-id prompt: e0 holds its first 10 blocks, e1 the first 6.
	_, body := f.postJSON("/ui/api/try", map[string]any{"model": testModel, "token_ids": prompt})
	var try uiTryResponse
	decodeInto(t, body, &try)
	if try.TotalBlocks != 12 || try.Workers[0].Worker != "e0" || try.Workers[0].MatchedBlocks != 10 ||
		try.Workers[1].Worker != "e1" || try.Workers[1].MatchedBlocks != 6 || try.Path[5].Holders != 2 || try.Path[9].Holders != 1 || try.Path[10].Holders != 0 {
		t.Errorf("try = %+v", try)
	}
}

// TestUIEventsPushesChanges: the event stream sends the state, then a new state
// once new events changed the index.
func TestUIEventsPushesChanges(t *testing.T) {
	f := newFixture(t, fixtureOptions{engines: defaultEngines[:1]})
	f.generate("e0", 0, tokens(0, 16), "")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, f.base+"/ui/api/events", nil)
	req.Header.Set("Accept", "text/event-stream")
	resp, err := f.http.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("%d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	r := bufio.NewReader(resp.Body)
	next := func() uiState {
		t.Helper()
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				t.Fatalf("reading events: %v", err)
			}
			if data, ok := strings.CutPrefix(line, "data: "); ok {
				var st uiState
				if err := json.Unmarshal([]byte(data), &st); err != nil {
					t.Fatalf("event data %q: %v", data, err)
				}
				return st
			}
		}
	}
	first := next()
	if len(first.Workers) != 1 || first.Workers[0].GPUBlocks != 4 {
		t.Fatalf("first state's workers: %+v, want e0 with 4 blocks", first.Workers)
	}
	f.generate("e0", 0, tokens(100, 16), "")
	want := f.workersNow().Workers[0].GpuBlocks
	for st := next(); st.Workers[0].GPUBlocks != want; st = next() {
		if st.Workers[0].GPUBlocks != 4 {
			t.Fatalf("a state with %d blocks, want 4 then %d", st.Workers[0].GPUBlocks, want)
		}
	}
}
