package router

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvindex/kvindex/bench/fakeengine"
)

// startEPP runs a router with --epp-addr on a loopback port and returns it with
// an ext_proc client.
func startEPP(t *testing.T, cfg Config) (*testRouter, extprocv3.ExternalProcessorClient, *grpc.ClientConn) {
	t.Helper()
	return startEPPWith(t, cfg, nil)
}

// startEPPWith is startEPP with startRouterWith's adjust hook.
func startEPPWith(t *testing.T, cfg Config, adjust func(*Router)) (*testRouter, extprocv3.ExternalProcessorClient, *grpc.ClientConn) {
	t.Helper()
	cfg.EPP.Addr = "127.0.0.1:0"
	rt := startRouterWith(t, cfg, adjust)
	waitFor(t, 10*time.Second, "the EPP to listen", func() bool { return rt.EPPAddr() != "" })
	cc, err := grpc.NewClient(rt.EPPAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return rt, extprocv3.NewExternalProcessorClient(cc), cc
}

// envoy plays Envoy's side of one ext_proc stream.
type envoy struct {
	t      *testing.T
	stream extprocv3.ExternalProcessor_ProcessClient
	cancel context.CancelFunc
	mode   filterv3.ProcessingMode_BodySendMode
}

func newEnvoy(t *testing.T, c extprocv3.ExternalProcessorClient, mode filterv3.ProcessingMode_BodySendMode) *envoy {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	s, err := c.Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return &envoy{t: t, stream: s, cancel: cancel, mode: mode}
}

func (e *envoy) send(req *extprocv3.ProcessingRequest) {
	e.t.Helper()
	if err := e.stream.Send(req); err != nil {
		e.t.Fatal(err)
	}
}

func (e *envoy) recv() *extprocv3.ProcessingResponse {
	e.t.Helper()
	resp, err := e.tryRecv()
	if err != nil {
		e.t.Fatal(err)
	}
	return resp
}

// tryRecv is recv with its failure returned.
func (e *envoy) tryRecv() (*extprocv3.ProcessingResponse, error) {
	resp, err := e.stream.Recv()
	if err != nil {
		return nil, fmt.Errorf("ext_proc answer: %w", err)
	}
	return resp, nil
}

func headerMap(kv ...string) *corev3.HeaderMap {
	m := &corev3.HeaderMap{}
	for i := 0; i+1 < len(kv); i += 2 {
		m.Headers = append(m.Headers, &corev3.HeaderValue{Key: kv[i], RawValue: []byte(kv[i+1])})
	}
	return m
}

func subsetMetadata(endpoints ...string) *corev3.Metadata {
	vals := make([]any, len(endpoints))
	for i, e := range endpoints {
		vals[i] = e
	}
	s, err := structpb.NewStruct(map[string]any{EPPSubsetKey: vals})
	if err != nil {
		panic(err)
	}
	return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{EPPSubsetNamespace: s}}
}

// decision is what the EPP answered to a request.
type eppAnswer struct {
	header    map[string]string // header mutations
	metadata  string            // envoy.lb / x-gateway-destination-endpoint
	body      []byte            // the body passed on (streamed mode)
	immediate *extprocv3.ImmediateResponse
}

// request sends the request as Envoy does (headers, then the body in chunks,
// the last with end_of_stream) and reads the EPP's answer.
func (e *envoy) request(path, body string, md *corev3.Metadata) eppAnswer {
	e.t.Helper()
	a, err := e.tryRequest(path, body, md)
	if err != nil {
		e.t.Fatal(err)
	}
	return a
}

