package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	kvindexv1 "github.com/kvindex/kvindex/api/proto/kvindex/v1"
	"github.com/kvindex/kvindex/internal/ingest"
	"github.com/kvindex/kvindex/internal/raftstore"
	"github.com/kvindex/kvindex/internal/tokenize"
	"github.com/kvindex/kvindex/internal/workerspec"
)

// TestBadRESTInputIsRefusedClearly sends malformed, mistyped, oversized and
// otherwise wrong requests: each gets a 4xx JSON error naming the problem, and
// the server keeps serving.
func TestBadRESTInputIsRefusedClearly(t *testing.T) {
	f := newFixture(t, fixtureOptions{engines: defaultEngines[:1]})
	million := "[" + strings.Repeat("0,", 1<<20-1) + "0]"
	cases := []struct {
		name, path, body string
		code             int
		errCode, want    string
	}{
		{"malformed JSON", "/kv-cache/hit-rate", `{"model": "m", "token_ids": [1, 2`, 400, "invalid_argument", "malformed JSON"},
		{"not an object", "/kv-cache/hit-rate", `[1, 2, 3]`, 400, "invalid_argument", "must be a JSON object"},
		{"empty body", "/query", ``, 400, "invalid_argument", "body is empty"},
		{"model of the wrong type", "/kv-cache/hit-rate", `{"model": 5, "token_ids": [1]}`, 400, "invalid_argument", `field "model": want a string`},
		{"token_ids of the wrong type", "/kv-cache/hit-rate", `{"model": "m", "token_ids": "1 2 3"}`, 400, "invalid_argument", `field "token_ids": want an array`},
		{"negative token id", "/query", `{"model": "m", "token_ids": [1, -2]}`, 400, "invalid_argument", `field "token_ids"`},
		{"token id over uint32", "/query", `{"model": "m", "token_ids": [4294967296]}`, 400, "invalid_argument", `field "token_ids"`},
		{"unknown model for text", "/kv-cache/hit-rate", `{"model": "no/such-model", "prompt": "hello"}`, 404, "unknown_model", `--tokenizer no/such-model=<dir>`},
		{"negative block size", "/kv-cache/hit-rate", fmt.Sprintf(`{"model": %q, "token_ids": [1, 2, 3, 4], "block_size": -16}`, testModel), 400, "invalid_argument", "block_size=-16"},
		{"block size of the wrong type", "/query", `{"model": "m", "token_ids": [1], "block_size": "16"}`, 400, "invalid_argument", `field "block_size"`},
		{"10 MB body", "/kv-cache/hit-rate", `{"model": "m", "prompt": "` + strings.Repeat("a", 10<<20) + `"}`, 413, "too_large", "--max-body-bytes"},
		{"1M token ids", "/kv-cache/hit-rate", fmt.Sprintf(`{"model": %q, "token_ids": %s}`, testModel, million), 413, "too_large", "--max-prompt-tokens"},
		{"invalid UTF-8 text", "/kv-cache/hit-rate", fmt.Sprintf("{\"model\": %q, \"prompt\": \"abc\xff\xfe\"}", testModel), 400, "invalid_argument", "not valid UTF-8"},
		{"two prompts", "/kv-cache/hit-rate", fmt.Sprintf(`{"model": %q, "prompt": "a", "token_ids": [1]}`, testModel), 400, "invalid_argument", "only one of"},
		{"no prompt", "/kv-cache/hit-rate", fmt.Sprintf(`{"model": %q}`, testModel), 400, "invalid_argument", "prompt is missing"},
		{"no model", "/kv-cache/hit-rate", `{"token_ids": [1, 2, 3, 4]}`, 400, "invalid_argument", "model is required"},
		{"a 257-byte pod name", "/kv-cache/hit-rate", fmt.Sprintf(`{"model": %q, "token_ids": [1, 2, 3, 4], "pods": ["e0", %q]}`, testModel, strings.Repeat("p", 257)), 413, "too_large", "worker id is 257 bytes"},
		{"non-text content part", "/kv-cache/hit-rate", fmt.Sprintf(`{"model": %q, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}`, testModel), 400, "invalid_argument", "image_url"},
		{"query without token_ids", "/query", `{"model_name": "m"}`, 400, "invalid_argument", "token_ids is required"},
		{"query with two models", "/query", `{"model": "a", "model_name": "b", "token_ids": [1]}`, 400, "invalid_argument", "differ"},
		{"query with a bad format", "/query?format=xml", `{"model": "m", "token_ids": [1]}`, 400, "invalid_argument", "format="},
		{"sequence hashes", "/query_by_hash", `{"model": "m", "seq_hashes": [1, 2]}`, 501, "not_supported", "local block hashes"},
		{"bad hash", "/query_by_hash", `{"model": "m", "block_hashes": ["0xzz"]}`, 400, "invalid_argument", `field "block_hashes"`},
		{"typed score with a bad field", "/v1/score", `{"model": "m", "token_ids": ["x"]}`, 400, "invalid_argument", "token_ids"},
		{"typed score with an unknown field", "/v1/score", `{"model": "m", "colour": 1}`, 400, "invalid_argument", "colour"},
		{"register without an id", "/register", `{"model_name": "m", "endpoint": "tcp://127.0.0.1:1"}`, 400, "invalid_argument", "instance_id is required"},
		{"register with a bad spec", "/register", `{"worker": {"id": "w 1", "model": "m"}}`, 400, "invalid_argument", "whitespace"},
		{"unregister an unknown worker", "/unregister", `{"worker_id": "nobody"}`, 404, "not_found", "nobody"},
		{"unregister one dp rank", "/unregister", `{"instance_id": "e0", "dp_rank": 1}`, 501, "not_supported", "dp_rank=1"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, body := f.postJSON(c.path, c.body)
			var e errorBody
			if err := json.Unmarshal([]byte(body), &e); err != nil {
				t.Fatalf("%d: the error body is not JSON: %.200s", code, body)
			}
			if code != c.code || e.Error.Code != c.errCode || !strings.Contains(e.Error.Message, c.want) {
				t.Errorf("got %d %+v, want %d %s mentioning %q", code, e.Error, c.code, c.errCode, c.want)
			}
		})
	}
	for _, c := range []struct{ method, path, want string }{
		{http.MethodGet, "/query", "method_not_allowed"},
		{http.MethodPost, "/workers", "method_not_allowed"},
		{http.MethodGet, "/no/such/endpoint", "not_found"},
	} {
		req, _ := http.NewRequest(c.method, f.base+c.path, nil)
		code, body := f.do(req)
		if code != 405 && code != 404 || !strings.Contains(body, c.want) {
			t.Errorf("%s %s = %d %s", c.method, c.path, code, body)
		}
	}
	if code, body := f.get("/healthz"); code != 200 {
		t.Fatalf("the server no longer answers: %d %s", code, body)
	}
	if code, body := f.postJSON("/kv-cache/hit-rate", map[string]any{"model": testModel, "token_ids": tokens(0, 8)}); code != 200 {
		t.Errorf("a good request after the bad ones = %d %s", code, body)
	}
}

