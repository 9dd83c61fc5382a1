package router

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
)

// EPP mode: the router as a Gateway API Inference Extension endpoint picker, an
// Envoy ext_proc v3 server. One ext_proc stream is one HTTP request: the request
// headers and body come in, the router takes the same decision as in proxy mode
// (decide, with admission and reservations), and answers with the chosen endpoint
// in the x-gateway-destination-endpoint header and the identical value in the
// envoy.lb dynamic metadata; Envoy then sends the request there itself. The
// response's headers and body pass through the stream too, so the reservation is
// released when the response ends, or when the stream breaks; a half-open probe is
// decided by the response headers' status, when the worker answers. Under
// disaggregation the prefill worker's load and probe go back at the decode's
// response headers: the sidecar ran the prefill leg before the decode's.

// Protocol names (Gateway API Inference Extension, endpoint picker protocol).
const (
	EPPDestinationHeader = "x-gateway-destination-endpoint"
	EPPServedKey         = "x-gateway-destination-endpoint-served"
	EPPSubsetKey         = "x-gateway-destination-endpoint-subset"
	EPPLBNamespace       = "envoy.lb"
	EPPSubsetNamespace   = "envoy.lb.subset_hint"
	// EPPPrefillerHeader names the prefill endpoint for a decode-side sidecar
	// (llm-d's routing sidecar) under disaggregation.
	EPPPrefillerHeader = "x-prefiller-host-port"
	// EPPRankHeader pins the chosen data-parallel rank, as in proxy mode.
	EPPRankHeader = "x-data-parallel-rank"
)

// gRPC health services of the EPP.
const (
	HealthLiveness  = "liveness"
	HealthReadiness = "readiness"
)

// EPPConfig is the endpoint picker's part of the configuration.
type EPPConfig struct {
	// Addr is the ext_proc gRPC listen address; empty: no EPP.
	Addr string
	// Fallbacks is how many further endpoints, by increasing cost, follow the
	// chosen one in the destination list.
	Fallbacks int
	// GracePeriod bounds how long open streams may finish at shutdown.
	GracePeriod time.Duration
}

// DefaultEPPConfig is off, with two fallbacks.
func DefaultEPPConfig() EPPConfig {
	return EPPConfig{Fallbacks: 2, GracePeriod: 5 * time.Second}
}

// Validate names the bad value.
func (c *EPPConfig) Validate() error {
	if c.Addr != "" {
		if _, _, err := net.SplitHostPort(c.Addr); err != nil {
			return invalid("--epp-addr=%q: %v", c.Addr, err)
		}
	}
	if c.Fallbacks < 0 || c.Fallbacks > 16 {
		return invalid("--epp-fallbacks=%d must be between 0 and 16", c.Fallbacks)
	}
	if c.GracePeriod <= 0 {
		return invalid("--epp-grace-period=%s must be positive", c.GracePeriod)
	}
	return nil
}

func registerEPPFlags(fs *flag.FlagSet, c *EPPConfig) {
	fs.StringVar(&c.Addr, "epp-addr", c.Addr, "`host:port` of the Envoy ext_proc gRPC server speaking the Gateway API Inference Extension endpoint-picker protocol (also gRPC health: liveness, readiness); empty: no EPP")
	fs.IntVar(&c.Fallbacks, "epp-fallbacks", c.Fallbacks, "EPP: further endpoints, by increasing cost, after the chosen one in x-gateway-destination-endpoint (Envoy tries them in order when retries are configured)")
	fs.DurationVar(&c.GracePeriod, "epp-grace-period", c.GracePeriod, "EPP: at shutdown, how long open ext_proc streams may finish")
}

// serveEPP serves the ext_proc and health services on l until ctx ends, then
// stops gracefully within the grace period.
func (r *Router) serveEPP(ctx context.Context, l net.Listener) error {
	s := grpc.NewServer()
	extprocv3.RegisterExternalProcessorServer(s, &eppServer{r: r})
	healthpb.RegisterHealthServer(s, &eppHealth{r: r})
	errc := make(chan error, 1)
	go func() { errc <- s.Serve(l) }()
	r.log.Info("endpoint picker (ext_proc) listening", "addr", l.Addr().String())
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	done := make(chan struct{})
	go func() { s.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-time.After(r.cfg.EPP.GracePeriod):
		s.Stop()
		<-done
	}
	return nil
}

// eppHealth answers gRPC health checks: liveness while the process runs,
// readiness (and the ext_proc service) while the fleet has a routable worker.
type eppHealth struct {
	healthpb.UnimplementedHealthServer
	r *Router
}

