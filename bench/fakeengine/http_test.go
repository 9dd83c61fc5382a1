package fakeengine

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/tokenize"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// sseEvent is one dispatched server-sent event (the data lines joined).
type sseEvent struct{ data string }

// readSSE parses a text/event-stream body per the WHATWG rules: lines "field:
// value", comments starting with ':', an empty line dispatches the event.
func readSSE(t *testing.T, body io.Reader) []sseEvent {
	t.Helper()
	var events []sseEvent
	var data []string
	sc := bufio.NewScanner(body)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if data != nil {
				events = append(events, sseEvent{strings.Join(data, "\n")})
				data = nil
			}
		case strings.HasPrefix(line, ":"):
		default:
			field, value, _ := strings.Cut(line, ":")
			value = strings.TrimPrefix(value, " ")
			if field == "data" {
				data = append(data, value)
			}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return events
}

func TestCompletionStreamParsesAsSSE(t *testing.T) {
	e := startEngine(t, testConfig())
	prompt := `"The quick brown fox"`
	var plain completionAnswer
	postJSON(t, e.URL()+"/v1/completions", `{"prompt":`+prompt+`,"max_tokens":5}`, &plain)

	resp, err := http.Post(e.URL()+"/v1/completions", "application/json",
		strings.NewReader(`{"prompt":`+prompt+`,"max_tokens":5,"stream":true,"stream_options":{"include_usage":true}}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); resp.StatusCode != 200 || ct != "text/event-stream" {
		t.Fatalf("status %d content-type %q", resp.StatusCode, ct)
	}
	events := readSSE(t, resp.Body)
	if len(events) != 5+3 || events[len(events)-1].data != "[DONE]" {
		t.Fatalf("got %d events ending %q, want 5 token chunks, a finish chunk, a usage chunk and [DONE]", len(events), events[len(events)-1].data)
	}
	var text strings.Builder
	for i, ev := range events[:6] {
		var c struct {
			Object  string `json:"object"`
			Choices []struct {
				Text         string  `json:"text"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(ev.data), &c); err != nil || c.Object != "text_completion" || len(c.Choices) != 1 {
			t.Fatalf("chunk %d %q: %v", i, ev.data, err)
		}
		if (c.Choices[0].FinishReason != nil) != (i == 5) {
			t.Fatalf("chunk %d finish_reason %v", i, c.Choices[0].FinishReason)
		}
		text.WriteString(c.Choices[0].Text)
	}
	if text.String() != plain.Choices[0].Text || len(plain.Choices[0].Text) != 5 {
		t.Fatalf("streamed text %q, non-streamed %q; want the same 5 tokens", text.String(), plain.Choices[0].Text)
	}
	var u completionAnswer
	if err := json.Unmarshal([]byte(events[6].data), &u); err != nil || u.Usage.CompletionTokens != 5 || u.Usage.PromptTokens != plain.Usage.PromptTokens {
		t.Fatalf("usage chunk %q: %v", events[6].data, err)
	}
	if resp.Trailer.Get(HeaderSimTTFT) == "" {
		t.Fatalf("trailer %s missing: %v", HeaderSimTTFT, resp.Trailer)
	}
}

