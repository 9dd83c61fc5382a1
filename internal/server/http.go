package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	kvindexv1 "github.com/kvindex/kvindex/api/proto/kvindex/v1"
	"github.com/kvindex/kvindex/internal/ingest"
	"github.com/kvindex/kvindex/internal/retry"
	"github.com/kvindex/kvindex/internal/workerspec"
)

const readHeaderTimeout = 10 * time.Second

var (
	protoJSON   = protojson.MarshalOptions{UseProtoNames: true}
	protoUnJSON = protojson.UnmarshalOptions{}
)

// Handler serves the REST API (see docs/api.md):
//
//	GET  /metrics /healthz /readyz
//	GET  /workers [?model=&format=dynamo]   GET /cluster   GET /dump [?worker=&model=]
//	POST /kv-cache/hit-rate                 hermes-router's cache-indexer contract
//	POST /query  /query_by_hash             Dynamo's and Mooncake's indexer shapes
//	POST /register  /unregister             ours, Dynamo's and Mooncake's forms (admin token)
//	POST /v1/score  /v1/query_by_hash       kvindex.v1 messages as JSON
//	GET  /v1/stats
//
// Bodies are limited to MaxBodyBytes (413); errors are {"error":{"code","message"}}.
func (a *API) Handler() http.Handler { return a.serve(a.routes()) }

// serve is a handler of exactly routes: each behind its access check and
// counted in the metrics; any other path is a 404, a known path with another
// method a 405.
func (a *API) serve(routes []route) http.Handler {
	mux := http.NewServeMux()
	for _, rt := range routes {
		method := strings.TrimPrefix(rt.pattern[strings.IndexByte(rt.pattern, ' ')+1:], "/")
		mux.HandleFunc(rt.pattern, func(w http.ResponseWriter, r *http.Request) {
			start := time.Now()
			rec := &statusRecorder{ResponseWriter: w, code: http.StatusOK}
			err := a.authorize(rt.access, r.Header.Get("Authorization"))
			if err == nil {
				err = rt.handler(rec, r)
			}
			if err != nil {
				writeError(rec, err)
			}
			a.metrics.observe("http", method, strconv.Itoa(rec.code), start)
		})
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		for _, m := range []string{http.MethodGet, http.MethodPost} {
			probe := r.Clone(r.Context())
			probe.Method = m
			if _, pattern := mux.Handler(probe); pattern != "/" && m != r.Method {
				w.Header().Set("Allow", m)
				writeJSON(w, http.StatusMethodNotAllowed, errorBody{Error: errorDetail{Code: "method_not_allowed",
					Message: fmt.Sprintf("%s %s: use %s", r.Method, r.URL.Path, m)}})
				return
			}
		}
		writeJSON(w, http.StatusNotFound, errorBody{Error: errorDetail{Code: "not_found",
			Message: fmt.Sprintf("no endpoint %s %s (see docs/api.md)", r.Method, r.URL.Path)}})
	})
	limit := a.maxBodyBytes
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Body = http.MaxBytesReader(w, r.Body, limit)
		mux.ServeHTTP(w, r)
	})
}

// route is one REST endpoint: its ServeMux pattern, the credential it needs
// (accessAdmin unless stated) and its handler.
type route struct {
	pattern string
	access  access
	handler func(http.ResponseWriter, *http.Request) error
}

