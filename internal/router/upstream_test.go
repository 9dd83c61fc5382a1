package router

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvindex/kvindex/bench/fakeengine"
)

// vLLM sends a non-streamed answer, headers and body, only when the generation
// ends, so --first-byte-timeout (a bound on the first token) cannot apply to it:
// its wait is bounded by --request-idle-timeout. A slow but healthy generation is
// answered once and counts nothing against the breaker; an answer that never
// comes ends in a 504 once the idle timeout passes, counts against the breaker
// and is not run again elsewhere (the engine may have been generating all
// along). A stream keeps the first-byte timeout and its retry.
func TestNonStreamedAnswerWaitsForTheIdleTimeoutNotTheFirstByteTimeout(t *testing.T) {
	cases := []struct {
		name      string
		stream    bool
		hang      time.Duration // every engine's wait before it starts
		idle      time.Duration // --request-idle-timeout
		wantCode  int
		wantSent  int // generation requests the engines received
		wantTrips int // breaker trips (threshold 1) over the fleet
	}{
		{"non-streamed generation longer than the first-byte timeout", false, 0, time.Minute, http.StatusOK, 1, 0},
		{"non-streamed answer that never comes", false, time.Minute, 400 * time.Millisecond, http.StatusGatewayTimeout, 1, 1},
		{"streamed answer whose first token never comes", true, time.Minute, time.Minute, http.StatusGatewayTimeout, 2, 2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := startFleet(t, 2, func(_ int, ec *fakeengine.Config) {
				// 30 tokens of 20 ms steps: several first-byte timeouts long.
				ec.TimeScale = 1
				ec.Timing = fakeengine.Timing{StepBase: 20 * time.Millisecond}
				ec.Faults.HangBeforeFirstToken = c.hang
			})
			cfg := testConfig(t, f)
			cfg.FirstByteTimeout = 100 * time.Millisecond
			cfg.RequestIdleTimeout = c.idle
			cfg.BreakerFailureThreshold = 1
			up := countUpstream(t, &cfg)
			rt := startRouter(t, cfg)
			body := fmt.Sprintf(`{"model":%q,"prompt":"hello there","max_tokens":30,"stream":%t}`, testModel, c.stream)
			resp, raw := send(t, rt.url, "/v1/completions", body)
			if resp.StatusCode != c.wantCode {
				t.Errorf("answer %d %s, want %d", resp.StatusCode, raw, c.wantCode)
			}
			if got := counts(up); got["w0"]+got["w1"] != c.wantSent {
				t.Errorf("engines received %v, want %d in all", got, c.wantSent)
			}
			if got := rt.breakerTrips("w0") + rt.breakerTrips("w1"); got != float64(c.wantTrips) {
				t.Errorf("breaker trips %v, want %d", got, c.wantTrips)
			}
			rt.assertNoLoad(t, f.ids)
		})
	}
}