func TestChatCompletions(t *testing.T) {
	e := startEngine(t, testConfig())
	messages := `[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}]`
	var plain struct {
		Object  string `json:"object"`
		Choices []struct {
			Message struct {
				Role    string `json:"role"`
				Content string `json:"content"`
			} `json:"message"`
		} `json:"choices"`
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
		} `json:"usage"`
	}
	postJSON(t, e.URL()+"/v1/chat/completions", `{"messages":`+messages+`,"max_tokens":3}`, &plain)
	var msgs []tokenize.Message
	json.Unmarshal([]byte(messages), &msgs)
	text, _ := e.Tokenizer().ApplyChatTemplate(msgs, tokenize.ChatOptions{AddGenerationPrompt: true})
	if want := len(e.Tokenizer().Encode(text, false)); plain.Usage.PromptTokens != want || plain.Object != "chat.completion" ||
		plain.Choices[0].Message.Role != "assistant" || len(plain.Choices[0].Message.Content) != 3 {
		t.Fatalf("chat answer %+v, want %d prompt tokens and a 3-token assistant message", plain, want)
	}

	resp, err := http.Post(e.URL()+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"messages":`+messages+`,"max_completion_tokens":3,"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	events := readSSE(t, resp.Body)
	if len(events) != 3+2 {
		t.Fatalf("%d events, want 3 tokens, finish and [DONE]", len(events))
	}
	var content strings.Builder
	for i, ev := range events[:3] {
		var c struct {
			Object  string `json:"object"`
			Choices []struct {
				Delta struct {
					Role    string `json:"role"`
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(ev.data), &c); err != nil || c.Object != "chat.completion.chunk" {
			t.Fatalf("chunk %d %q: %v", i, ev.data, err)
		}
		if (c.Choices[0].Delta.Role == "assistant") != (i == 0) {
			t.Fatalf("chunk %d role %q: only the first chunk names the role", i, c.Choices[0].Delta.Role)
		}
		content.WriteString(c.Choices[0].Delta.Content)
	}
	if content.String() != plain.Choices[0].Message.Content {
		t.Fatalf("streamed %q, non-streamed %q", content.String(), plain.Choices[0].Message.Content)
	}
}

func TestTokenizeAndDetokenize(t *testing.T) {
	e := startEngine(t, testConfig())
	var tk tokenizeResponse
	postJSON(t, e.URL()+"/tokenize", `{"prompt":"hi"}`, &tk)
	if tk.Count != 3 || tk.MaxModelLen != DefaultConfig().MaxModelLen || tk.Tokens[0] != tokenize.BuiltinBOS {
		t.Fatalf("tokenize prompt = %+v, want BOS + 2 bytes and max_model_len", tk)
	}
	postJSON(t, e.URL()+"/tokenize", `{"messages":[{"role":"user","content":"hi"}],"add_generation_prompt":false,
		"tools":[{"type":"function","function":{"name":"f"}}],"chat_template_kwargs":{"enable_thinking":false},"return_token_strs":true}`, &tk)
	text, err := e.Tokenizer().ApplyChatTemplate([]tokenize.Message{{Role: "user", Content: "hi"}},
		tokenize.ChatOptions{Tools: []tokenize.Tool{{Type: "function", Function: tokenize.FunctionDef{Name: "f"}}}})
	if err != nil {
		t.Fatal(err)
	}
	if want := e.Tokenizer().Encode(text, false); tk.Count != len(want) || len(tk.TokenStrs) != len(want) || tk.TokenStrs[0] != "<|im_start|>" {
		t.Fatalf("tokenize messages count %d strs %d, want %d tokens starting <|im_start|>", tk.Count, len(tk.TokenStrs), len(want))
	}
	var de struct {
		Prompt string `json:"prompt"`
	}
	postJSON(t, e.URL()+"/detokenize", `{"tokens":`+tokensJSON(tk.Tokens)+`}`, &de)
	if de.Prompt != text {
		t.Fatalf("detokenize = %q, want %q", de.Prompt, text)
	}
}

func TestHTTPErrors(t *testing.T) {
	e := startEngine(t, testConfig())
	tests := []struct {
		name, path, body string
		status           int
	}{
		{"unknown model", "/v1/completions", `{"model":"other","prompt":"x"}`, 404},
		{"no prompt", "/v1/completions", `{"max_tokens":1}`, 400},
		{"batched prompts", "/v1/completions", `{"prompt":["a","b"]}`, 400},
		{"negative token", "/v1/completions", `{"prompt":[1,-2]}`, 400},
		{"out of vocabulary", "/v1/completions", `{"prompt":[1,5000]}`, 400},
		{"n=2", "/v1/completions", `{"prompt":"x","n":2}`, 400},
		{"too long", "/v1/completions", `{"prompt":"x","max_tokens":200000}`, 400},
		{"more blocks than the cache", "/v1/completions", `{"prompt":"x","max_tokens":1000}`, 400},
		{"not json", "/v1/chat/completions", `{`, 400},
		{"no messages", "/v1/chat/completions", `{"messages":[]}`, 400},
		{"image content", "/v1/chat/completions", `{"messages":[{"role":"user","content":[{"type":"image_url"}]}]}`, 400},
		{"tokenize nothing", "/tokenize", `{}`, 400},
		{"detokenize out of vocabulary", "/detokenize", `{"tokens":[99999]}`, 400},
		{"bad faults", "/admin/faults", `{"fail_rate":2}`, 400},
		{"bad hang", "/admin/faults", `{"hang_before_first_token":"soon"}`, 400},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var ans completionAnswer
			resp := postJSON(t, e.URL()+tt.path, tt.body, &ans)
			if resp.StatusCode != tt.status || ans.Error == nil || ans.Error.Code != tt.status || ans.Error.Message == "" {
				t.Fatalf("status %d error %+v, want %d with a message", resp.StatusCode, ans.Error, tt.status)
			}
		})
	}
}