// routes are every REST endpoint Handler serves; nothing is served outside
// this table, so the access test sees every route.
func (a *API) routes() []route {
	rs := []route{
		{"GET /healthz", accessPublic, func(w http.ResponseWriter, _ *http.Request) error {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.Write([]byte("ok\n"))
			return nil
		}},
		{"GET /readyz", accessPublic, a.handleReadyz},
		{"GET /workers", accessPublic, a.handleWorkers},
		{"GET /cluster", accessPublic, a.handleCluster},
		{"GET /dump", accessPublic, a.handleDump},
		{"GET /v1/stats", accessPublic, func(w http.ResponseWriter, _ *http.Request) error { return writeProto(w, a.stats()) }},
		{"POST /v1/score", accessPublic, a.handleScore},
		{"POST /v1/query_by_hash", accessPublic, a.handleTypedQueryByHash},
		{"POST /kv-cache/hit-rate", accessPublic, a.handleHitRate},
		{"POST /query", accessPublic, a.handleQuery},
		{"POST /query_by_hash", accessPublic, a.handleQueryByHash},
		{"POST /register", accessAdmin, a.handleRegister},
		{"POST /unregister", accessAdmin, a.handleUnregister},
	}
	rs = append(rs, a.uiRoutes()...)
	if a.gatherer != nil {
		metrics := promhttp.HandlerFor(a.gatherer, promhttp.HandlerOpts{ErrorLog: slog2log{a}})
		rs = append(rs, route{"GET /metrics", accessPublic, func(w http.ResponseWriter, r *http.Request) error {
			metrics.ServeHTTP(w, r)
			return nil
		}})
	}
	return rs
}

func (a *API) handleReadyz(w http.ResponseWriter, _ *http.Request) error {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if err := a.backend.Ready(); err != nil {
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintf(w, "not ready: %s\n", strings.TrimPrefix(err.Error(), ErrUnavailable.Error()+": "))
		return nil
	}
	w.Write([]byte("ready\n"))
	return nil
}

// statusRecorder remembers the status code written, for metrics.
type statusRecorder struct {
	http.ResponseWriter
	code int
}

func (r *statusRecorder) WriteHeader(code int) {
	r.code = code
	r.ResponseWriter.WriteHeader(code)
}

// Unwrap lets http.ResponseController reach the connection (write deadlines).
func (r *statusRecorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

func (r *statusRecorder) Flush() {
	if f, ok := r.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// slog2log lets promhttp log through the API's logger.
type slog2log struct{ a *API }

func (l slog2log) Println(v ...any) { l.a.log.Warn("metrics endpoint", "err", fmt.Sprint(v...)) }

// readBody reads a request body whole and checks it is UTF-8.
func readBody(r *http.Request) ([]byte, error) {
	body, err := io.ReadAll(r.Body)
	var tooLarge *http.MaxBytesError
	var netErr net.Error
	switch {
	case errors.As(err, &tooLarge):
		return nil, fmt.Errorf("%w: the request body is over %d bytes (--max-body-bytes)", ErrTooLarge, tooLarge.Limit)
	case errors.As(err, &netErr) && netErr.Timeout():
		return nil, fmt.Errorf("%w: the request body did not arrive within --http-read-timeout", ErrRequestTimeout)
	case err != nil:
		return nil, fmt.Errorf("%w: reading the request body: %v", ErrInvalidArgument, err)
	case len(bytes.TrimSpace(body)) == 0:
		return nil, invalidArg("the request body is empty; send a JSON object")
	case !utf8.Valid(body):
		return nil, invalidArg("the request body is not valid UTF-8")
	}
	return body, nil
}

// decodeJSON reads a JSON request body into v, naming the offending field in
// errors. Unknown fields are allowed: compatible clients send extra ones.
func decodeJSON(r *http.Request, v any) error {
	body, err := readBody(r)
	if err != nil {
		return err
	}
	return unmarshalJSON(body, v)
}

func unmarshalJSON(body []byte, v any) error {
	err := json.Unmarshal(body, v)
	var typeErr *json.UnmarshalTypeError
	var syntaxErr *json.SyntaxError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &typeErr):
		if typeErr.Field == "" {
			return invalidArg("the body must be a JSON object, not a JSON %s", typeErr.Value)
		}
		return invalidArg("field %q: want %s, got JSON %s", typeErr.Field, jsonTypeName(typeErr.Type.String()), typeErr.Value)
	case errors.As(err, &syntaxErr):
		return invalidArg("malformed JSON at byte %d: %v", syntaxErr.Offset, err)
	}
	return invalidArg("%v", err)
}