// TestBadGRPCInputIsRefusedClearly checks the gRPC side of the same rules.
func TestBadGRPCInputIsRefusedClearly(t *testing.T) {
	f := newFixture(t, fixtureOptions{engines: defaultEngines[:1]})
	ctx := context.Background()
	zero := uint32(0)
	noGen := false
	million := make([]uint32, 1<<20)
	cases := []struct {
		name string
		call func() error
		code codes.Code
		want string
	}{
		{"no model", func() error {
			_, err := f.index.Score(ctx, &kvindexv1.ScoreRequest{TokenIds: []uint32{1}})
			return err
		}, codes.InvalidArgument, "model is required"},
		{"no prompt", func() error {
			_, err := f.index.Score(ctx, &kvindexv1.ScoreRequest{Model: testModel})
			return err
		}, codes.InvalidArgument, "prompt is missing"},
		{"two prompts", func() error {
			_, err := f.index.Score(ctx, &kvindexv1.ScoreRequest{Model: testModel, Text: "a", TokenIds: []uint32{1}})
			return err
		}, codes.InvalidArgument, "only one of"},
		{"block size 0", func() error {
			_, err := f.index.Score(ctx, &kvindexv1.ScoreRequest{Model: testModel, TokenIds: []uint32{1}, BlockSize: &zero})
			return err
		}, codes.InvalidArgument, "block_size=0"},
		{"unknown model for text", func() error {
			_, err := f.index.Score(ctx, &kvindexv1.ScoreRequest{Model: "no/such-model", Text: "hi"})
			return err
		}, codes.NotFound, "no tokenizer"},
		{"bad tools json", func() error {
			_, err := f.index.Score(ctx, &kvindexv1.ScoreRequest{Model: testModel, Messages: []*kvindexv1.ChatMessage{{Role: "user", Content: "x"}},
				ToolsJson: "{", AddGenerationPrompt: &noGen})
			return err
		}, codes.InvalidArgument, "tools_json"},
		{"1M token ids", func() error {
			_, err := f.index.Score(ctx, &kvindexv1.ScoreRequest{Model: testModel, TokenIds: million})
			return err
		}, codes.ResourceExhausted, "--max-prompt-tokens"},
		{"10 MB message", func() error {
			_, err := f.index.Score(ctx, &kvindexv1.ScoreRequest{Model: testModel, Text: strings.Repeat("a", 10<<20)})
			return err
		}, codes.ResourceExhausted, "larger than max"},
		{"sequence hashes", func() error {
			_, err := f.index.QueryByHash(ctx, &kvindexv1.QueryByHashRequest{Model: testModel, BlockHashes: []uint64{1}})
			return err
		}, codes.Unimplemented, "BLOCK_HASH_KIND_LOCAL"},
		{"register without a worker", func() error {
			_, err := f.admin.RegisterWorker(ctx, &kvindexv1.RegisterWorkerRequest{})
			return err
		}, codes.InvalidArgument, "worker is required"},
		{"register a different spec under a taken id", func() error {
			_, err := f.admin.RegisterWorker(ctx, &kvindexv1.RegisterWorkerRequest{Worker: &kvindexv1.WorkerSpec{Id: "e0", Model: "other", BlockSize: 16}})
			return err
		}, codes.AlreadyExists, "e0"},
		{"join without a raft address", func() error {
			_, err := f.admin.Join(ctx, &kvindexv1.JoinRequest{NodeId: "b"})
			return err
		}, codes.InvalidArgument, "raft_addr"},
		{"join with an oversized node id", func() error {
			_, err := f.admin.Join(ctx, &kvindexv1.JoinRequest{NodeId: strings.Repeat("n", 5000), RaftAddr: "127.0.0.1:1"})
			return err
		}, codes.InvalidArgument, "node id of 1.."},
		{"join with an oversized gRPC address", func() error {
			_, err := f.admin.Join(ctx, &kvindexv1.JoinRequest{NodeId: "n9", RaftAddr: "127.0.0.1:1", GrpcAddr: strings.Repeat("a", 64<<10+1)})
			return err
		}, codes.ResourceExhausted, "grpc_addr"},
		{"unregister an oversized worker id", func() error {
			_, err := f.admin.UnregisterWorker(ctx, &kvindexv1.UnregisterWorkerRequest{WorkerId: strings.Repeat("w", 1025)})
			return err
		}, codes.ResourceExhausted, "worker_id"},
		{"leave without a node id", func() error {
			_, err := f.admin.Leave(ctx, &kvindexv1.LeaveRequest{})
			return err
		}, codes.InvalidArgument, "node_id"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.call()
			if status.Code(err) != c.code || !strings.Contains(status.Convert(err).Message(), c.want) {
				t.Errorf("got %v, want %v mentioning %q", err, c.code, c.want)
			}
		})
	}
	if _, err := f.index.Score(ctx, &kvindexv1.ScoreRequest{Model: testModel, TokenIds: tokens(0, 8)}); err != nil {
		t.Errorf("a good request after the bad ones: %v", err)
	}
}