func (h *eppHealth) Check(_ context.Context, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	ready := healthpb.HealthCheckResponse_NOT_SERVING
	if len(h.r.fleet.Workers()) > 0 {
		ready = healthpb.HealthCheckResponse_SERVING
	}
	switch req.Service {
	case HealthLiveness:
		return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
	case HealthReadiness, "", extprocv3.ExternalProcessor_ServiceDesc.ServiceName:
		return &healthpb.HealthCheckResponse{Status: ready}, nil
	}
	return nil, status.Errorf(codes.NotFound, "unknown health service %q (liveness, readiness, %s)", req.Service, extprocv3.ExternalProcessor_ServiceDesc.ServiceName)
}

// eppServer is the ext_proc service; every stream is handled by its own
// eppExchange.
type eppServer struct {
	extprocv3.UnimplementedExternalProcessorServer
	r *Router
}

// Process handles one HTTP request's ext_proc stream. Whatever way the stream
// ends, the exchange's reservation is released.
func (s *eppServer) Process(stream extprocv3.ExternalProcessor_ProcessServer) error {
	x := &eppExchange{r: s.r, ctx: stream.Context(), reqMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
		respMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED}
	defer x.finish(resultCanceled)
	for {
		req, err := stream.Recv()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			if s.r.log != nil && x.ctx.Err() == nil {
				s.r.log.Debug("ext_proc stream broke", "err", err)
			}
			return nil
		}
		resps, err := x.handle(req)
		if err != nil {
			return err
		}
		for _, resp := range resps {
			if err := stream.Send(resp); err != nil {
				return nil
			}
		}
	}
}

// eppExchange is the state of one ext_proc stream. It is used by the stream's
// goroutine only.
type eppExchange struct {
	r   *Router
	ctx context.Context

	reqMode, respMode filterv3.ProcessingMode_BodySendMode
	header            http.Header
	path              string
	body              []byte
	subset            []string // nil: no hint
	hinted            bool
	arrival           time.Time

	d        *Decision
	prep     *prepared
	endpoint map[string]Target // endpoint -> target among the decision's candidates
	served   string            // worker that served, from the response metadata
	probe    bool              // the exchange holds the served target's half-open probe
	// judged: the served target's breaker got this exchange's outcome when the
	// response headers came (it held the probe then); finish records none, so
	// that one answer counts once and never frees a probe another exchange took
	// meanwhile.
	judged bool
	status int
	once   sync.Once
}