// jsonTypeName says a Go type as a JSON reader would.
func jsonTypeName(goType string) string {
	switch {
	case strings.HasPrefix(goType, "[]"):
		return "an array of " + jsonTypeName(goType[2:])
	case strings.Contains(goType, "int"):
		return "an integer (" + goType + ")"
	case goType == "string":
		return "a string"
	case goType == "bool":
		return "true or false"
	case strings.HasPrefix(goType, "map["), strings.HasPrefix(goType, "struct"), strings.Contains(goType, "."):
		return "an object"
	}
	return goType
}

// decodeProto reads a JSON request body into a kvindex.v1 message.
func decodeProto(r *http.Request, m proto.Message) error {
	body, err := readBody(r)
	if err != nil {
		return err
	}
	if err := protoUnJSON.Unmarshal(body, m); err != nil {
		d := m.ProtoReflect().Descriptor()
		return invalidArg("%s: %s", d.Name(), protoFieldNames(d).Replace(err.Error()))
	}
	return nil
}

// protoFieldNames rewrites the lowerCamel JSON names protojson's errors use
// ("field tokenIds") to the snake_case names the API documents.
func protoFieldNames(d protoreflect.MessageDescriptor) *strings.Replacer {
	var pairs []string
	seen := map[protoreflect.FullName]bool{}
	var walk func(protoreflect.MessageDescriptor)
	walk = func(d protoreflect.MessageDescriptor) {
		if seen[d.FullName()] {
			return
		}
		seen[d.FullName()] = true
		for i := range d.Fields().Len() {
			f := d.Fields().Get(i)
			if f.JSONName() != string(f.Name()) {
				pairs = append(pairs, "field "+f.JSONName(), "field "+string(f.Name()))
			}
			if f.Message() != nil {
				walk(f.Message())
			}
		}
	}
	walk(d)
	return strings.NewReplacer(pairs...)
}

