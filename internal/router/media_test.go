package router

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"

	"github.com/kvindex/kvindex/internal/workerspec"
)

// recordingEngine stands in for a multimodal vLLM: it serves the model, keeps the
// body of every generation request and answers it with a small chat completion.
type recordingEngine struct {
	srv    *httptest.Server
	mu     sync.Mutex
	bodies []string // guarded by mu
}

func startRecordingEngine(t *testing.T) *recordingEngine {
	t.Helper()
	e := &recordingEngine{}
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == http.MethodGet && r.URL.Path == "/v1/models":
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"object":"list","data":[{"id":%q,"object":"model"}]}`, testModel)
		case r.Method == http.MethodPost && strings.HasPrefix(r.URL.Path, "/v1/"):
			body, err := io.ReadAll(r.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			e.mu.Lock()
			e.bodies = append(e.bodies, string(body))
			e.mu.Unlock()
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"id":"chatcmpl-1","object":"chat.completion","model":%q,"choices":[{"index":0,"message":{"role":"assistant","content":"a cat"},"finish_reason":"stop"}],"usage":{"prompt_tokens":300,"completion_tokens":2,"total_tokens":302}}`, testModel)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(e.srv.Close)
	return e
}

func (e *recordingEngine) received() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.bodies...)
}

// recordingFleet is two recording engines behind a router of the policy.
func recordingFleet(t *testing.T, policy string) (Config, []*recordingEngine) {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Listen = "127.0.0.1:0"
	cfg.BlockSize = 4
	cfg.Policy = policy
	var engines []*recordingEngine
	for i := range 2 {
		e := startRecordingEngine(t)
		engines = append(engines, e)
		cfg.Workers = append(cfg.Workers, workerspec.Spec{ID: fmt.Sprintf("v%d", i), Model: testModel, HTTP: e.srv.URL})
	}
	return cfg, engines
}

// imageBody is a vision request as OpenAI clients send it: text and an inline image.
func imageBody(question string) string {
	return fmt.Sprintf(`{"model":%q,"messages":[{"role":"system","content":"You describe images."},`+
		`{"role":"user","content":[{"type":"text","text":%q},{"type":"image_url","image_url":{"url":"data:image/png;base64,%s"}}]}],"max_tokens":8}`,
		testModel, question, strings.Repeat("iVBORw0KGgo", 200))
}

// debugRoute is the router's dry-run decision for a body of the endpoint.
func debugRoute(t *testing.T, rt *testRouter, endpoint, body string) decisionJSON {
	t.Helper()
	resp, raw := send(t, rt.url, "/debug/route?endpoint="+endpoint, body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/debug/route: %d %s", resp.StatusCode, raw)
	}
	var d decisionJSON
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("/debug/route answer %s: %v", raw, err)
	}
	return d
}

// A chat request with media reaches an engine, whatever the policy, with its body
// exactly as the client sent it; it is routed by load alone (the engine keys media
// blocks with the media's hash, which the router cannot compute), and says so. A
// text-only request is keyed as before.
func TestMediaRequestsAreRoutedByLoadAndPassedOnUnchanged(t *testing.T) {
	for _, policy := range []string{PolicyKVAware, PolicyRoundRobin} {
		t.Run(policy, func(t *testing.T) {
			cfg, engines := recordingFleet(t, policy)
			cfg.Indexer = []string{startIndexer(t, startFleet(t, 1, nil)).addr}
			cfg.IndexerTimeout = 10 * time.Second // -race on busy cores: the text request must get its answer
			rt := startRouter(t, cfg)
			bodies := []string{
				imageBody("what is this?"),
				// Any part that is not text counts, known to vLLM or not: the engine
				// judges it.
				fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"UklGRg==","format":"wav"}},{"type":"file","file":{"file_id":"f1"}}]}]}`, testModel),
			}
			for _, body := range bodies {
				code, _, raw := post(t, rt.url, "/v1/chat/completions", body)
				if code != http.StatusOK {
					t.Fatalf("media request: %d %s, want the engine's 200", code, raw)
				}
				d := debugRoute(t, rt, "/v1/chat/completions", body)
				if d.PromptBlocks != 0 || d.PromptTokens != 0 || d.OverlapBlocks != 0 || d.IndexerAnswered ||
					d.Source != SourceLoadOnly || !strings.Contains(d.Reason, "without prefix keys") {
					t.Errorf("decision %+v: want no prompt tokens, no keys, no indexer query, load-only, and the reason", d)
				}
			}
			var got []string
			for _, e := range engines {
				got = append(got, e.received()...)
			}
			slices.Sort(got)
			if want := slices.Sorted(slices.Values(bodies)); !slices.Equal(got, want) {
				t.Fatalf("engines received %d bodies (%.120q...), want the %d sent, each once and unchanged", len(got), got, len(want))
			}
			// Text only: keyed from the rendered prompt, as before.
			text := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":[{"type":"text","text":%q}]}]}`, testModel, words("text", 20))
			if d := debugRoute(t, rt, "/v1/chat/completions", text); d.PromptBlocks == 0 || !d.IndexerAnswered || d.Reason != "" {
				t.Errorf("text-only decision %+v: want prompt blocks, the indexer asked, and no reason", d)
			}
			rt.assertNoLoad(t, []string{"v0", "v1"})
		})
	}
}