// tryRequest is request with its failure returned, for a goroutine other than
// the test's, which must not call FailNow.
func (e *envoy) tryRequest(path, body string, md *corev3.Metadata) (eppAnswer, error) {
	var a eppAnswer
	if err := e.stream.Send(&extprocv3.ProcessingRequest{
		ProtocolConfig:  &extprocv3.ProtocolConfiguration{RequestBodyMode: e.mode, ResponseBodyMode: e.mode},
		MetadataContext: md,
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers: headerMap(":method", "POST", ":path", path, ":authority", "gateway", "content-type", "application/json"),
		}},
	}); err != nil {
		return a, err
	}
	if e.mode == filterv3.ProcessingMode_BUFFERED {
		r, err := e.tryRecv()
		if err != nil {
			return a, err
		}
		if r.GetRequestHeaders() == nil {
			return a, fmt.Errorf("buffered mode: headers answered with %v, want a headers response", r)
		}
	}
	half := len(body) / 2
	for i, chunk := range []string{body[:half], body[half:]} {
		if err := e.stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{
			Body: []byte(chunk), EndOfStream: i == 1}}}); err != nil {
			return a, err
		}
	}
	first, err := e.tryRecv()
	if err != nil {
		return a, err
	}
	if im := first.GetImmediateResponse(); im != nil {
		a.immediate = im
		return a, nil
	}
	var common *extprocv3.CommonResponse
	switch e.mode {
	case filterv3.ProcessingMode_BUFFERED:
		common = first.GetRequestBody().GetResponse()
	default:
		common = first.GetRequestHeaders().GetResponse()
		second, err := e.tryRecv()
		if err != nil {
			return a, err
		}
		sr := second.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse()
		if sr == nil || !sr.EndOfStream {
			return a, fmt.Errorf("streamed mode: the body was not passed on with end_of_stream: %v", second)
		}
		a.body = sr.Body
	}
	if common == nil {
		return a, fmt.Errorf("no destination in %v", first)
	}
	a.header = map[string]string{}
	for _, h := range common.GetHeaderMutation().GetSetHeaders() {
		a.header[h.Header.Key] = string(h.Header.RawValue)
	}
	a.metadata = first.GetDynamicMetadata().GetFields()[EPPLBNamespace].GetStructValue().GetFields()[EPPDestinationHeader].GetStringValue()
	return a, nil
}