// A client that keeps its connection but stops reading a stream is cut off once
// a chunk waited --request-idle-timeout for it: its load is released, its
// connection closed and the generation cancelled upstream, and the request
// counts as canceled, not against the engine's breaker (the engine did nothing
// wrong).
func TestClientThatStopsReadingIsCutOffAfterTheIdleTimeout(t *testing.T) {
	f := startFleet(t, 1, func(_ int, c *fakeengine.Config) { c.NumGPUBlocks = 9000; c.MaxModelLen = 32768 })
	cfg := testConfig(t, f)
	// Long enough that the engine, generating as fast as it can, never pauses
	// that long (even on busy cores under -race): the client stalls, not the
	// engine, whose pause would end the stream with an SSE error event instead.
	cfg.RequestIdleTimeout = 2 * time.Second
	cfg.BreakerFailureThreshold = 1
	rt := startRouter(t, cfg)

	// A small receive buffer, so the router's writes block soon.
	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 2048) }); err != nil {
			return err
		}
		return serr
	}}
	conn, err := d.DialContext(context.Background(), "tcp", rt.url[len("http://"):])
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := fmt.Sprintf(`{"model":%q,"prompt":"tell me everything","max_tokens":30000,"stream":true}`, testModel)
	fmt.Fprintf(conn, "POST /v1/completions HTTP/1.1\r\nHost: router\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	w0 := Target{Worker: "w0"}
	waitFor(t, 10*time.Second, "the stream in flight", func() bool { return rt.ledger.Load(w0).InFlight == 1 })
	// Never read, until the router let go.
	rt.assertNoLoad(t, f.ids)
	if err := conn.SetReadDeadline(time.Now().Add(30 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(io.Discard, conn); errors.Is(err, os.ErrDeadlineExceeded) {
		t.Error("the router keeps the connection of a client that stopped reading open")
	}
	waitFor(t, 10*time.Second, "the engine to drop the abandoned generation", func() bool { return engineRunning(t, f.engines["w0"]) == 0 })
	if got := testutil.ToFloat64(rt.metrics.requests.WithLabelValues(rt.policy.Name(), resultCanceled, "w0")); got != 1 {
		t.Errorf("requests_total{result=canceled} = %v, want 1", got)
	}
	if s, n := rt.breakerState("w0"), rt.breakerTrips("w0"); s != float64(BreakerClosed) || n != 0 {
		t.Errorf("breaker_state=%v trips=%v, want 0 and 0: the client stalled, not the engine", s, n)
	}
}

// The write deadline a relay leaves on its connection (to bound the end of its
// response) must not cut the answer of a later request on that keep-alive
// connection, however long after it comes.
func TestKeepAliveConnectionOutlivesTheRelaysWriteDeadline(t *testing.T) {
	f := startFleet(t, 1, nil)
	cfg := testConfig(t, f)
	cfg.RequestIdleTimeout = 100 * time.Millisecond
	rt := startRouter(t, cfg)
	client := &http.Client{Transport: &http.Transport{MaxConnsPerHost: 1}}
	defer client.CloseIdleConnections()
	for i, c := range []struct{ method, path, body string }{
		{http.MethodPost, "/v1/completions", streamBody("keep alive", 4)},
		{http.MethodPost, "/v1/completions", streamBody("keep alive", 4)},
		{http.MethodGet, "/v1/models", ""},
	} {
		if i > 0 {
			time.Sleep(3 * cfg.RequestIdleTimeout) // the earlier relay's deadline passes
		}
		reused := false
		ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{GotConn: func(ci httptrace.GotConnInfo) { reused = ci.Reused }})
		req, err := http.NewRequestWithContext(ctx, c.method, rt.url+c.path, strings.NewReader(c.body))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("request %d (%s %s): %v", i, c.method, c.path, err)
		}
		raw, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d (%s %s): %d %q %v", i, c.method, c.path, resp.StatusCode, raw, err)
		}
		if i > 0 && !reused {
			t.Fatalf("request %d went on a new connection: the test proves nothing", i)
		}
	}
}

// A client that sends its headers and then stops sending its body is answered
// 408 once --body-read-timeout passed, and its connection closes: it used to
// hold a goroutine, the connection and what it had sent for as long as it
// kept the connection open. Nothing reaches an engine.
func TestClientThatStopsSendingItsBodyIsAnswered408(t *testing.T) {
	f := startFleet(t, 1, nil)
	cfg := testConfig(t, f)
	cfg.BodyReadTimeout = 300 * time.Millisecond
	rt := startRouter(t, cfg)
	conn, err := net.Dial("tcp", rt.url[len("http://"):])
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /v1/completions HTTP/1.1\r\nHost: router\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"model\":")
	if err := conn.SetReadDeadline(time.Now().Add(30 * time.Second)); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer to a body that never came: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestTimeout || !strings.Contains(string(body), "--body-read-timeout") {
		t.Errorf("a body that never came = %d %s, want 408 naming --body-read-timeout", resp.StatusCode, body)
	}
	if _, err := conn.Read(make([]byte, 1)); errors.Is(err, os.ErrDeadlineExceeded) {
		t.Error("the router keeps the connection of a client whose body timed out open")
	}
	if got := testutil.ToFloat64(rt.metrics.requests.WithLabelValues(rt.policy.Name(), resultClientError, "")); got != 1 {
		t.Errorf("requests_total{result=client_error} = %v, want 1", got)
	}
	if n := enginePromptTokens(t, f.engines["w0"]); n != 0 {
		t.Errorf("the engine generated from %v prompt tokens", n)
	}
}