// A completion carrying vLLM's prompt_embeds (alone, or with a text prompt, which
// vLLM serves after them) is routed by load and passed on unchanged: the
// embeddings' blocks are not the router's to key.
func TestPromptEmbedsAreRoutedByLoadAndPassedOnUnchanged(t *testing.T) {
	cfg, engines := recordingFleet(t, PolicyKVAware)
	rt := startRouter(t, cfg)
	embeds := strings.Repeat("k05MUFkBAHYAeydkZXNjcic6ICc8ZjQnLCAn", 100)
	bodies := []string{
		fmt.Sprintf(`{"model":%q,"prompt_embeds":%q,"max_tokens":4}`, testModel, embeds),
		fmt.Sprintf(`{"model":%q,"prompt":%q,"prompt_embeds":[%q],"max_tokens":4}`, testModel, words("with embeds", 20), embeds),
	}
	for _, body := range bodies {
		if code, _, raw := post(t, rt.url, "/v1/completions", body); code != http.StatusOK {
			t.Fatalf("prompt_embeds request: %d %s, want the engine's 200", code, raw)
		}
		if d := debugRoute(t, rt, "/v1/completions", body); d.PromptBlocks != 0 || d.Source != SourceLoadOnly || !strings.Contains(d.Reason, "prompt_embeds") {
			t.Errorf("decision %+v: want no keys, load-only, and the reason", d)
		}
	}
	got := append(engines[0].received(), engines[1].received()...)
	slices.Sort(got)
	if want := slices.Sorted(slices.Values(bodies)); !slices.Equal(got, want) {
		t.Fatalf("engines received %d bodies, want the %d sent, each once and unchanged", len(got), len(want))
	}
	// prompt_embeds null is no embedding: the text prompt is keyed.
	text := fmt.Sprintf(`{"model":%q,"prompt":%q,"prompt_embeds":null}`, testModel, words("no embeds", 20))
	if d := debugRoute(t, rt, "/v1/completions", text); d.PromptBlocks == 0 || d.Reason != "" {
		t.Errorf("text decision %+v: want prompt blocks and no reason", d)
	}
}

// Through the endpoint picker the same: a destination is chosen and the body is
// passed on unchanged.
func TestEPPRoutesMediaRequests(t *testing.T) {
	cfg, _ := recordingFleet(t, PolicyKVAware)
	_, client, _ := startEPP(t, cfg)
	body := imageBody("and this?")
	a := newEnvoy(t, client, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED).request("/v1/chat/completions", body, nil)
	if a.immediate != nil {
		t.Fatalf("immediate response %v, want a destination", a.immediate)
	}
	if a.header[EPPDestinationHeader] == "" {
		t.Fatalf("no destination: %+v", a.header)
	}
	if string(a.body) != body {
		t.Errorf("body passed on as %.120q..., want it unchanged", a.body)
	}
}