// handle answers one message of the stream (zero, one or more responses).
func (x *eppExchange) handle(req *extprocv3.ProcessingRequest) ([]*extprocv3.ProcessingResponse, error) {
	if pc := req.GetProtocolConfig(); pc != nil {
		x.reqMode, x.respMode = pc.RequestBodyMode, pc.ResponseBodyMode
	}
	x.readMetadata(req)
	if req.ObservabilityMode {
		return nil, status.Error(codes.InvalidArgument, "the endpoint picker cannot run in observability mode: its answer is the routing decision")
	}
	switch m := req.Request.(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		x.arrival = x.r.now()
		x.header, x.path = headersOf(m.RequestHeaders.GetHeaders())
		if m.RequestHeaders.EndOfStream {
			return x.decide(true), nil
		}
		if x.reqMode == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
			return nil, nil // answered once the body is complete
		}
		return []*extprocv3.ProcessingResponse{{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{}}}}, nil

	case *extprocv3.ProcessingRequest_RequestBody:
		b := m.RequestBody
		if int64(len(x.body)+len(b.Body)) > x.r.cfg.MaxBodyBytes {
			return x.refuse(fmt.Errorf("%w: more than --max-body-bytes=%d", ErrTooLarge, x.r.cfg.MaxBodyBytes), resultClientError), nil
		}
		x.body = append(x.body, b.Body...)
		if b.EndOfStream {
			return x.decide(false), nil
		}
		switch x.reqMode {
		case filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, filterv3.ProcessingMode_BUFFERED:
			return nil, nil // chunks are held until the end of the body
		}
		return []*extprocv3.ProcessingResponse{{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{}}}}, nil

	case *extprocv3.ProcessingRequest_RequestTrailers:
		return []*extprocv3.ProcessingResponse{{Response: &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{}}}}, nil

	case *extprocv3.ProcessingRequest_ResponseHeaders:
		h, _ := headersOf(m.ResponseHeaders.GetHeaders())
		x.status, _ = strconv.Atoi(h.Get(":status"))
		x.moveToServed()
		if x.d != nil {
			x.d.res.FirstByte()
			if x.probe {
				// The worker answered: its status decides the half-open breaker
				// now, as proxy mode does at the first byte, not when a long
				// generation ends (which would keep a recovered worker out of
				// rotation all that time).
				x.r.breakers.Record(x.d.Target.Worker, statusOutcome(x.status), true)
				x.probe, x.judged = false, true
			}
			if x.d.prefillRes != nil {
				// The sidecar runs the prefill leg before the decode's: once the
				// decode answers, the prefill worker's part is over.
				x.d.prefillRes.Release()
			}
			if x.d.prefillProbe {
				// Neutral: the sidecar ran the prefill leg, its outcome is not
				// seen here. Handed back now, not at the end of the generation,
				// so the half-open prefill worker is probed again meanwhile.
				x.r.breakers.Record(x.d.Prefill.Worker, OutcomeNeutral, true)
				x.d.prefillProbe = false
			}
		}
		resp := &extprocv3.HeadersResponse{}
		if x.d != nil {
			resp.Response = &extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
				headerOption(HeaderServedBy, x.d.Target.Worker)}}}
		}
		if m.ResponseHeaders.EndOfStream {
			x.finish(resultOK)
		}
		return []*extprocv3.ProcessingResponse{{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: resp}}}, nil

	case *extprocv3.ProcessingRequest_ResponseBody:
		b := m.ResponseBody
		if b.EndOfStream {
			x.finish(resultOK)
		}
		if x.respMode == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
			return []*extprocv3.ProcessingResponse{{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{
				Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{
					StreamedResponse: &extprocv3.StreamedBodyResponse{Body: b.Body, EndOfStream: b.EndOfStream}}}}}}}}, nil
		}
		return []*extprocv3.ProcessingResponse{{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{}}}}, nil

	case *extprocv3.ProcessingRequest_ResponseTrailers:
		x.finish(resultOK)
		return []*extprocv3.ProcessingResponse{{Response: &extprocv3.ProcessingResponse_ResponseTrailers{ResponseTrailers: &extprocv3.TrailersResponse{}}}}, nil
	}
	return nil, nil
}

// readMetadata takes the subset hint and the served endpoint from the
// request's metadata context.
func (x *eppExchange) readMetadata(req *extprocv3.ProcessingRequest) {
	fm := req.GetMetadataContext().GetFilterMetadata()
	if hint, ok := fm[EPPSubsetNamespace]; ok {
		if v, ok := hint.GetFields()[EPPSubsetKey]; ok {
			x.hinted = true
			x.subset = x.subset[:0]
			switch v := v.Kind.(type) {
			case *structpb.Value_ListValue:
				for _, e := range v.ListValue.GetValues() {
					x.subset = append(x.subset, splitEndpoints(e.GetStringValue())...)
				}
			case *structpb.Value_StringValue:
				x.subset = splitEndpoints(v.StringValue)
			}
		}
	}
	if lb, ok := fm[EPPLBNamespace]; ok {
		if v, ok := lb.GetFields()[EPPServedKey]; ok && v.GetStringValue() != "" {
			x.served = strings.TrimSpace(strings.Split(v.GetStringValue(), ",")[0])
		}
	}
}

func splitEndpoints(s string) []string {
	var out []string
	for _, e := range strings.Split(s, ",") {
		if e = strings.TrimSpace(e); e != "" {
			out = append(out, e)
		}
	}
	return out
}

// headersOf converts Envoy's header map (raw_value or value) to an http.Header
// and the :path pseudo-header.
func headersOf(m *corev3.HeaderMap) (http.Header, string) {
	h := http.Header{}
	for _, hv := range m.GetHeaders() {
		v := hv.GetValue()
		if len(hv.GetRawValue()) > 0 {
			v = string(hv.GetRawValue())
		}
		h.Add(hv.GetKey(), v)
	}
	path := h.Get(":path")
	if i := strings.IndexAny(path, "?#"); i >= 0 {
		path = path[:i]
	}
	return h, path
}

func headerOption(k, v string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: k, RawValue: []byte(v)},
		AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD}
}

// endpointOf is a worker's host:port as Envoy addresses it.
func endpointOf(w *Worker) string {
	u, err := url.Parse(w.URL)
	if err != nil || u.Host == "" {
		return ""
	}
	if u.Port() != "" {
		return u.Host
	}
	port := "80"
	if u.Scheme == "https" {
		port = "443"
	}
	return net.JoinHostPort(u.Hostname(), port)
}