// respond plays the upstream answer through the stream: response headers with
// the served endpoint in the metadata, then the body in chunks, the last with
// end_of_stream.
func (e *envoy) respond(status int, served string, body []byte) {
	e.t.Helper()
	md := &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{EPPLBNamespace: {Fields: map[string]*structpb.Value{
		EPPServedKey: structpb.NewStringValue(served)}}}}
	e.send(&extprocv3.ProcessingRequest{MetadataContext: md, Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
		Headers: headerMap(":status", itoa(status), "content-type", "application/json")}}})
	if r := e.recv(); r.GetResponseHeaders() == nil {
		e.t.Fatalf("response headers answered with %v", r)
	}
	half := len(body) / 2
	var echoed []byte
	for i, chunk := range [][]byte{body[:half], body[half:]} {
		e.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{
			Body: chunk, EndOfStream: i == 1}}})
		r := e.recv()
		if r.GetResponseBody() == nil {
			e.t.Fatalf("response body answered with %v", r)
		}
		echoed = append(echoed, r.GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse().GetBody()...)
	}
	if e.mode == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED && !bytes.Equal(echoed, body) {
		e.t.Errorf("the response body was not passed on unchanged: %q", echoed)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

// upstream sends the request where the EPP said, as Envoy would.
func upstream(t *testing.T, endpoint, path, body string) (int, []byte) {
	t.Helper()
	resp, err := http.Post("http://"+endpoint+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

// endpoints maps the fleet's ip:port to worker ids.
func (f *fleet) endpoints() map[string]string {
	m := map[string]string{}
	for _, id := range f.ids {
		m[strings.TrimPrefix(f.engines[id].URL(), "http://")] = id
	}
	return m
}

// One request through Envoy's exact message sequence, in both body modes: the
// destination header equals the metadata, lists fallbacks after the choice, the
// body is passed on unchanged, the engine answers there, load is held until the
// response's end_of_stream and is zero after it.
func TestEPPPicksAnEndpointAndReleasesAtTheEndOfTheResponse(t *testing.T) {
	for _, mode := range []filterv3.ProcessingMode_BodySendMode{filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, filterv3.ProcessingMode_BUFFERED} {
		t.Run(mode.String(), func(t *testing.T) {
			f := startFleet(t, 3, nil)
			rt, client, _ := startEPP(t, testConfig(t, f))
			eps := f.endpoints()
			body := completionBody(words("epp", 60), 4)

			e := newEnvoy(t, client, mode)
			a := e.request("/v1/completions", body, nil)
			if a.immediate != nil {
				t.Fatalf("immediate response %v", a.immediate)
			}
			dest := a.header[EPPDestinationHeader]
			if dest == "" || dest != a.metadata {
				t.Fatalf("header %q and metadata %q must be the same non-empty value", dest, a.metadata)
			}
			list := strings.Split(dest, ",")
			if len(list) != 3 {
				t.Errorf("destination %q: want the choice and 2 fallbacks (--epp-fallbacks 2)", dest)
			}
			seen := map[string]bool{}
			for _, ep := range list {
				if eps[ep] == "" || seen[ep] {
					t.Errorf("destination %q: %q is not a distinct fleet endpoint", dest, ep)
				}
				seen[ep] = true
			}
			if a.header[EPPRankHeader] != "0" {
				t.Errorf("%s = %q, want 0", EPPRankHeader, a.header[EPPRankHeader])
			}
			if mode == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED && string(a.body) != body {
				t.Errorf("body passed on as %q, want it unchanged", a.body)
			}
			chosen := eps[list[0]]
			if l := rt.ledger.Load(Target{Worker: chosen}); l.InFlight != 1 {
				t.Fatalf("load on %s while the request runs = %+v, want one in flight", chosen, l)
			}
			code, answer := upstream(t, list[0], "/v1/completions", body)
			if code != http.StatusOK {
				t.Fatalf("engine answered %d %s", code, answer)
			}
			e.respond(code, list[0], answer)
			rt.assertNoLoad(t, f.ids)
			if got := rt.servedCount(chosen); got != 1 {
				t.Errorf("requests_total{result=ok,worker=%s} = %d, want 1", chosen, got)
			}
			// Same prompt again: the predicted overlay sends it where the first went,
			// as proxy mode would.
			e2 := newEnvoy(t, client, mode)
			a2 := e2.request("/v1/completions", body, nil)
			if got := strings.Split(a2.header[EPPDestinationHeader], ",")[0]; got != list[0] {
				t.Errorf("the same prompt went to %s, then to %s", list[0], got)
			}
		})
	}
}

// A stream that breaks after the decision (client gone, Envoy reset) releases the
// load and counts the request as canceled.
func TestEPPAbortedStreamReleasesLoad(t *testing.T) {
	for _, at := range []string{"after the decision", "after the response headers"} {
		t.Run(at, func(t *testing.T) {
			f := startFleet(t, 2, nil)
			rt, client, _ := startEPP(t, testConfig(t, f))
			e := newEnvoy(t, client, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED)
			a := e.request("/v1/completions", completionBody(words("abort", 40), 4), nil)
			ep := strings.Split(a.header[EPPDestinationHeader], ",")[0]
			worker := f.endpoints()[ep]
			if rt.ledger.Load(Target{Worker: worker}).InFlight != 1 {
				t.Fatal("no load held after the decision")
			}
			if at == "after the response headers" {
				e.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
					Headers: headerMap(":status", "200")}}})
				e.recv()
			}
			e.cancel()
			rt.assertNoLoad(t, f.ids)
			waitFor(t, 10*time.Second, "the canceled request to be counted", func() bool {
				return testutil.ToFloat64(rt.metrics.requests.WithLabelValues(rt.policy.Name(), resultCanceled, worker)) == 1
			})
		})
	}
}

