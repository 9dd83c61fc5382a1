package router

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvindex/kvindex/bench/fakeengine"
)

// engineCounter sums an engine's /metrics series whose line starts with prefix
// (a vLLM metric name and "{").
func engineCounter(t *testing.T, e *fakeengine.Engine, prefix string) float64 {
	t.Helper()
	resp, err := http.Get(e.URL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	total := 0.0
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, prefix) {
			var v float64
			fmt.Sscan(line[strings.LastIndexByte(line, ' ')+1:], &v)
			total += v
		}
	}
	return total
}

// enginePromptTokens is vllm:prompt_tokens_total: nonzero once a generation started.
func enginePromptTokens(t *testing.T, e *fakeengine.Engine) float64 {
	return engineCounter(t, e, "vllm:prompt_tokens_total{")
}

// engineRunning is the requests running or waiting on the engine.
func engineRunning(t *testing.T, e *fakeengine.Engine) float64 {
	return engineCounter(t, e, "vllm:num_requests_running{") + engineCounter(t, e, "vllm:num_requests_waiting{")
}

func streamBody(prompt string, maxTokens int) string {
	return fmt.Sprintf(`{"model":%q,"prompt":%s,"max_tokens":%d,"stream":true}`, testModel, quote(prompt), maxTokens)
}

// Load returns to zero after a success, an upstream 500, a retry and a client
// that cancels mid-stream.
func TestLoadIsReleasedOnEveryPath(t *testing.T) {
	f := startFleet(t, 2, func(_ int, c *fakeengine.Config) { c.TimeScale = 0.02 })
	cfg := testConfig(t, f)
	cfg.Policy = PolicyRoundRobin
	cfg.BreakerFailureThreshold = 0
	rt := startRouter(t, cfg)
	prompt := words("load", 60)

	t.Run("success", func(t *testing.T) {
		if code, _, raw := post(t, rt.url, "/v1/completions", completionBody(prompt, 4)); code != http.StatusOK {
			t.Fatalf("%d %s", code, raw)
		}
		rt.assertNoLoad(t, f.ids)
	})
	t.Run("upstream 500 then retry", func(t *testing.T) {
		f.engines["w0"].SetFaults(fakeengine.Faults{FailRate: 1, FailStatus: 500})
		defer f.engines["w0"].SetFaults(fakeengine.Faults{FailStatus: 500})
		retries := testutil.ToFloat64(rt.metrics.retries.WithLabelValues("status_5xx"))
		for range 4 { // round-robin: half of them hit w0 first
			if code, _, raw := post(t, rt.url, "/v1/completions", completionBody(prompt, 4)); code != http.StatusOK {
				t.Fatalf("with one worker failing and a retry left, got %d %s", code, raw)
			}
		}
		if got := testutil.ToFloat64(rt.metrics.retries.WithLabelValues("status_5xx")) - retries; got < 1 {
			t.Errorf("retries after 5xx = %v, want at least 1", got)
		}
		rt.assertNoLoad(t, f.ids)
	})
	t.Run("upstream 500 with no retry left", func(t *testing.T) {
		for _, e := range f.engines {
			e.SetFaults(fakeengine.Faults{FailRate: 1, FailStatus: 500})
		}
		defer func() {
			for _, e := range f.engines {
				e.SetFaults(fakeengine.Faults{FailStatus: 500})
			}
		}()
		code, _, raw := post(t, rt.url, "/v1/completions", completionBody(prompt, 4))
		if code != http.StatusInternalServerError || !strings.Contains(raw, "injected fault") {
			t.Fatalf("every worker failing: got %d %s, want the engine's 500 relayed", code, raw)
		}
		rt.assertNoLoad(t, f.ids)
	})
	t.Run("client cancels mid-stream", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, rt.url+"/v1/completions", strings.NewReader(streamBody(prompt, 400)))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 64)
		if _, err := resp.Body.Read(buf); err != nil {
			t.Fatalf("reading the first chunk: %v", err)
		}
		if n := len(rt.ledger.Loads()); n != 1 {
			t.Fatalf("mid-stream the ledger holds %d targets, want 1", n)
		}
		cancel()
		resp.Body.Close()
		rt.assertNoLoad(t, f.ids)
		// The engine saw the cancellation too: nothing keeps running there.
		for id, e := range f.engines {
			waitFor(t, 10*time.Second, id+" to have no running request", func() bool { return engineRunning(t, e) == 0 })
		}
	})
}