// decide routes the buffered request and answers with the destination, or an
// immediate response (400/404/413 bad request, 429 shed, 503 no endpoint).
// headersOnly: the request has no body (answered to the headers message).
func (x *eppExchange) decide(headersOnly bool) []*extprocv3.ProcessingResponse {
	ep := endpointOther
	switch x.path {
	case "/v1/chat/completions":
		ep = endpointChat
	case "/v1/completions":
		ep = endpointCompletions
	}
	body := x.body
	if len(body) == 0 {
		body = []byte("{}")
	}
	p, err := x.r.prepare(x.header, x.path, ep, body)
	if err != nil {
		if errors.Is(err, ErrUnknownModel) && len(x.r.fleet.Workers()) == 0 {
			return x.refuse(fmt.Errorf("%w: the fleet has no ready endpoint", ErrNoWorkers), resultNoWorker)
		}
		return x.refuse(err, resultClientError)
	}
	x.prep = p
	if x.hinted {
		allowed := map[string]bool{}
		for _, e := range x.subset {
			allowed[e] = true
		}
		p.route.allow = func(w *Worker) bool { return allowed[endpointOf(w)] }
		p.subset = "hint:" + strings.Join(slices.Sorted(maps.Keys(allowed)), ",")
	}
	d, err := x.r.admit(x.ctx, p, nil)
	if err != nil {
		switch {
		case errors.Is(err, ErrUnknownModel) && len(x.r.fleet.Workers()) == 0:
			err = fmt.Errorf("%w: the fleet has no ready endpoint", ErrNoWorkers)
		case x.hinted && errors.Is(err, ErrUnknownModel) && x.r.servesModel(p.route.Model):
			err = fmt.Errorf("%w: no endpoint of the subset hint %v serves the model `%s`", ErrNoWorkers, x.subset, p.route.Model)
		}
		result := resultClientError
		switch {
		case x.ctx.Err() != nil:
			result = resultCanceled
		case errors.Is(err, ErrQueueFull):
			x.r.metrics.rejected.WithLabelValues("queue_full").Inc()
			result = resultRejected
		case errors.Is(err, ErrQueueTimeout):
			x.r.metrics.rejected.WithLabelValues("queue_timeout").Inc()
			result = resultRejected
		case errors.Is(err, ErrNoWorkers):
			result = resultNoWorker
		}
		return x.refuse(err, result)
	}
	x.d = d
	x.r.record(d, p, true)
	x.r.metrics.overhead.Observe(x.r.now().Sub(x.arrival).Seconds())
	// decide took the target's half-open probe with the pick (beginProbes):
	// this exchange owns it now and hands it back when it ends.
	x.probe = d.probe

	dests, set := x.destinations(d)
	value := strings.Join(dests, ",")
	set = append(set, headerOption(EPPDestinationHeader, value))
	md := &structpb.Struct{Fields: map[string]*structpb.Value{
		EPPLBNamespace: structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
			EPPDestinationHeader: structpb.NewStringValue(value)}}),
	}}
	mutation := &extprocv3.HeaderMutation{SetHeaders: set}
	if headersOnly || x.reqMode != filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
		common := &extprocv3.CommonResponse{HeaderMutation: mutation, ClearRouteCache: true}
		if headersOnly {
			return []*extprocv3.ProcessingResponse{{DynamicMetadata: md,
				Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{Response: common}}}}
		}
		// Buffered body: the headers were answered already; the mutation rides on
		// the body's answer (Envoy applies it while the body mode is BUFFERED).
		return []*extprocv3.ProcessingResponse{{DynamicMetadata: md,
			Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{Response: common}}}}
	}
	// Full-duplex streamed: the headers' answer carries the destination, then the
	// held body goes on, unchanged, in one chunk.
	return []*extprocv3.ProcessingResponse{
		{DynamicMetadata: md, Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{
			Response: &extprocv3.CommonResponse{HeaderMutation: mutation, ClearRouteCache: true}}}},
		{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{
			Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{
				StreamedResponse: &extprocv3.StreamedBodyResponse{Body: x.body, EndOfStream: true}}}}}}},
	}
}