// The subset hint limits the pick; a hint naming no eligible endpoint is a 503.
func TestEPPSubsetHint(t *testing.T) {
	f := startFleet(t, 3, nil)
	_, client, _ := startEPP(t, testConfig(t, f))
	w2 := strings.TrimPrefix(f.engines["w2"].URL(), "http://")
	w1 := strings.TrimPrefix(f.engines["w1"].URL(), "http://")
	cases := []struct {
		name   string
		subset []string
		want   []string // allowed destinations; nil: 503
	}{
		{"one endpoint", []string{w2}, []string{w2}},
		{"two endpoints", []string{w1, w2}, []string{w1, w2}},
		{"unknown endpoint", []string{"10.255.255.1:8000"}, nil},
		{"empty list", []string{}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for i := range 4 {
				e := newEnvoy(t, client, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED)
				a := e.request("/v1/completions", completionBody(words(c.name+itoa(i), 30), 2), subsetMetadata(c.subset...))
				if c.want == nil {
					if a.immediate == nil || a.immediate.Status.Code != 503 {
						t.Fatalf("want an immediate 503, got %+v", a)
					}
					return
				}
				if a.immediate != nil {
					t.Fatalf("immediate %v", a.immediate)
				}
				for _, ep := range strings.Split(a.header[EPPDestinationHeader], ",") {
					if !strings.Contains(strings.Join(c.want, " "), ep) {
						t.Errorf("destination %q outside the subset %v", ep, c.want)
					}
				}
				e.cancel()
			}
		})
	}
}

// Refusals are immediate responses: unknown model 404, a full fleet 429 with
// Retry-After, no workers 503.
func TestEPPImmediateResponses(t *testing.T) {
	f := startFleet(t, 1, nil)
	cfg := testConfig(t, f)
	cfg.MaxPending, cfg.QueueSize = 1, 0
	_, client, _ := startEPP(t, cfg)

	e := newEnvoy(t, client, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED)
	if a := e.request("/v1/completions", `{"model":"nope","prompt":"x"}`, nil); a.immediate == nil || a.immediate.Status.Code != 404 {
		t.Errorf("unknown model: %+v, want 404", a)
	}
	hold := newEnvoy(t, client, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED)
	if a := hold.request("/v1/completions", completionBody("first", 2), nil); a.immediate != nil {
		t.Fatalf("first request refused: %v", a.immediate)
	}
	shed := newEnvoy(t, client, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED)
	a := shed.request("/v1/completions", completionBody("second", 2), nil)
	if a.immediate == nil || a.immediate.Status.Code != 429 {
		t.Fatalf("a full fleet: %+v, want 429", a)
	}
	retry := false
	for _, h := range a.immediate.GetHeaders().GetSetHeaders() {
		retry = retry || strings.EqualFold(h.Header.Key, "retry-after")
	}
	if !retry {
		t.Error("429 without Retry-After")
	}

	empty := testConfig(t, f)
	empty.Workers = nil
	_, client2, _ := startEPP(t, empty)
	e3 := newEnvoy(t, client2, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED)
	if a := e3.request("/v1/completions", completionBody("x", 2), nil); a.immediate == nil || a.immediate.Status.Code != 503 {
		t.Errorf("no workers: %+v, want 503", a)
	}
}