func TestModelsLists(t *testing.T) {
	cfg := testConfig()
	cfg.LoRAModules = []string{"sql"}
	e := startEngine(t, cfg)
	resp, err := http.Get(e.URL() + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var list modelList
	json.NewDecoder(resp.Body).Decode(&list)
	if len(list.Data) != 2 || list.Data[0].ID != cfg.Model || list.Data[1].ID != "sql" || *list.Data[1].Parent != cfg.Model {
		t.Fatalf("models = %+v", list)
	}
	if h, err := http.Get(e.URL() + "/health"); err != nil || h.StatusCode != 200 {
		t.Fatalf("health: %v", err)
	}
}

func TestMetricsParseAsPrometheusText(t *testing.T) {
	e := startEngine(t, testConfig())
	var a1, a2 completionAnswer
	postJSON(t, e.URL()+"/v1/completions", `{"prompt":`+tokensJSON(seqPrompt(0, 10))+`,"max_tokens":2}`, &a1)
	postJSON(t, e.URL()+"/v1/completions", `{"prompt":`+tokensJSON(seqPrompt(0, 10))+`,"max_tokens":2}`, &a2)
	resp, err := http.Get(e.URL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("metrics are not Prometheus text: %v", err)
	}
	value := func(name string) float64 {
		f, ok := families[name]
		if !ok || len(f.Metric) != 1 {
			t.Fatalf("metric %s missing or not one series", name)
		}
		m := f.Metric[0]
		switch {
		case m.Gauge != nil:
			return m.Gauge.GetValue()
		case m.Counter != nil:
			return m.Counter.GetValue()
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount())
		}
		t.Fatalf("metric %s has no value", name)
		return 0
	}
	checks := map[string]float64{
		"vllm:num_requests_running":        0,
		"vllm:num_requests_waiting":        0,
		"vllm:prefix_cache_queries_total":  20,
		"vllm:prefix_cache_hits_total":     float64(a2.Usage.PromptTokensDetails.CachedTokens),
		"vllm:generation_tokens_total":     4,
		"vllm:time_to_first_token_seconds": 2,
	}
	for name, want := range checks {
		if got := value(name); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	if hits := value("vllm:prefix_cache_hits_total"); hits != 8 {
		t.Errorf("prefix cache hits %v, want 8", hits)
	}
	if u := value("vllm:kv_cache_usage_perc"); u != 0 {
		t.Errorf("kv_cache_usage_perc = %v with nothing running, want 0", u)
	}
	// The capacity routers need to turn the usage fraction into blocks.
	if value("vllm:cache_config_info") != 1 {
		t.Error("vllm:cache_config_info is not 1")
	}
	labels := map[string]string{}
	for _, lp := range families["vllm:cache_config_info"].Metric[0].GetLabel() {
		labels[lp.GetName()] = lp.GetValue()
	}
	cfg := testConfig()
	if want := map[string]string{"block_size": strconv.Itoa(cfg.BlockSize), "num_gpu_blocks": strconv.Itoa(cfg.NumGPUBlocks), "engine": "0"}; !maps.Equal(labels, want) {
		t.Errorf("cache_config_info labels %v, want %v", labels, want)
	}
}

func TestResetPrefixCacheRefusesWhileBusy(t *testing.T) {
	cfg := testConfig()
	cfg.TimeScale = 1 // the long request below stays in flight until closed
	e := startEngine(t, cfg)
	if _, err := e.Generate(context.Background(), Request{Prompt: seqPrompt(0, 9), MaxTokens: 1}); err != nil {
		t.Fatal(err)
	}
	s, err := e.Submit(Request{Prompt: seqPrompt(50, 9), MaxTokens: 200})
	if err != nil {
		t.Fatal(err)
	}
	if resp := postJSON(t, e.URL()+"/reset_prefix_cache", ``, nil); resp.StatusCode != http.StatusConflict {
		t.Fatalf("reset while busy: status %d, want 409", resp.StatusCode)
	}
	s.Close()
	for {
		if _, err := s.Next(context.Background()); err != nil {
			if !errors.Is(err, ErrAborted) {
				t.Fatalf("closed stream ended with %v, want ErrAborted", err)
			}
			break
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp := postJSON(t, e.URL()+"/reset_prefix_cache", ``, nil)
		if resp.StatusCode == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("reset still refused (%d) after the request was aborted", resp.StatusCode)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n := len(e.CacheTruth().Ranks[0].Blocks); n != 0 {
		t.Fatalf("%d blocks cached after reset, want 0", n)
	}
}

func TestInjectedFailuresAndHangs(t *testing.T) {
	e := startEngine(t, testConfig())
	var f Faults
	if resp := postJSON(t, e.URL()+"/admin/faults", `{"fail_rate":0.5,"fail_status":429}`, &f); resp.StatusCode != 200 || f.FailRate != 0.5 || f.FailStatus != 429 {
		t.Fatalf("set faults: %d %+v", resp.StatusCode, f)
	}
	var statuses []int
	for range 4 {
		statuses = append(statuses, postJSON(t, e.URL()+"/v1/completions", `{"prompt":"x","max_tokens":1}`, nil).StatusCode)
	}
	if want := []int{200, 429, 200, 429}; !slices.Equal(statuses, want) || faultCount(t, e, "fail_429") != 2 {
		t.Fatalf("statuses %v, want %v (half of the requests fail, evenly spread)", statuses, want)
	}

	postJSON(t, e.URL()+"/admin/faults", `{"fail_rate":0,"hang_before_first_token":"1h"}`, &f)
	if f.HangBeforeFirstToken != time.Hour || e.Faults().HangBeforeFirstToken != time.Hour {
		t.Fatalf("hang fault not set: %+v", f)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.URL()+"/v1/completions", strings.NewReader(`{"prompt":"hang","max_tokens":1}`))
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	for faultCount(t, e, "hang") < 1 {
		time.Sleep(5 * time.Millisecond)
	}
	if e.ranks[0].active.Load() != 0 {
		t.Fatal("a hanging request reached the scheduler")
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("hanging request ended with %v, want the client's cancellation (no response)", err)
	}
}

func faultCount(t *testing.T, e *Engine, kind string) float64 {
	t.Helper()
	var m dto.Metric
	if err := e.m.faults.WithLabelValues(kind).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

func TestDebugKVBlocksMatchesCacheTruth(t *testing.T) {
	e := startEngine(t, testConfig())
	if _, err := e.Generate(context.Background(), Request{Prompt: seqPrompt(0, 13), MaxTokens: 1}); err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get(e.URL() + "/debug/kv-blocks")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var got Truth
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
		t.Fatal(err)
	}
	want := e.CacheTruth()
	if len(got.Ranks) != 1 || len(got.Ranks[0].Blocks) != 3 || got.Ranks[0].LastSeq != want.Ranks[0].LastSeq {
		t.Fatalf("debug view %+v, want 3 blocks at seq %d", got, want.Ranks[0].LastSeq)
	}
	roots := 0
	for i, b := range got.Ranks[0].Blocks {
		w := want.Ranks[0].Blocks[i]
		if b.Hash != w.Hash || len(b.TokenIDs) != 4 || b.Tiers[0] != "GPU" {
			t.Fatalf("block %d = %+v, want %+v", i, b, w)
		}
		if b.ParentHash == nil {
			roots++
		}
	}
	if roots != 1 {
		t.Fatalf("%d blocks without parent, want the chain's first only", roots)
	}
}