// destinations lists the decision's endpoint first, then up to --epp-fallbacks
// other candidates' endpoints by increasing cost; and the headers that go with
// it (the data-parallel rank, the prefill endpoint under disaggregation).
func (x *eppExchange) destinations(d *Decision) ([]string, []*corev3.HeaderValueOption) {
	x.endpoint = map[string]Target{}
	chosen := d.candidate(d.Target)
	w := chosen.Worker
	if w == nil {
		w = x.r.fleet.View().byID[d.Target.Worker]
	}
	first := endpointOf(w)
	dests := []string{first}
	x.endpoint[first] = d.Target
	others := slices.Clone(d.Candidates)
	slices.SortStableFunc(others, func(a, b Candidate) int {
		return cmp.Or(cmp.Compare(a.Cost, b.Cost), cmp.Compare(a.inFlight(), b.inFlight()))
	})
	for _, c := range others {
		if len(dests) > x.r.cfg.EPP.Fallbacks {
			break
		}
		e := endpointOf(c.Worker)
		if _, dup := x.endpoint[e]; dup || e == "" {
			continue
		}
		x.endpoint[e] = c.Target()
		dests = append(dests, e)
	}
	set := []*corev3.HeaderValueOption{headerOption(EPPRankHeader, strconv.Itoa(int(d.Target.Rank)))}
	if d.Prefill != nil {
		if pw := x.r.fleet.View().byID[d.Prefill.Worker]; pw != nil {
			set = append(set, headerOption(EPPPrefillerHeader, endpointOf(pw)))
		}
	}
	return dests, set
}

// moveToServed moves the reservation to the endpoint that served, when Envoy
// fell back to another one of the list.
func (x *eppExchange) moveToServed() {
	if x.d == nil || x.served == "" {
		return
	}
	t, ok := x.endpoint[x.served]
	if !ok || t == x.d.Target {
		return
	}
	c := x.d.candidate(t)
	route := &x.prep.route
	x.d.res.Release()
	x.r.breakers.Record(x.d.Target.Worker, OutcomeNeutral, x.probe)
	x.d.Target = t
	x.d.res = x.r.ledger.Reserve(t, demand(route, c.Overlap.Blocks(), x.d.Prefill == nil, route.OutputTokens))
	x.probe = x.r.breakers.Begin(t.Worker)
}

// refuse answers with an immediate response and counts the request.
func (x *eppExchange) refuse(err error, result string) []*extprocv3.ProcessingResponse {
	st, kind := statusOf(err)
	x.r.metrics.requests.WithLabelValues(x.r.policy.Name(), result, "").Inc()
	x.once.Do(func() {}) // counted: nothing more to finish
	hm := &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{headerOption("content-type", "application/json")}}
	if st == http.StatusTooManyRequests {
		hm.SetHeaders = append(hm.SetHeaders, headerOption("retry-after", "1"))
	}
	return []*extprocv3.ProcessingResponse{{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{
		Status:  &typev3.HttpStatus{Code: typev3.StatusCode(st)},
		Headers: hm,
		Body:    errorJSON(st, kind, err.Error()),
		Details: "kvindex_epp_" + result,
	}}}}
}

// finish releases the decision's load and counts the request once: result as
// given, or, when the response status says so, client_error (4xx) or
// upstream_error (5xx).
func (x *eppExchange) finish(result string) {
	x.once.Do(func() {
		if x.d == nil {
			if result == resultCanceled && x.header != nil {
				x.r.metrics.requests.WithLabelValues(x.r.policy.Name(), resultCanceled, "").Inc()
			}
			return
		}
		x.d.release()
		outcome := statusOutcome(x.status)
		switch {
		case result == resultCanceled:
			outcome = OutcomeNeutral
		case x.status == http.StatusTooManyRequests:
			result = resultClientError
		case x.status >= 500:
			result = resultUpstreamError
		case x.status >= 400:
			result = resultClientError
		}
		if !x.judged {
			x.r.breakers.Record(x.d.Target.Worker, outcome, x.probe)
		}
		if x.d.prefillProbe {
			// The stream ended before the decode's response headers; the
			// sidecar runs the prefill leg, its outcome is not seen here.
			x.r.breakers.Record(x.d.Prefill.Worker, OutcomeNeutral, true)
		}
		x.r.metrics.requests.WithLabelValues(x.d.Policy, result, x.d.Target.Worker).Inc()
	})
}

// statusOutcome is what an answer's status tells the breaker, as in proxy mode:
// 5xx is the worker's fault, 429 says it is full right now (nothing about its
// health), anything else is an answer (a 4xx was the request's fault).
func statusOutcome(status int) Outcome {
	switch {
	case status == http.StatusTooManyRequests:
		return OutcomeNeutral
	case status >= 500:
		return OutcomeFailure
	}
	return OutcomeSuccess
}

// servesModel reports whether any worker of the whole fleet serves model.
func (r *Router) servesModel(model string) bool {
	for _, w := range r.fleet.Workers() {
		if _, ok := w.Serves(model); ok {
			return true
		}
	}
	return false
}