// Envoy falls back to the second endpoint of the list: the load moves there.
func TestEPPServedFallbackMovesTheLoad(t *testing.T) {
	f := startFleet(t, 2, nil)
	rt, client, _ := startEPP(t, testConfig(t, f))
	eps := f.endpoints()
	e := newEnvoy(t, client, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED)
	body := completionBody(words("fallback", 40), 3)
	list := strings.Split(e.request("/v1/completions", body, nil).header[EPPDestinationHeader], ",")
	if len(list) < 2 {
		t.Fatalf("destination %v: want a fallback", list)
	}
	code, answer := upstream(t, list[1], "/v1/completions", body)
	e.send(&extprocv3.ProcessingRequest{
		MetadataContext: &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{EPPLBNamespace: {Fields: map[string]*structpb.Value{
			EPPServedKey: structpb.NewStringValue(list[1])}}}},
		Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{Headers: headerMap(":status", itoa(code))}}})
	e.recv()
	if l := rt.ledger.Load(Target{Worker: eps[list[1]]}); l.InFlight != 1 {
		t.Errorf("load on the serving fallback %s = %+v, want 1 in flight", eps[list[1]], l)
	}
	if l := rt.ledger.Load(Target{Worker: eps[list[0]]}); l.InFlight != 0 {
		t.Errorf("load on the first choice %s = %+v, want 0 once the fallback served", eps[list[0]], l)
	}
	e.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: answer, EndOfStream: true}}})
	e.recv()
	rt.assertNoLoad(t, f.ids)
	if got := rt.servedCount(eps[list[1]]); got != 1 {
		t.Errorf("ok count of the fallback = %d, want 1", got)
	}
}

// Disaggregated: the destination is the decode worker, x-prefiller-host-port the
// prefill worker.
func TestEPPPrefillDecode(t *testing.T) {
	f := pdFleet(t, nil)
	_, client, _ := startEPP(t, testConfig(t, f))
	eps := f.endpoints()
	a := newEnvoy(t, client, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED).request("/v1/completions", completionBody(words("pd", 100), 4), nil)
	if got := eps[strings.Split(a.header[EPPDestinationHeader], ",")[0]]; got != "w2" {
		t.Errorf("destination %q is %q, want the decode worker w2", a.header[EPPDestinationHeader], got)
	}
	if got := eps[a.header[EPPPrefillerHeader]]; got != "w0" && got != "w1" {
		t.Errorf("%s = %q, want a prefill worker", EPPPrefillerHeader, a.header[EPPPrefillerHeader])
	}
}

// The gRPC health services: liveness always, readiness with a routable worker.
func TestEPPHealth(t *testing.T) {
	f := startFleet(t, 1, func(int, *fakeengine.Config) {})
	for _, c := range []struct {
		name    string
		workers bool
		want    map[string]healthpb.HealthCheckResponse_ServingStatus
	}{
		{"with workers", true, map[string]healthpb.HealthCheckResponse_ServingStatus{HealthLiveness: healthpb.HealthCheckResponse_SERVING,
			HealthReadiness: healthpb.HealthCheckResponse_SERVING, "envoy.service.ext_proc.v3.ExternalProcessor": healthpb.HealthCheckResponse_SERVING}},
		{"without workers", false, map[string]healthpb.HealthCheckResponse_ServingStatus{HealthLiveness: healthpb.HealthCheckResponse_SERVING,
			HealthReadiness: healthpb.HealthCheckResponse_NOT_SERVING}},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := testConfig(t, f)
			if !c.workers {
				cfg.Workers = nil
			}
			_, _, cc := startEPP(t, cfg)
			h := healthpb.NewHealthClient(cc)
			for svc, want := range c.want {
				resp, err := h.Check(context.Background(), &healthpb.HealthCheckRequest{Service: svc})
				if err != nil || resp.Status != want {
					t.Errorf("health %q = %v, %v; want %v", svc, resp.GetStatus(), err, want)
				}
			}
		})
	}
}