func writeProto(w http.ResponseWriter, m proto.Message) error {
	data, err := protoJSON.Marshal(m)
	if err != nil {
		return err
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(append(data, '\n'))
	return nil
}

func (a *API) handleScore(w http.ResponseWriter, r *http.Request) error {
	req := &kvindexv1.ScoreRequest{}
	if err := decodeProto(r, req); err != nil {
		return err
	}
	resp, err := indexService{a: a}.Score(r.Context(), req)
	if err != nil {
		return err
	}
	return writeProto(w, resp)
}

func (a *API) handleTypedQueryByHash(w http.ResponseWriter, r *http.Request) error {
	req := &kvindexv1.QueryByHashRequest{}
	if err := decodeProto(r, req); err != nil {
		return err
	}
	resp, err := indexService{a: a}.QueryByHash(r.Context(), req)
	if err != nil {
		return err
	}
	return writeProto(w, resp)
}

func (a *API) handleWorkers(w http.ResponseWriter, r *http.Request) error {
	resp, err := a.workers(r.Context(), r.URL.Query().Get("model"), false)
	if err != nil {
		return err
	}
	switch format := r.URL.Query().Get("format"); format {
	case "":
		return writeProto(w, resp)
	case "dynamo":
		writeJSON(w, http.StatusOK, dynamoWorkers(resp))
		return nil
	default:
		return invalidArg("format=%q: want dynamo or nothing", format)
	}
}

// clusterJSON is GET /cluster, the shape docs/design.md fixes for other tools: plain
// numbers (not protojson's quoted uint64s) and lower-case suffrage names.
type clusterJSON struct {
	NodeID       string `json:"node_id"`
	Leader       string `json:"leader"`
	Term         uint64 `json:"term"`
	CommitIndex  uint64 `json:"commit_index"`
	AppliedIndex uint64 `json:"applied_index"`
	// IndexDigest is the answering node's index digest (hex SHA-256) at
	// DigestAppliedIndex.
	IndexDigest        string              `json:"index_digest"`
	DigestAppliedIndex uint64              `json:"digest_applied_index"`
	Members            []clusterMemberJSON `json:"members"`
}

type clusterMemberJSON struct {
	ID           string `json:"id"`
	RaftAddr     string `json:"raft_addr"`
	GRPCAddr     string `json:"grpc_addr"`
	Suffrage     string `json:"suffrage"`
	AppliedIndex uint64 `json:"applied_index"`
	IsLeader     bool   `json:"is_leader"`
	// IndexDigest and DigestAppliedIndex as the member reports them ("", 0
	// when it did not answer): equal applied indexes, equal digests.
	IndexDigest        string `json:"index_digest"`
	DigestAppliedIndex uint64 `json:"digest_applied_index"`
}

func (a *API) handleCluster(w http.ResponseWriter, r *http.Request) error {
	resp, err := a.cluster(r.Context(), true)
	if err != nil {
		return err
	}
	out := clusterJSON{NodeID: resp.GetNodeId(), Leader: resp.GetLeader(), Term: resp.GetTerm(),
		CommitIndex: resp.GetCommitIndex(), AppliedIndex: resp.GetAppliedIndex(),
		IndexDigest: resp.GetIndexDigest(), DigestAppliedIndex: resp.GetDigestAppliedIndex(), Members: []clusterMemberJSON{}}
	for _, m := range resp.GetMembers() {
		out.Members = append(out.Members, clusterMemberJSON{ID: m.GetId(), RaftAddr: m.GetRaftAddr(), GRPCAddr: m.GetGrpcAddr(),
			Suffrage: suffrageJSON(m.GetSuffrage()), AppliedIndex: m.GetAppliedIndex(), IsLeader: m.GetIsLeader(),
			IndexDigest: m.GetIndexDigest(), DigestAppliedIndex: m.GetDigestAppliedIndex()})
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func suffrageJSON(s kvindexv1.Suffrage) string {
	switch s {
	case kvindexv1.Suffrage_SUFFRAGE_NONVOTER:
		return "nonvoter"
	default:
		return "voter"
	}
}

// handleDump streams {"applied_index": "N", "changes": [IndexChange...]}. An
// error after the first bytes went out truncates the JSON, which the client
// sees as malformed.
func (a *API) handleDump(w http.ResponseWriter, r *http.Request) error {
	req := &kvindexv1.DumpRequest{Workers: r.URL.Query()["worker"], Model: r.URL.Query().Get("model")}
	wrote, changes := false, 0
	rc := http.NewResponseController(w)
	err := a.dump(r.Context(), req, func(m *kvindexv1.DumpResponse) error {
		var buf bytes.Buffer
		if !wrote {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(&buf, "{\"applied_index\":\"%d\",\"changes\":[", m.AppliedIndex)
			wrote = true
		}
		for _, c := range m.Changes {
			if changes > 0 {
				buf.WriteByte(',')
			}
			changes++
			data, err := protoJSON.Marshal(c)
			if err != nil {
				return err
			}
			buf.Write(data)
		}
		// A dump may take longer than --http-write-timeout as a whole; each
		// part's write gets the timeout of its own (from when it starts, not
		// when its changes began to be encoded), so only a stalled reader is
		// cut off.
		if a.writeTimeout > 0 {
			rc.SetWriteDeadline(time.Now().Add(a.writeTimeout))
		}
		_, err := w.Write(buf.Bytes())
		return err
	})
	if err != nil && !wrote {
		return err
	}
	if err != nil {
		a.log.Warn("dump interrupted", "err", err)
		return nil
	}
	w.Write([]byte("]}\n"))
	return nil
}

// registerJSON is POST /register's body: ours ({"worker": WorkerSpec}) or the
// flat form of Dynamo's and Mooncake's indexers.
type registerJSON struct {
	Worker json.RawMessage `json:"worker"`

	InstanceID     json.RawMessage `json:"instance_id"`
	Endpoint       string          `json:"endpoint"`
	ReplayEndpoint string          `json:"replay_endpoint"`
	Model          string          `json:"model"`
	ModelName      string          `json:"model_name"`
	ModelNameMC    string          `json:"modelname"`
	BlockSize      *int64          `json:"block_size"`
	DPRank         *int64          `json:"dp_rank"`
}

func (a *API) handleRegister(w http.ResponseWriter, r *http.Request) error {
	body, err := readBody(r)
	if err != nil {
		return err
	}
	var req registerJSON
	if err := unmarshalJSON(body, &req); err != nil {
		return err
	}
	if req.Worker != nil {
		typed := &kvindexv1.RegisterWorkerRequest{}
		if err := protoUnJSON.Unmarshal(body, typed); err != nil {
			return invalidArg("RegisterWorkerRequest: %v", err)
		}
		resp, err := adminService{a: a}.RegisterWorker(r.Context(), typed)
		if err != nil {
			return err
		}
		return writeProto(w, resp)
	}
	id, err := a.registerCompat(r.Context(), &req)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, map[string]string{"status": "ok", "instance_id": id})
	return nil
}

// maxRegisterConflicts bounds how often registerCompat retries a dp-rank
// registration that lost its compare-and-set to a concurrent one.
const maxRegisterConflicts = 16

// registerCompat registers the compatible form. A dp rank above 0 extends the
// registered worker with one compare-and-set of its spec (ReplaceWorker): the
// worker keeps its blocks, and ranks registered at once by several callers all
// end up in the spec, the losers of a race reading the registry again.
func (a *API) registerCompat(ctx context.Context, req *registerJSON) (string, error) {
	for attempt := 0; ; attempt++ {
		spec, expected, replaces, err := req.spec(ctx, a)
		switch {
		case err != nil:
			return "", err
		case !replaces && req.rank() > 0:
			return spec.ID, nil // the registered spec covers the rank already
		case !replaces:
			_, err = a.registerWorker(ctx, spec)
			return spec.ID, err
		}
		_, err = a.replaceWorker(ctx, expected, spec)
		if !errors.Is(err, ErrConflict) || attempt+1 >= maxRegisterConflicts {
			return spec.ID, err
		}
		if werr := retry.Default.Wait(ctx, attempt); werr != nil {
			return spec.ID, err
		}
	}
}

// spec turns the compatible form into a WorkerSpec. A dp rank above 0 extends
// the registered worker whose rank-0 endpoint, offset by the rank, is the
// endpoint given (kvindex derives rank r's endpoints as port + r); replaces
// then says the worker's spec changes from expected, as registered now.
func (req *registerJSON) spec(ctx context.Context, a *API) (spec, expected workerspec.Spec, replaces bool, err error) {
	id, err := instanceID(req.InstanceID)
	if err != nil {
		return spec, expected, false, err
	}
	model, err := oneModel(req.Model, req.ModelName, req.ModelNameMC)
	if err != nil {
		return spec, expected, false, err
	}
	spec = workerspec.Spec{ID: id, Model: model, Endpoint: req.Endpoint, Replay: req.ReplayEndpoint}
	if req.BlockSize != nil {
		if *req.BlockSize < 1 || *req.BlockSize > maxBlockSize {
			return spec, expected, false, invalidArg("block_size=%d must be between 1 and %d", *req.BlockSize, maxBlockSize)
		}
		spec.BlockSize = int(*req.BlockSize)
	}
	rank := int64(0)
	if req.DPRank != nil {
		rank = *req.DPRank
	}
	if rank < 0 || rank >= 1024 {
		return spec, expected, false, invalidArg("dp_rank=%d must be between 0 and 1023", rank)
	}
	if rank == 0 {
		return spec, expected, false, nil
	}
	list, err := a.backend.Workers(ctx)
	if err != nil {
		return spec, expected, false, err
	}
	for _, ws := range list {
		if ws.Spec.ID != id {
			continue
		}
		base := ws.Spec
		want, err := workerspec.OffsetEndpoint(base.Endpoint, uint32(rank))
		if err != nil || want != req.Endpoint {
			return spec, expected, false, invalidArg("dp_rank=%d of %q: endpoint %q is not rank 0's endpoint %q offset by %d (%s)", rank, id, req.Endpoint, base.Endpoint, rank, want)
		}
		if int64(base.Ranks()) > rank {
			return base, base, false, nil
		}
		expected = base
		base.DPSize = int(rank) + 1
		return base, expected, true, nil
	}
	return spec, expected, false, invalidArg("dp_rank=%d of %q: register dp rank 0 first", rank, id)
}

// rank is the dp rank the request registers (0 when not given).
func (req *registerJSON) rank() int64 {
	if req.DPRank == nil {
		return 0
	}
	return *req.DPRank
}

// instanceID reads an instance id given as a JSON string or number.
func instanceID(raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return "", invalidArg("instance_id is required")
	}
	if raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", invalidArg("field \"instance_id\": %v", err)
		}
		return s, nil
	}
	var n json.Number
	if err := json.Unmarshal(raw, &n); err != nil {
		return "", invalidArg("field \"instance_id\": want a string or an integer, got %s", raw)
	}
	if _, err := strconv.ParseInt(n.String(), 10, 64); err != nil {
		return "", invalidArg("field \"instance_id\": want a string or an integer, got %s", raw)
	}
	return n.String(), nil
}