// A worker whose stream does not start within --first-byte-timeout is abandoned
// and the request succeeds elsewhere; a stream that breaks after bytes reached
// the client ends with an SSE error event, and no second generation is started.
func TestFailover(t *testing.T) {
	t.Run("before the first byte", func(t *testing.T) {
		f := startFleet(t, 2, nil)
		f.engines["w0"].SetFaults(fakeengine.Faults{FailStatus: 500, HangBeforeFirstToken: time.Minute})
		cfg := testConfig(t, f)
		cfg.Policy = PolicyRoundRobin
		cfg.FirstByteTimeout = 300 * time.Millisecond
		rt := startRouter(t, cfg)
		for range 2 { // one of the two starts on w0
			if resp, raw := send(t, rt.url, "/v1/completions", streamBody(words("fo", 20), 2)); resp.StatusCode != http.StatusOK {
				t.Fatalf("%d %s", resp.StatusCode, raw)
			}
		}
		// Round-robin's counter also turns on the retry, so both requests start on w0.
		if got := testutil.ToFloat64(rt.metrics.retries.WithLabelValues("first_byte_timeout")); got != 2 {
			t.Errorf("first-byte-timeout retries = %v, want 2", got)
		}
		if got := rt.servedCount("w1"); got != 2 {
			t.Errorf("w1 served %d, want both requests", got)
		}
		rt.assertNoLoad(t, f.ids)
	})
	t.Run("connect error", func(t *testing.T) {
		f := startFleet(t, 1, nil)
		cfg := testConfig(t, f)
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		dead := cfg.Workers[0]
		dead.ID, dead.HTTP = "gone", "http://"+l.Addr().String() // nothing listens there
		l.Close()
		cfg.Workers = append(cfg.Workers, dead)
		cfg.Policy = PolicyRoundRobin
		rt := startRouter(t, cfg)
		for i := range 2 { // one of the two starts on the dead worker
			if code, _, raw := post(t, rt.url, "/v1/completions", completionBody(fmt.Sprintf("connect %d", i), 2)); code != http.StatusOK {
				t.Fatalf("%d %s", code, raw)
			}
		}
		if got := testutil.ToFloat64(rt.metrics.retries.WithLabelValues("connect")); got < 1 {
			t.Errorf("connect retries = %v, want at least 1", got)
		}
		if got := rt.servedCount("w0"); got != 2 {
			t.Errorf("w0 served %d, want both requests", got)
		}
		rt.assertNoLoad(t, append(f.ids, "gone"))
	})
	t.Run("mid-stream", func(t *testing.T) {
		f := startFleet(t, 2, func(_ int, c *fakeengine.Config) { c.Faults.AbortAfterTokens = 3 })
		cfg := testConfig(t, f)
		rt := startRouter(t, cfg)
		prompt := words("midstream", 40)
		resp, err := http.Post(rt.url+"/v1/completions", "application/json", strings.NewReader(streamBody(prompt, 50)))
		if err != nil {
			t.Fatal(err)
		}
		events := sseEvents(t, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d, want 200 (the stream had started)", resp.StatusCode)
		}
		if len(events) != 5 || events[4] != "[DONE]" {
			t.Fatalf("events = %q, want 3 token chunks, an error event and [DONE]", events)
		}
		var e errorBody
		if err := json.Unmarshal([]byte(events[3]), &e); err != nil || e.Error.Code != http.StatusBadGateway {
			t.Fatalf("event %q is not an OpenAI error with code 502: %v", events[3], err)
		}
		started := 0
		for _, eng := range f.engines {
			if enginePromptTokens(t, eng) > 0 {
				started++
			}
		}
		if started != 1 {
			t.Errorf("%d engines started a generation, want exactly 1 (no retry after the first byte)", started)
		}
		rt.assertNoLoad(t, f.ids)
	})
}

// In direct mode the header names the one worker a request may go to: its
// failure is the answer, never retried on that same worker (which would send a
// failing engine the request 1 + --request-max-retries times and count as many
// breaker failures), nor anywhere else.
func TestDirectModeAnswersTheNamedWorkersFailureWithoutRetryingIt(t *testing.T) {
	for _, status := range []int{http.StatusInternalServerError, http.StatusTooManyRequests} {
		t.Run(http.StatusText(status), func(t *testing.T) {
			f := startFleet(t, 2, func(i int, c *fakeengine.Config) {
				if i == 0 {
					c.Faults = fakeengine.Faults{FailRate: 1, FailStatus: status}
				}
			})
			cfg := testConfig(t, f)
			cfg.Mode = ModeDirect
			cfg.RequestMaxRetries = 3
			up := countUpstream(t, &cfg)
			rt := startRouter(t, cfg)
			code, _, raw := post(t, rt.url, "/v1/completions", completionBody("direct", 2), "X-Worker-Instance-Id", "w0")
			if code != status {
				t.Errorf("answer %d %s, want the named worker's %d", code, raw, status)
			}
			if got := counts(up); got["w0"] != 1 || got["w1"] != 0 {
				t.Errorf("requests received %v, want w0:1 w1:0", got)
			}
			if got := testutil.CollectAndCount(rt.metrics.retries); got != 0 {
				t.Errorf("%d retry reasons counted, want none (nothing was retried)", got)
			}
			rt.assertNoLoad(t, f.ids)
		})
	}
}

