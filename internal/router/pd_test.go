package router

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvindex/kvindex/bench/fakeengine"
)

// pdFleet is two prefill and one decode engine (w0, w1 prefill; w2 decode).
func pdFleet(t *testing.T, mutate func(i int, c *fakeengine.Config)) *fleet {
	return startFleet(t, 3, func(i int, c *fakeengine.Config) {
		c.Role = fakeengine.RolePrefill
		if i == 2 {
			c.Role = fakeengine.RoleDecode
		}
		if mutate != nil {
			mutate(i, c)
		}
	})
}

// engineGenerated reads vllm:generation_tokens_total summed over ranks.
func engineGenerated(t *testing.T, e *fakeengine.Engine) float64 {
	return engineCounter(t, e, "vllm:generation_tokens_total{")
}

// The prefill leg runs on a prefill worker (one token, not streamed), the decode
// worker receives its kv_transfer_params and streams the answer: one coherent
// stream to the client.
func TestPDDecodeGetsThePrefillWorkersTransferParams(t *testing.T) {
	f := pdFleet(t, nil)
	rt := startRouter(t, testConfig(t, f))
	prompt := words("pd", 100)

	code, c, raw := post(t, rt.url, "/v1/completions", completionBody(prompt, 6))
	if code != http.StatusOK {
		t.Fatalf("%d %s", code, raw)
	}
	// The fake decode engine counts the prompt as cached only when it took it
	// from a prefill engine's kv_transfer_params.
	if c.Usage.PromptTokensDetails.CachedTokens != c.Usage.PromptTokens {
		t.Errorf("decode reports %d of %d prompt tokens received; kv_transfer_params did not arrive",
			c.Usage.PromptTokensDetails.CachedTokens, c.Usage.PromptTokens)
	}
	prefillTokens := engineGenerated(t, f.engines["w0"]) + engineGenerated(t, f.engines["w1"])
	if prefillTokens != 1 {
		t.Errorf("prefill workers generated %v tokens, want 1 (max_tokens 1 on the prefill leg)", prefillTokens)
	}
	if got := engineGenerated(t, f.engines["w2"]); got != 6 {
		t.Errorf("decode worker generated %v tokens, want 6", got)
	}

	// Streaming: the client gets the decode worker's stream, chunk by chunk.
	resp, err := http.Post(rt.url+"/v1/completions", "application/json", strings.NewReader(streamBody(prompt+" again", 5)))
	if err != nil {
		t.Fatal(err)
	}
	events := sseEvents(t, resp.Body)
	resp.Body.Close()
	if len(events) < 2 || events[len(events)-1] != "[DONE]" {
		t.Fatalf("stream events %q do not end in [DONE]", events)
	}
	tokens := 0
	for _, e := range events[:len(events)-1] {
		var chunk struct {
			Choices []struct {
				Text         string  `json:"text"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
			Error json.RawMessage `json:"error"`
		}
		if err := json.Unmarshal([]byte(e), &chunk); err != nil || chunk.Error != nil {
			t.Fatalf("event %q: %v", e, err)
		}
		if len(chunk.Choices) == 1 && chunk.Choices[0].FinishReason == nil {
			tokens++
		}
	}
	if tokens != 5 {
		t.Errorf("stream carried %d token chunks, want 5", tokens)
	}
	rt.assertNoLoad(t, f.ids)
}

// A prefill worker that fails or hangs never leaves decode waiting: the leg is
// retried on the other prefill worker, and when every prefill fails the decode
// worker prefills locally.
func TestPDFailingPrefillDoesNotHangDecode(t *testing.T) {
	for _, c := range []struct {
		name   string
		faults fakeengine.Faults
	}{
		{"500", fakeengine.Faults{FailRate: 1, FailStatus: 500}},
		{"hang", fakeengine.Faults{FailStatus: 500, HangBeforeFirstToken: time.Minute}},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := pdFleet(t, nil)
			cfg := testConfig(t, f)
			cfg.FirstByteTimeout = 300 * time.Millisecond
			cfg.BreakerFailureThreshold = 0
			rt := startRouter(t, cfg)

			// One prefill worker broken: the other takes the leg.
			f.engines["w0"].SetFaults(c.faults)
			for i := range 3 {
				code, got, raw := post(t, rt.url, "/v1/completions", completionBody(words("one-broken", 50+i), 3))
				if code != http.StatusOK || got.Usage.PromptTokensDetails.CachedTokens != got.Usage.PromptTokens {
					t.Fatalf("with w0 broken: %d %s, want the prompt prefilled by w1", code, raw)
				}
			}
			// Both broken: decode prefills locally.
			f.engines["w1"].SetFaults(c.faults)
			code, got, raw := post(t, rt.url, "/v1/completions", completionBody(words("both-broken", 50), 3))
			if code != http.StatusOK {
				t.Fatalf("with every prefill worker broken: %d %s, want the decode worker to answer", code, raw)
			}
			if got.Usage.PromptTokensDetails.CachedTokens != 0 {
				t.Errorf("decode reports %d tokens received although no prefill succeeded", got.Usage.PromptTokensDetails.CachedTokens)
			}
			if n := testutil.ToFloat64(rt.metrics.pdLocalPrefill.WithLabelValues("prefill_failed")); n != 1 {
				t.Errorf("local prefill fallbacks = %v, want 1", n)
			}
			rt.assertNoLoad(t, f.ids)
		})
	}
}

// A client that hangs up cancels whichever leg is running: the prefill leg (the
// decode leg then never starts), or the decode stream.
func TestPDClientCancelReachesBothLegs(t *testing.T) {
	f := pdFleet(t, func(i int, c *fakeengine.Config) {
		if i < 2 {
			c.Faults.HangBeforeFirstToken = time.Minute
		} else {
			c.TimeScale = 0.02
		}
	})
	cfg := testConfig(t, f)
	up := countUpstream(t, &cfg)
	rt := startRouter(t, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, rt.url+"/v1/completions", strings.NewReader(completionBody(words("cancel-prefill", 50), 3)))
	done := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	waitFor(t, 5*time.Second, "the prefill leg to be in flight", func() bool {
		return rt.ledger.Load(Target{Worker: "w0"}).InFlight+rt.ledger.Load(Target{Worker: "w1"}).InFlight == 1 &&
			up["w0"].inflight.Load()+up["w1"].inflight.Load() == 1
	})
	cancel()
	<-done
	rt.assertNoLoad(t, f.ids)
	// The prefill engine hangs for a minute: only the router hanging up ends the
	// request there this early.
	waitFor(t, 10*time.Second, "the prefill leg's upstream request to end", func() bool {
		return up["w0"].inflight.Load()+up["w1"].inflight.Load() == 0
	})
	if got := enginePromptTokens(t, f.engines["w2"]); got != 0 {
		t.Errorf("the decode worker received %v prompt tokens after the client left during prefill", got)
	}

	// Cancel during the decode stream.
	for _, id := range []string{"w0", "w1"} {
		f.engines[id].SetFaults(fakeengine.Faults{FailStatus: 500})
	}
	f.engines["w2"].SetFaults(fakeengine.Faults{FailStatus: 500})
	slow := f.engines["w2"]
	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	req, _ = http.NewRequestWithContext(ctx, http.MethodPost, rt.url+"/v1/completions", strings.NewReader(streamBody(words("cancel-decode", 50), 200)))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 16)
	if _, err := resp.Body.Read(buf); err != nil {
		t.Fatal(err)
	}
	cancel()
	resp.Body.Close()
	rt.assertNoLoad(t, f.ids)
	waitFor(t, 10*time.Second, "the decode engine to drop the request", func() bool { return engineRunning(t, slow) == 0 })
}

// recentDecision is the router's seq-th decision as the console keeps it.
func (r *testRouter) recentDecision(t *testing.T, seq uint64) decisionJSON {
	t.Helper()
	e, ok := r.ui.recent.find(seq)
	if !ok {
		t.Fatalf("decision %d is not kept", seq)
	}
	return e.json().decisionJSON
}

// postHeader is post that also returns the answer's headers; it must be a 200.
func postHeader(t *testing.T, url, body string, header ...string) (completion, http.Header) {
	t.Helper()
	resp, raw := send(t, url, "/v1/completions", body, header...)
	var c completion
	if err := json.Unmarshal(raw, &c); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d %s: %v", resp.StatusCode, raw, err)
	}
	return c, resp.Header
}

// Conditional disaggregation: a prompt with fewer than --pd-min-uncached-tokens
// tokens uncached on the decode worker is prefilled there (no prefill leg at all);
// a longer one gets a prefill leg; a follow-up whose prefix the decode worker
// already holds (it decoded the long one) is local again although it is long.
func TestPDConditionalDisaggregation(t *testing.T) {
	f := pdFleet(t, nil)
	cfg := testConfig(t, f)
	cfg.PDMinUncachedTokens = 500
	cfg.PredictedTTL = 10 * time.Minute // the decode worker's overlap comes from the router's own decisions
	rt := startRouter(t, cfg)
	prefillWork := func() float64 {
		return enginePromptTokens(t, f.engines["w0"]) + enginePromptTokens(t, f.engines["w1"])
	}
	local := func() float64 {
		return testutil.ToFloat64(rt.metrics.pdLocalPrefill.WithLabelValues("below_threshold"))
	}

	for i, c := range []struct {
		name   string
		prompt string
		split  bool
	}{
		{"short prompt", words("short", 50), false},                           // ~190 tokens
		{"long prompt", words("long", 300), true},                             // ~1,100 tokens
		{"follow-up of the long prompt", words("long", 300) + " more", false}, // ~5 uncached on w2
	} {
		workBefore, localBefore := prefillWork(), local()
		got, h := postHeader(t, rt.url, completionBody(c.prompt, 3))
		if h.Get(HeaderServedBy) != "w2" {
			t.Fatalf("%s: served by %q, want the decode worker w2", c.name, h.Get(HeaderServedBy))
		}
		d := rt.recentDecision(t, uint64(i+1))
		if len(d.Candidates) != 1 || d.Candidates[0].Worker != "w2" {
			t.Fatalf("%s: decode candidates %+v, want w2 alone", c.name, d.Candidates)
		}
		uncached := d.PromptTokens - d.Candidates[0].Overlap*d.BlockSize
		if c.split {
			if h.Get(HeaderPrefillBy) == "" || prefillWork() == workBefore || got.Usage.PromptTokensDetails.CachedTokens != got.Usage.PromptTokens {
				t.Errorf("%s (%d tokens uncached on w2): prefill worker %q, prefill engines' prompt tokens %v -> %v, decode received %d of %d: want a prefill leg",
					c.name, uncached, h.Get(HeaderPrefillBy), workBefore, prefillWork(), got.Usage.PromptTokensDetails.CachedTokens, got.Usage.PromptTokens)
			}
			if uncached < cfg.PDMinUncachedTokens || local() != localBefore {
				t.Errorf("%s: %d tokens uncached, local prefills %v -> %v", c.name, uncached, localBefore, local())
			}
			continue
		}
		if h.Get(HeaderPrefillBy) != "" || prefillWork() != workBefore || local() != localBefore+1 {
			t.Errorf("%s (%d tokens uncached on w2): prefill worker %q, prefill engines' prompt tokens %v -> %v, local prefills %v -> %v: want the decode worker to prefill it",
				c.name, uncached, h.Get(HeaderPrefillBy), workBefore, prefillWork(), localBefore, local())
		}
		if uncached >= cfg.PDMinUncachedTokens || !d.LocalPrefill {
			t.Errorf("%s: decision %+v, %d tokens uncached: want local prefill below %d", c.name, d, uncached, cfg.PDMinUncachedTokens)
		}
	}
	rt.assertNoLoad(t, f.ids)
}

// In direct mode the headers name both legs: x-prefill-instance-id gets the
// prefill leg, x-worker-instance-id the decode stream with its
// kv_transfer_params; without x-prefill-instance-id the named decode worker
// prefills itself.
func TestPDDirectModeNamesBothLegs(t *testing.T) {
	f := pdFleet(t, nil)
	cfg := testConfig(t, f)
	cfg.Mode = ModeDirect
	rt := startRouter(t, cfg)
	for i, prefill := range []string{"w1", "w0", ""} {
		before := map[string]float64{}
		for _, id := range f.ids {
			before[id] = engineGenerated(t, f.engines[id])
		}
		hdr := []string{"X-Worker-Instance-Id", "w2"}
		if prefill != "" {
			hdr = append(hdr, "X-Prefill-Instance-Id", prefill)
		}
		got, h := postHeader(t, rt.url, completionBody(words(fmt.Sprintf("direct-pd-%d", i), 80), 4), hdr...)
		if h.Get(HeaderServedBy) != "w2" || h.Get(HeaderPrefillBy) != prefill {
			t.Fatalf("prefill %q: served by %q, prefilled by %q", prefill, h.Get(HeaderServedBy), h.Get(HeaderPrefillBy))
		}
		for _, id := range []string{"w0", "w1"} {
			want := 0.0
			if id == prefill {
				want = 1 // max_tokens 1 on the prefill leg
			}
			if d := engineGenerated(t, f.engines[id]) - before[id]; d != want {
				t.Errorf("prefill %q: %s generated %v tokens, want %v", prefill, id, d, want)
			}
		}
		received := got.Usage.PromptTokensDetails.CachedTokens == got.Usage.PromptTokens
		if received != (prefill != "") {
			t.Errorf("prefill %q: the decode worker received %d of %d prompt tokens", prefill, got.Usage.PromptTokensDetails.CachedTokens, got.Usage.PromptTokens)
		}
	}
	rt.assertNoLoad(t, f.ids)
}