// oneModel returns the one model named by the model fields of the compatible
// forms (model, model_name, modelname).
func oneModel(names ...string) (string, error) {
	model := ""
	for _, n := range names {
		if n == "" {
			continue
		}
		if model != "" && n != model {
			return "", invalidArg("model names %q and %q differ", model, n)
		}
		model = n
	}
	if model == "" {
		return "", invalidArg("model (or model_name) is required")
	}
	return model, nil
}

// unregisterJSON is POST /unregister's body: ours ({"worker_id"}) or the
// compatible form ({"instance_id"}).
type unregisterJSON struct {
	WorkerID   string          `json:"worker_id"`
	InstanceID json.RawMessage `json:"instance_id"`
	DPRank     *int64          `json:"dp_rank"`
}

func (a *API) handleUnregister(w http.ResponseWriter, r *http.Request) error {
	var req unregisterJSON
	if err := decodeJSON(r, &req); err != nil {
		return err
	}
	if req.WorkerID != "" {
		applied, err := a.unregisterWorker(r.Context(), req.WorkerID)
		if err != nil {
			return err
		}
		return writeProto(w, &kvindexv1.UnregisterWorkerResponse{AppliedIndex: applied})
	}
	id, err := instanceID(req.InstanceID)
	if err != nil {
		return invalidArg("worker_id (or instance_id) is required")
	}
	if req.DPRank != nil {
		// Mooncake's body always names a rank. Naming the only rank of a
		// worker removes the worker; one rank of several cannot go alone.
		view, err := a.view.get(r.Context())
		if err != nil {
			return err
		}
		if vw := view.byID[id]; vw != nil && (*req.DPRank != 0 || vw.ranks > 1) {
			return fmt.Errorf("%w: removing one dp rank (dp_rank=%d) of worker %q, which has %d; unregister the whole worker (no dp_rank)", ErrNotSupported, *req.DPRank, id, vw.ranks)
		}
	}
	if _, err := a.unregisterWorker(r.Context(), id); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok", "instance_id": id})
	return nil
}

func specProto(s workerspec.Spec) *kvindexv1.WorkerSpec {
	return &kvindexv1.WorkerSpec{
		Id: s.ID, Model: s.Model, BlockSize: uint32(s.BlockSize), DpSize: uint32(s.DPSize),
		EventsEndpoint: s.Endpoint, EventsTopic: s.Topic, ReplayEndpoint: s.Replay, HttpEndpoint: s.HTTP,
		Role: workerRoles[s.Role], Labels: s.Labels,
	}
}

var workerRoles = map[string]kvindexv1.WorkerRole{
	"":           kvindexv1.WorkerRole_WORKER_ROLE_UNSPECIFIED,
	"aggregated": kvindexv1.WorkerRole_WORKER_ROLE_AGGREGATED,
	"prefill":    kvindexv1.WorkerRole_WORKER_ROLE_PREFILL,
	"decode":     kvindexv1.WorkerRole_WORKER_ROLE_DECODE,
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
