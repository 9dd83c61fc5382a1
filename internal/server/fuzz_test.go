package server

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	kvindexv1 "github.com/kvindex/kvindex/api/proto/kvindex/v1"
)

// FuzzRESTBodies sends arbitrary bodies to every POST endpoint: the answer is
// never a 5xx and always JSON, whatever the body.
func FuzzRESTBodies(f *testing.F) {
	cfg := testConfig(f)
	cfg.MaxBodyBytes = kvindexv1.LedgerMinRecvBytes // the least a node takes
	cfg.MaxPromptTokens = 4096
	h := runServer(f, cfg).API().Handler()
	paths := []string{"/kv-cache/hit-rate", "/query", "/query_by_hash", "/v1/score", "/v1/query_by_hash", "/register", "/unregister"}
	for _, seed := range []string{
		`{"model": "fake/test-model", "token_ids": [1, 2, 3, 4, 5]}`,
		`{"model": "fake/test-model", "prompt": "hello", "pods": ["a"]}`,
		`{"model": "fake/test-model", "messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]}], "tools": [{"type": "function", "function": {"name": "f"}}]}`,
		`{"model_name": "m", "block_hashes": [-1, "0x10", "7"]}`,
		`{"worker": {"id": "w", "model": "m", "block_size": 16}}`,
		`{"instance_id": 3, "model_name": "m", "endpoint": "tcp://127.0.0.1:1", "dp_rank": 1}`,
		`{"model": "m", "block_size": -1, "token_ids": []}`,
		"\xff{", `[]`, `null`, `{"text": "\ud800"}`,
	} {
		for i := range paths {
			f.Add(i, seed)
		}
	}
	f.Fuzz(func(t *testing.T, which int, body string) {
		path := paths[uint(which)%uint(len(paths))]
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, path, strings.NewReader(body)))
		if rec.Code >= 500 && rec.Code != http.StatusNotImplemented && rec.Code != http.StatusServiceUnavailable {
			t.Fatalf("POST %s %q = %d %s", path, body, rec.Code, rec.Body)
		}
		if !json.Valid(rec.Body.Bytes()) {
			t.Fatalf("POST %s %q answered non-JSON %q", path, body, rec.Body)
		}
	})
}

// FuzzTokenIDs checks the hand-written token id parser against encoding/json:
// both accept the same arrays with the same values.
func FuzzTokenIDs(f *testing.F) {
	for _, seed := range []string{`[1,2,3]`, ` [ 0 , 4294967295 ] `, `[]`, `null`, `[4294967296]`, `[-1]`, `[1.5]`, `[1e3]`,
		`[01]`, `["1"]`, `[1,]`, `[,1]`, `[1 2]`, `{}`, `[`, `[1`, "[\t1\r\n]"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data string) {
		var mine tokenIDs
		mineErr := mine.UnmarshalJSON([]byte(data))
		var std []uint32
		stdErr := json.Unmarshal([]byte(data), &std)
		if !json.Valid([]byte(data)) {
			return // encoding/json checks validity before calling UnmarshalJSON
		}
		if (mineErr == nil) != (stdErr == nil) {
			t.Fatalf("%q: mine %v, encoding/json %v", data, mineErr, stdErr)
		}
		if mineErr == nil && !slices.Equal([]uint32(mine), std) {
			t.Fatalf("%q: mine %v, encoding/json %v", data, mine, std)
		}
	})
}