// An EPP request to a half-open worker carries the probe its decision took and
// hands it back however the exchange ends (answered, answered by a fallback,
// failed, aborted): a probe never handed back leaves the worker excluded for
// good the next time it fails.
func TestEPPHandsBackTheHalfOpenProbe(t *testing.T) {
	cases := []struct {
		name  string
		fault int // status every engine fails with; 0: healthy
		// end plays the rest of the exchange after the decision listed dests.
		end func(e *envoy, dests []string, body string)
	}{
		{"answered by the choice", 0, func(e *envoy, dests []string, body string) {
			code, answer := upstream(e.t, dests[0], "/v1/completions", body)
			e.respond(code, dests[0], answer)
		}},
		{"answered by a fallback", 0, func(e *envoy, dests []string, body string) {
			code, answer := upstream(e.t, dests[1], "/v1/completions", body)
			e.respond(code, dests[1], answer)
		}},
		{"engine failed", http.StatusInternalServerError, func(e *envoy, dests []string, body string) {
			code, answer := upstream(e.t, dests[0], "/v1/completions", body)
			e.respond(code, dests[0], answer)
		}},
		{"aborted", 0, func(e *envoy, _ []string, _ string) { e.cancel() }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := startFleet(t, 2, func(_ int, ec *fakeengine.Config) {
				if c.fault != 0 {
					ec.Faults = fakeengine.Faults{FailRate: 1, FailStatus: c.fault}
				}
			})
			clk := newFakeClock()
			rt, client, _ := startEPPWith(t, testConfig(t, f), func(r *Router) { r.breakers.now = clk.Now })
			// Both half-open: the decision takes its choice's probe and lists the
			// other (whose probe is free) as the fallback.
			rt.halfOpen(t, clk, f.ids...)
			body := completionBody(words("probe "+c.name, 30), 2)
			e := newEnvoy(t, client, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED)
			dests := strings.Split(e.request("/v1/completions", body, nil).header[EPPDestinationHeader], ",")
			if len(dests) != 2 {
				t.Fatalf("destinations %v: want the choice and a fallback", dests)
			}
			c.end(e, dests, body)
			waitFor(t, 10*time.Second, "the request to be counted", func() bool { return rt.counted(f.ids) == 1 })
			for _, w := range f.ids {
				rt.admitsAProbeAgain(t, clk, w)
			}
			rt.assertNoLoad(t, f.ids)
		})
	}
}

// Disaggregated, the prefill worker's part is over when the decode's response
// headers arrive: its load is released then, not at the end of the decode, and
// its half-open probe is handed back (neutral: the EPP does not see the prefill
// leg's outcome, the sidecar runs it).
func TestEPPPrefillWorkerHandsBackItsProbeAndLoadAtTheDecodesHeaders(t *testing.T) {
	f := pdFleet(t, nil)
	clk := newFakeClock()
	rt, client, _ := startEPPWith(t, testConfig(t, f), func(r *Router) { r.breakers.now = clk.Now })
	rt.halfOpen(t, clk, "w0", "w1")
	eps := f.endpoints()
	body := completionBody(words("pd probe", 100), 4)
	e := newEnvoy(t, client, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED)
	a := e.request("/v1/completions", body, nil)
	decodeEP, prefillEP := strings.Split(a.header[EPPDestinationHeader], ",")[0], a.header[EPPPrefillerHeader]
	decode, prefill := Target{Worker: eps[decodeEP]}, Target{Worker: eps[prefillEP]}
	if decode.Worker != "w2" || (prefill.Worker != "w0" && prefill.Worker != "w1") {
		t.Fatalf("decode %q prefill %q: want w2 and a prefill worker", decodeEP, prefillEP)
	}
	if l := rt.ledger.Load(prefill); l.InFlight != 1 {
		t.Fatalf("prefill worker's load after the decision = %+v, want one in flight", l)
	}

	// The sidecar's flow: the prefill leg, then the decode leg with its
	// kv_transfer_params.
	pb, err := prefillRequest([]byte(body), endpointCompletions)
	if err != nil {
		t.Fatal(err)
	}
	code, raw := upstream(t, prefillEP, "/v1/completions", string(pb))
	var pre completion
	if err := json.Unmarshal(raw, &pre); code != http.StatusOK || err != nil {
		t.Fatalf("prefill leg: %d %s (%v)", code, raw, err)
	}
	db, err := withKVTransfer([]byte(body), pre.KVTransferParams)
	if err != nil {
		t.Fatal(err)
	}
	code, answer := upstream(t, decodeEP, "/v1/completions", string(db))
	e.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
		Headers: headerMap(":status", itoa(code), "content-type", "application/json")}}})
	e.recv()
	if l := rt.ledger.Load(prefill); l.InFlight != 0 {
		t.Errorf("prefill worker's load after the decode's response headers = %+v, want none", l)
	}
	if !rt.breakers.Allows(prefill.Worker) {
		t.Errorf("the half-open prefill worker %s admits no probe after the decode's response headers: its probe is held until the decode ends", prefill.Worker)
	}
	if l := rt.ledger.Load(decode); l.InFlight != 1 {
		t.Errorf("decode worker's load while its body streams = %+v, want one in flight", l)
	}
	e.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: answer, EndOfStream: true}}})
	e.recv()
	if got := rt.servedCount("w2"); got != 1 {
		t.Fatalf("ok count of w2 = %d, want 1", got)
	}
	for _, w := range []string{"w0", "w1"} {
		rt.admitsAProbeAgain(t, clk, w)
	}
	rt.assertNoLoad(t, f.ids)
}