// A stream that stalls after it started is ended by --request-idle-timeout with
// an SSE error event (504) and cancelled upstream.
func TestStalledStreamEndsWithIdleTimeout(t *testing.T) {
	f := startFleet(t, 1, func(_ int, c *fakeengine.Config) { c.Faults.StallAfterTokens = 2 })
	cfg := testConfig(t, f)
	cfg.RequestIdleTimeout = 300 * time.Millisecond
	rt := startRouter(t, cfg)
	resp, err := http.Post(rt.url+"/v1/completions", "application/json", strings.NewReader(streamBody(words("stall", 30), 20)))
	if err != nil {
		t.Fatal(err)
	}
	events := sseEvents(t, resp.Body)
	resp.Body.Close()
	if len(events) != 4 || events[3] != "[DONE]" {
		t.Fatalf("events = %q, want 2 token chunks, an error event and [DONE]", events)
	}
	var e errorBody
	if err := json.Unmarshal([]byte(events[2]), &e); err != nil || e.Error.Code != http.StatusGatewayTimeout {
		t.Fatalf("event %q is not an OpenAI error with code 504: %v", events[2], err)
	}
	waitFor(t, 10*time.Second, "the engine to drop the stalled request", func() bool { return engineRunning(t, f.engines["w0"]) == 0 })
	rt.assertNoLoad(t, f.ids)
}

// The engine's trailers (sent after a streamed body) reach the client.
func TestTrailersAreRelayed(t *testing.T) {
	f := startFleet(t, 1, nil)
	rt := startRouter(t, testConfig(t, f))
	resp, err := http.Post(rt.url+"/v1/completions", "application/json", strings.NewReader(streamBody(words("trailer", 10), 3)))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if got := resp.Trailer.Get(fakeengine.HeaderSimTTFT); got == "" {
		t.Errorf("trailer %s missing; trailers %v", fakeengine.HeaderSimTTFT, resp.Trailer)
	}
}

// The SSE stream reaches the client event by event, not when the engine is done:
// the engine stalls after two token chunks and holds the stream open until the
// client leaves, so the client can read those two only if the router flushed
// each as it came.
func TestSSEIsRelayedEventByEvent(t *testing.T) {
	f := startFleet(t, 1, func(_ int, c *fakeengine.Config) { c.Faults.StallAfterTokens = 2 })
	cfg := testConfig(t, f)
	cfg.RequestIdleTimeout = 0 // nothing but the client ends the stalled stream
	rt := startRouter(t, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// Headers and events are read aside: a buffering router would block both.
	got := make(chan []string, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, rt.url+"/v1/completions", strings.NewReader(streamBody(words("flush", 30), 20)))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			got <- nil
			return
		}
		defer resp.Body.Close() // after the test's cancel: the stream stays open until then
		var events []string
		sc := bufio.NewScanner(resp.Body)
		for len(events) < 2 && sc.Scan() {
			if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
				events = append(events, d)
			}
		}
		got <- events
		<-ctx.Done()
	}()
	select {
	case events := <-got:
		for _, e := range events {
			var chunk struct {
				Choices []struct {
					Text string `json:"text"`
				} `json:"choices"`
			}
			if json.Unmarshal([]byte(e), &chunk) != nil || len(chunk.Choices) != 1 || chunk.Choices[0].Text == "" {
				t.Errorf("event %q is not a token chunk", e)
			}
		}
		if len(events) != 2 {
			t.Fatalf("read %d events before the stream ended, want 2", len(events))
		}
	case <-time.After(30 * time.Second):
		cancel()
		t.Fatal("the two token chunks the engine sent did not reach the client while the stream stayed open: the router buffers")
	}
	if n := rt.ledger.Load(Target{Worker: "w0"}).InFlight; n != 1 {
		t.Errorf("in flight on w0 = %d while the stream is open, want 1", n)
	}
	cancel()
	waitFor(t, 10*time.Second, "the engine to drop the stream", func() bool { return engineRunning(t, f.engines["w0"]) == 0 })
	rt.assertNoLoad(t, f.ids)
}