// TestErrorTableMapsEverySentinel checks each row of the one error table on
// both protocols, and the leader hint of a not-leader error.
func TestErrorTableMapsEverySentinel(t *testing.T) {
	for _, c := range []struct {
		err  error
		grpc codes.Code
		http int
	}{
		{invalidArg("x"), codes.InvalidArgument, 400},
		{fmt.Errorf("w: %w", workerspec.ErrInvalid), codes.InvalidArgument, 400},
		{fmt.Errorf("w: %w", tokenize.ErrInvalidMessages), codes.InvalidArgument, 400},
		{fmt.Errorf("unregister: %w", raftstore.ErrInvalidEntry), codes.InvalidArgument, 400},
		{ErrUnknownModel, codes.NotFound, 404},
		{ErrNotFound, codes.NotFound, 404},
		{ErrAlreadyExists, codes.AlreadyExists, 409},
		{ingest.ErrWorkerConflict, codes.FailedPrecondition, 400},
		{fmt.Errorf("messages: %w", tokenize.ErrNotSupported), codes.FailedPrecondition, 400},
		{fmt.Errorf("x: %w", tokenize.ErrUnknownModel), codes.NotFound, 404},
		{ErrUnauthenticated, codes.Unauthenticated, 401},
		{ErrPermissionDenied, codes.PermissionDenied, 403},
		{ErrTooLarge, codes.ResourceExhausted, 413},
		{ErrWatchLagging, codes.ResourceExhausted, 429},
		{ErrTooMany, codes.ResourceExhausted, 429},
		{ErrRequestTimeout, codes.DeadlineExceeded, 408},
		{&NotLeaderError{LeaderID: "n2", LeaderAddr: "10.0.0.2:7070"}, codes.Unavailable, 503},
		{ErrUnavailable, codes.Unavailable, 503},
		{ErrNotSupported, codes.Unimplemented, 501},
		{context.Canceled, codes.Canceled, 499},
		{context.DeadlineExceeded, codes.DeadlineExceeded, 504},
		{errors.New("boom"), codes.Internal, 500},
	} {
		if got := status.Code(grpcError(c.err)); got != c.grpc {
			t.Errorf("%v: gRPC %v, want %v", c.err, got, c.grpc)
		}
		if got := classify(c.err).http; got != c.http {
			t.Errorf("%v: HTTP %d, want %d", c.err, got, c.http)
		}
	}
	st := status.Convert(grpcError(fmt.Errorf("register: %w", &NotLeaderError{LeaderID: "n2", LeaderAddr: "10.0.0.2:7070"})))
	var info *errdetails.ErrorInfo
	for _, d := range st.Details() {
		if i, ok := d.(*errdetails.ErrorInfo); ok {
			info = i
		}
	}
	if info == nil || info.Reason != kvindexv1.NotLeaderReason || info.Metadata["leader_addr"] != "10.0.0.2:7070" {
		t.Errorf("not-leader details = %v", st.Details())
	}
	rec := &headerRecorder{header: http.Header{}}
	writeError(rec, &NotLeaderError{LeaderID: "n2", LeaderAddr: "10.0.0.2:7070"})
	if rec.code != 503 || rec.header.Get(LeaderHeader) != "10.0.0.2:7070" || !strings.Contains(rec.body.String(), `"leader_addr":"10.0.0.2:7070"`) {
		t.Errorf("REST not-leader = %d %v %s", rec.code, rec.header, rec.body.String())
	}
}

type headerRecorder struct {
	header http.Header
	code   int
	body   strings.Builder
}

func (r *headerRecorder) Header() http.Header         { return r.header }
func (r *headerRecorder) WriteHeader(code int)        { r.code = code }
func (r *headerRecorder) Write(b []byte) (int, error) { return r.body.Write(b) }