// Requests with different subset hints draw from different candidates, so they
// queue apart: a request whose hinted endpoint is free is answered at once while
// a request hinted to a full endpoint waits, and that one is served in turn.
func TestEPPSubsetHintsQueueApart(t *testing.T) {
	f := startFleet(t, 2, nil)
	cfg := testConfig(t, f)
	cfg.MaxPending = 1
	cfg.QueueTimeout = 10 * time.Second
	rt, client, _ := startEPP(t, cfg)
	w0 := strings.TrimPrefix(f.engines["w0"].URL(), "http://")
	w1 := strings.TrimPrefix(f.engines["w1"].URL(), "http://")
	destination := func(a eppAnswer) string {
		if a.immediate != nil {
			return "immediate " + a.immediate.Status.Code.String()
		}
		return a.header[EPPDestinationHeader]
	}

	hold := newEnvoy(t, client, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED)
	if d := destination(hold.request("/v1/completions", completionBody("holds w0", 2), subsetMetadata(w0))); d != w0 {
		t.Fatalf("the first request hinted to w0 went to %q", d)
	}
	queued := newEnvoy(t, client, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED)
	answered := make(chan string, 1)
	go func() {
		a, err := queued.tryRequest("/v1/completions", completionBody("waits for w0", 2), subsetMetadata(w0))
		if err != nil {
			t.Error(err)
		}
		answered <- destination(a)
	}()
	waitFor(t, 10*time.Second, "the second request hinted to w0 to queue", func() bool { return rt.adm.depth() == 1 })

	free := newEnvoy(t, client, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED)
	if d := destination(free.request("/v1/completions", completionBody("w1 is free", 2), subsetMetadata(w1))); d != w1 {
		t.Fatalf("a request hinted to the free w1 got %q", d)
	}
	if n := rt.adm.depth(); n != 1 {
		t.Fatalf("%d waiting when the request hinted to w1 was answered, want the w0 waiter still queued: the w1 request waited behind it", n)
	}
	free.cancel()
	hold.cancel() // w0 frees: the waiter's turn
	if d := <-answered; d != w0 {
		t.Fatalf("the waiter hinted to w0 got %q once w0 freed", d)
	}
	queued.cancel()
	rt.assertNoLoad(t, f.ids)
}

