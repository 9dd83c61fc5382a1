package router

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// directRouter is two engines behind a round-robin router in direct mode with a
// small body limit, each engine behind an upstream counter.
func directRouter(t *testing.T) (*testRouter, *fleet, map[string]*upstreamCounter) {
	t.Helper()
	f := startFleet(t, 2, nil)
	cfg := testConfig(t, f)
	cfg.Policy = PolicyRoundRobin
	cfg.Mode = ModeDirect
	cfg.MaxBodyBytes = 1024
	up := countUpstream(t, &cfg)
	return startRouter(t, cfg), f, up
}

func (r *testRouter) decisionsTotal() float64 {
	n := 0.0
	for _, s := range []Source{SourceIndex, SourcePredicted, SourceApproximate, SourceLoadOnly, SourceDirect, SourceSession} {
		n += testutil.ToFloat64(r.metrics.decisions.WithLabelValues(r.policy.Name(), string(s)))
	}
	return n
}

// Requests the router must refuse itself: 4xx with an OpenAI error body, no
// decision taken and nothing sent to any engine.
func TestBadInputIsRefusedByTheRouterAndNeverSentUpstream(t *testing.T) {
	rt, f, up := directRouter(t)
	chat, comp := "/v1/chat/completions", "/v1/completions"
	tests := []struct {
		name   string
		path   string
		body   string
		hdr    []string
		status int
		kind   string
	}{
		{"invalid JSON", comp, `{"model":`, nil, 400, "BadRequestError"},
		{"not an object", chat, `["messages"]`, nil, 400, "BadRequestError"},
		{"model of the wrong type", comp, `{"model":5,"prompt":"hi"}`, nil, 400, "BadRequestError"},
		{"unknown model", comp, `{"model":"no/such-model","prompt":"hi"}`, nil, 404, "NotFoundError"},
		{"unknown model, chat", chat, `{"model":"no/such-model","messages":[{"role":"user","content":"hi"}]}`, nil, 404, "NotFoundError"},
		{"unknown model, other endpoint", "/v1/embeddings", `{"model":"no/such-model","input":"hi"}`, nil, 404, "NotFoundError"},
		{"oversize body", comp, completionBody(strings.Repeat("x", 2000), 2), nil, 413, "BadRequestError"},
		{"n=2", comp, fmt.Sprintf(`{"model":%q,"prompt":"hi","n":2}`, testModel), nil, 400, "BadRequestError"},
		{"n=2, chat", chat, fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hi"}],"n":2}`, testModel), nil, 400, "BadRequestError"},
		{"empty messages", chat, fmt.Sprintf(`{"model":%q,"messages":[]}`, testModel), nil, 400, "BadRequestError"},
		{"message without a role", chat, fmt.Sprintf(`{"model":%q,"messages":[{"content":"hi"}]}`, testModel), nil, 400, "BadRequestError"},
		{"empty prompt list", comp, fmt.Sprintf(`{"model":%q,"prompt":[]}`, testModel), nil, 400, "BadRequestError"},
		{"prompt of the wrong type", comp, fmt.Sprintf(`{"model":%q,"prompt":{"text":"hi"}}`, testModel), nil, 400, "BadRequestError"},
		{"batched prompts", comp, fmt.Sprintf(`{"model":%q,"prompt":["one","two"]}`, testModel), nil, 400, "BadRequestError"},
		{"batched token prompts", comp, fmt.Sprintf(`{"model":%q,"prompt":[[1,2],[3,4]]}`, testModel), nil, 400, "BadRequestError"},
		{"prompt nested three lists deep", comp, fmt.Sprintf(`{"model":%q,"prompt":[[[1,2]]]}`, testModel), nil, 400, "BadRequestError"},
		{"prompt nested hundreds of lists deep", comp, fmt.Sprintf(`{"model":%q,"prompt":%s1%s}`, testModel, strings.Repeat("[", 400), strings.Repeat("]", 400)), nil, 400, "BadRequestError"},
		{"token id out of range", comp, fmt.Sprintf(`{"model":%q,"prompt":[1,4294967296]}`, testModel), nil, 400, "BadRequestError"},
		{"unknown x-worker-instance-id", comp, completionBody("hi", 2), []string{"X-Worker-Instance-Id", "w9"}, 400, "BadRequestError"},
		{"unknown x-prefill-instance-id", comp, completionBody("hi", 2),
			[]string{"X-Worker-Instance-Id", "w0", "X-Prefill-Instance-Id", "nobody"}, 400, "BadRequestError"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := testutil.ToFloat64(rt.metrics.requests.WithLabelValues(PolicyRoundRobin, resultClientError, ""))
			req, err := http.NewRequest(http.MethodPost, rt.url+tt.path, strings.NewReader(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Content-Type", "application/json")
			for i := 0; i+1 < len(tt.hdr); i += 2 {
				req.Header.Set(tt.hdr[i], tt.hdr[i+1])
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var body errorBody
			decErr := json.NewDecoder(resp.Body).Decode(&body)
			if resp.StatusCode != tt.status {
				t.Fatalf("status %d (%+v), want %d", resp.StatusCode, body, tt.status)
			}
			if decErr != nil || body.Error.Type != tt.kind || body.Error.Code != tt.status || body.Error.Message == "" {
				t.Fatalf("error body %+v (decode: %v), want an OpenAI error of type %s and code %d", body, decErr, tt.kind, tt.status)
			}
			if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
				t.Errorf("Content-Type %q, want application/json", ct)
			}
			if after := testutil.ToFloat64(rt.metrics.requests.WithLabelValues(PolicyRoundRobin, resultClientError, "")); after != before+1 {
				t.Errorf("requests{result=client_error} went %v -> %v, want +1", before, after)
			}
		})
	}
	if c := counts(up); c["w0"] != 0 || c["w1"] != 0 {
		t.Fatalf("engines received %v generation requests; bad input must not reach them", c)
	}
	if n := rt.decisionsTotal(); n != 0 {
		t.Fatalf("%v routing decisions for bad input, want 0", n)
	}
	// The router still serves good requests afterwards.
	if code, _, raw := post(t, rt.url, "/v1/completions", completionBody("a good one", 2)); code != http.StatusOK {
		t.Fatalf("good request after the bad ones: %d %s", code, raw)
	}
	rt.assertNoLoad(t, f.ids)
}

// In direct mode a known x-worker-instance-id is obeyed exactly; without it the
// policy (round-robin here) decides.
func TestDirectModeDispatchesToTheNamedWorker(t *testing.T) {
	rt, f, up := directRouter(t)
	for _, w := range f.ids {
		before := counts(up)
		for i := range 3 {
			body := completionBody(fmt.Sprintf("direct to %s %d", w, i), 2)
			if code, _, raw := post(t, rt.url, "/v1/completions", body, "X-Worker-Instance-Id", w); code != http.StatusOK {
				t.Fatalf("direct to %s: %d %s", w, code, raw)
			}
		}
		after := counts(up)
		for _, o := range f.ids {
			want := 0
			if o == w {
				want = 3
			}
			if d := after[o] - before[o]; d != want {
				t.Fatalf("3 requests naming %s: %s received %d, want %d", w, o, d, want)
			}
		}
	}
	if got := testutil.ToFloat64(rt.metrics.decisions.WithLabelValues(PolicyRoundRobin, string(SourceDirect))); got != 6 {
		t.Fatalf("direct decisions = %v, want 6", got)
	}
	// The chat endpoint honours the header too.
	before := counts(up)
	chat := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hello"}],"max_tokens":2}`, testModel)
	if code, _, raw := post(t, rt.url, "/v1/chat/completions", chat, "X-Worker-Instance-Id", "w1"); code != http.StatusOK {
		t.Fatalf("direct chat: %d %s", code, raw)
	}
	if after := counts(up); after["w1"]-before["w1"] != 1 || after["w0"] != before["w0"] {
		t.Fatalf("direct chat to w1: counts %v -> %v", before, after)
	}
	// No header: round-robin alternates.
	before = counts(up)
	for i := range 4 {
		if code, _, raw := post(t, rt.url, "/v1/completions", completionBody(fmt.Sprintf("policy %d", i), 2)); code != http.StatusOK {
			t.Fatalf("no header: %d %s", code, raw)
		}
	}
	after := counts(up)
	if d0, d1 := after["w0"]-before["w0"], after["w1"]-before["w1"]; d0 != 2 || d1 != 2 {
		t.Fatalf("4 requests without the header went w0:%d w1:%d, want the policy's 2:2", d0, d1)
	}
	rt.assertNoLoad(t, f.ids)
}

// In auto mode the direct-mode headers mean nothing: the policy decides.
func TestAutoModeIgnoresWorkerHeaders(t *testing.T) {
	f := startFleet(t, 2, nil)
	cfg := testConfig(t, f)
	cfg.Policy = PolicyRoundRobin
	up := countUpstream(t, &cfg)
	rt := startRouter(t, cfg)
	for i := range 4 {
		if code, _, raw := post(t, rt.url, "/v1/completions", completionBody(fmt.Sprintf("auto %d", i), 2), "X-Worker-Instance-Id", "w9"); code != http.StatusOK {
			t.Fatalf("auto mode with a worker header: %d %s", code, raw)
		}
	}
	if c := counts(up); c["w0"] != 2 || c["w1"] != 2 {
		t.Fatalf("auto mode: %v, want round-robin's 2:2", c)
	}
}

// The router chooses the data-parallel rank and books the load there; a client's
// X-Data-Parallel-Rank header is not passed on (an engine would refuse a rank it
// lacks, or serve on a rank the ledger does not count).
func TestClientDataParallelRankHeaderIsNotForwarded(t *testing.T) {
	rt, f, up := directRouter(t)
	for _, v := range []string{"7", "abc", "0"} {
		if code, _, raw := post(t, rt.url, "/v1/completions", completionBody("rank "+v, 2), HeaderDPRank, v); code != http.StatusOK {
			t.Fatalf("X-Data-Parallel-Rank: %s: %d %s, want the router's own rank choice served", v, code, raw)
		}
	}
	if c := counts(up); c["w0"]+c["w1"] != 3 {
		t.Fatalf("engines saw %v, want 3 requests", c)
	}
	rt.assertNoLoad(t, f.ids)
}

// Integer fields are read as vLLM reads them (pydantic's lax mode): an integral
// number or a numeric string is served; a fraction is a 400 naming the field,
// sent nowhere.
func TestLaxIntegerFieldsAreReadAsVLLMReadsThem(t *testing.T) {
	rt, _, up := directRouter(t)
	chat := func(extra string) string {
		return fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hi"}],%s}`, testModel, extra)
	}
	for _, extra := range []string{`"max_tokens":2.0`, `"max_completion_tokens":"2"`, `"n":"1","max_tokens":2`} {
		if code, _, raw := post(t, rt.url, "/v1/chat/completions", chat(extra)); code != http.StatusOK {
			t.Errorf("%s: %d %s, want 200", extra, code, raw)
		}
	}
	if code, _, raw := post(t, rt.url, "/v1/completions", fmt.Sprintf(`{"model":%q,"prompt":"hi","max_tokens":"2","n":1.0}`, testModel)); code != http.StatusOK {
		t.Errorf("completion with max_tokens \"2\", n 1.0: %d %s, want 200", code, raw)
	}
	served := counts(up)["w0"] + counts(up)["w1"]
	for field, extra := range map[string]string{"max_tokens": `"max_tokens":2.5`, "max_completion_tokens": `"max_completion_tokens":"two"`, "n": `"n":true`} {
		code, _, raw := post(t, rt.url, "/v1/chat/completions", chat(extra))
		if code != http.StatusBadRequest || !strings.Contains(raw, "."+field+" ") {
			t.Errorf("%s: %d %s, want a 400 naming %s", extra, code, raw, field)
		}
	}
	if c := counts(up); c["w0"]+c["w1"] != served {
		t.Errorf("refused requests reached the engines: %v", c)
	}
}
