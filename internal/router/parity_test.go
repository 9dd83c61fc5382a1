package router

import (
	"encoding/json"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvindex/kvindex/bench/fakeengine"
	"github.com/kvindex/kvindex/internal/kvblock"
	"github.com/kvindex/kvindex/internal/tokenize"
	"github.com/kvindex/kvindex/internal/tokenize/tokenizetest"
)

// engineHoldsChain reports whether the engine caches blocks whose local keys,
// parent to child from the root, are keys, as its GET /debug/kv-blocks shows.
func engineHoldsChain(t *testing.T, e *fakeengine.Engine, keys []uint64) bool {
	t.Helper()
	resp, err := http.Get(e.URL() + "/debug/kv-blocks")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var truth fakeengine.Truth
	if err := json.NewDecoder(resp.Body).Decode(&truth); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /debug/kv-blocks: %d %v", resp.StatusCode, err)
	}
	type child struct {
		parent uint64
		root   bool
		local  uint64
	}
	byKey := map[child]uint64{}
	for _, rk := range truth.Ranks {
		for _, b := range rk.Blocks {
			local := kvblock.AppendLocalHashes(nil, b.TokenIDs, truth.BlockSize, b.LoRAName)
			if len(local) != 1 {
				t.Fatalf("engine block %x holds %d tokens, not one block of %d", b.Hash, len(b.TokenIDs), truth.BlockSize)
			}
			c := child{root: b.ParentHash == nil, local: local[0]}
			if b.ParentHash != nil {
				c.parent = *b.ParentHash
			}
			byKey[c] = b.Hash
		}
	}
	parent, root := uint64(0), true
	for i, k := range keys {
		h, ok := byKey[child{parent: parent, root: root, local: k}]
		if !ok {
			t.Logf("block %d of %d (key %x) is not cached under its parent", i, len(keys), k)
			return false
		}
		parent, root = h, false
	}
	return true
}

// dryRun asks /debug/route for the decision (and so the block keys) of body.
func dryRun(t *testing.T, url, body string) decisionJSON {
	t.Helper()
	resp, err := http.Post(url+"/debug/route", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var d decisionJSON
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&d) != nil {
		t.Fatalf("/debug/route: %s", resp.Status)
	}
	return d
}

// The router's block keys for text, chat and token-id prompts are the keys of
// the blocks the engine stores for them (compared with /debug/kv-blocks), with
// the built-in tokenizer and with the real Qwen3 files, and the parity probe
// says so; a router without the engine's tokenizer is flagged.
func TestTokenParityWithTheEngine(t *testing.T) {
	qwen := filepath.Join(tokenizetest.Dir(t), "qwen3")
	// Loading the real tokenizer is the slow part (seconds under -race): one
	// Qwen3 engine serves two routers, one with its tokenizer and one without.
	for _, c := range []struct {
		name      string
		engineTok string
		routers   []parityRouter
	}{
		{name: "builtin", routers: []parityRouter{{name: "builtin", wantOK: true}}},
		{name: "qwen3", engineTok: qwen, routers: []parityRouter{
			{name: "with the engine's tokenizer", tok: qwen, wantOK: true},
			{name: "without it", wantOK: false},
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := startFleet(t, 1, func(_ int, ec *fakeengine.Config) {
				if c.engineTok != "" {
					ec.Tokenizers = tokenize.Specs{{Model: testModel, Dir: c.engineTok}}
				}
			})
			for _, pr := range c.routers {
				t.Run(pr.name, func(t *testing.T) { checkParity(t, f, pr) })
			}
		})
	}
}

// parityRouter is one router of the parity test: its tokenizer dir ("" for the
// built-in one) and whether it should match the engine.
type parityRouter struct {
	name   string
	tok    string
	wantOK bool
}

func checkParity(t *testing.T, f *fleet, pr parityRouter) {
	cfg := testConfig(t, f)
	if pr.tok != "" {
		cfg.Tokenizers = tokenize.Specs{{Model: testModel, Dir: pr.tok}}
	}
	rt := startRouter(t, cfg)
	e := f.engines["w0"]
	bodies := map[string]string{
		"text": completionBody("Routing decisions depend on token ids matching exactly, déjà vu included: 12345!", 1),
		"chat": `{"model":"` + testModel + `","max_tokens":1,"messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Explain prefix caching in one line, please."}]}`,
		"ids":  `{"model":"` + testModel + `","max_tokens":1,"prompt":[11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28]}`,
	}
	for kind, body := range bodies {
		d := dryRun(t, rt.url, body)
		path := "/v1/completions"
		if kind == "chat" {
			path = "/v1/chat/completions"
		}
		code, resp, raw := post(t, rt.url, path, body)
		if code != http.StatusOK {
			t.Fatalf("%s: %d %s", kind, code, raw)
		}
		if d.PromptTokens != resp.Usage.PromptTokens && pr.wantOK {
			t.Errorf("%s: the router counts %d prompt tokens, the engine %d", kind, d.PromptTokens, resp.Usage.PromptTokens)
		}
		keys := routerKeys(t, rt, body, path)
		if len(keys) == 0 {
			t.Fatalf("%s: the prompt has no full block; make it longer", kind)
		}
		want := pr.wantOK || kind == "ids" // token ids need no tokenizer
		if got := engineHoldsChain(t, e, keys); got != want {
			t.Errorf("%s: engine holds the router's blocks = %v, want %v", kind, got, want)
		}
	}
	want := 0.0
	if pr.wantOK {
		want = 1
	}
	waitFor(t, 30*time.Second, "the parity probe", func() bool {
		return testutil.ToFloat64(rt.metrics.tokenParity.WithLabelValues(testModel)) == want
	})
}

// routerKeys is what the router computes for body: the local block keys.
func routerKeys(t *testing.T, rt *testRouter, body, path string) []uint64 {
	t.Helper()
	ep := endpointCompletions
	if path == "/v1/chat/completions" {
		ep = endpointChat
	}
	p, err := rt.prepare(http.Header{}, path, ep, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	return slices.Clone(p.route.LocalKeys)
}