// A half-open worker's probe is decided when the worker answers, by the status
// in the response headers, as proxy mode decides it at the first byte: 2xx and
// 4xx close the breaker while the generation still streams, 5xx reopens it (the
// cooldown doubled), 429 hands the probe back (still half-open). The answer
// counts once: the exchange's end, whether the body's end_of_stream or a
// hang-up, records nothing more, so it cannot free the probe a later exchange
// took meanwhile, nor count a 5xx twice.
func TestEPPHalfOpenProbeIsDecidedWhenTheWorkerAnswers(t *testing.T) {
	for _, c := range []struct {
		status   int
		want     BreakerState
		cooldown time.Duration
	}{
		{http.StatusOK, BreakerClosed, 5 * time.Second},
		{http.StatusBadRequest, BreakerClosed, 5 * time.Second},
		{http.StatusInternalServerError, BreakerOpen, 10 * time.Second},
		{http.StatusTooManyRequests, BreakerHalfOpen, 5 * time.Second},
	} {
		for _, end := range []string{"body ends", "hang-up"} {
			t.Run(fmt.Sprintf("%d %s", c.status, end), func(t *testing.T) {
				f := startFleet(t, 1, nil)
				clk := newFakeClock()
				cfg := testConfig(t, f)
				cfg.BreakerCooldown, cfg.BreakerMaxCooldown = 5*time.Second, time.Minute
				rt, client, _ := startEPPWith(t, cfg, func(r *Router) { r.breakers.now = clk.Now })
				ep := strings.TrimPrefix(f.engines["w0"].URL(), "http://")
				w0 := Target{Worker: "w0"}
				rt.halfOpen(t, clk, "w0")
				probe := func(e *envoy, what string) {
					t.Helper()
					a := e.request("/v1/completions", completionBody(words(what, 30), 2), nil)
					if got := a.header[EPPDestinationHeader]; got != ep {
						t.Fatalf("%s went to %q, want w0 (%s)", what, got, ep)
					}
					if rt.breakers.Allows("w0") {
						t.Fatalf("%s: the decision took no half-open probe", what)
					}
				}
				first := newEnvoy(t, client, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED)
				probe(first, "the first probe")

				first.send(&extprocv3.ProcessingRequest{
					MetadataContext: &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{EPPLBNamespace: {Fields: map[string]*structpb.Value{
						EPPServedKey: structpb.NewStringValue(ep)}}}},
					Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
						Headers: headerMap(":status", itoa(c.status), "content-type", "text/event-stream")}}})
				if r := first.recv(); r.GetResponseHeaders() == nil {
					t.Fatalf("response headers answered with %v", r)
				}
				if s, cd := rt.breakers.State("w0"); s != c.want || cd != c.cooldown {
					t.Fatalf("breaker after the %d response headers, while the body still streams: %s (cooldown %s), want %s (cooldown %s)", c.status, s, cd, c.want, c.cooldown)
				}
				if l := rt.ledger.Load(w0); l.InFlight != 1 {
					t.Errorf("load while the body streams = %+v, want the request still in flight", l)
				}

				// Bring w0 back to half-open and let a second exchange take its
				// probe while the first one still streams.
				switch c.want {
				case BreakerClosed:
					rt.halfOpen(t, clk, "w0")
				case BreakerOpen:
					clk.Advance(c.cooldown)
				}
				second := newEnvoy(t, client, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED)
				probe(second, "the second probe")
				trips := rt.breakerTrips("w0")

				switch end {
				case "body ends":
					first.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{
						Body: []byte("data: [DONE]\n\n"), EndOfStream: true}}})
					first.recv()
				case "hang-up":
					first.cancel()
				}
				waitFor(t, 10*time.Second, "the first request to be counted", func() bool { return rt.counted(f.ids) == 1 })
				if s, _ := rt.breakers.State("w0"); s != BreakerHalfOpen || rt.breakers.Allows("w0") || rt.breakerTrips("w0") != trips {
					t.Fatalf("after the first exchange ended: %s, probe free %v, trips %v (was %v); want half-open with the second exchange's probe held: the first answer was counted again",
						s, rt.breakers.Allows("w0"), rt.breakerTrips("w0"), trips)
				}
				second.cancel()
				waitFor(t, 10*time.Second, "the second request to be counted", func() bool { return rt.counted(f.ids) == 2 })
				rt.admitsAProbeAgain(t, clk, "w0")
				rt.assertNoLoad(t, f.ids)
			})
		}
	}
}
