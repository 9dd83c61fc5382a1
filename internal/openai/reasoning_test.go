package openai

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/internal/tokenize"
	"github.com/kvindex/kvindex/internal/tokenize/tokenizetest"
)

// reasoning_effort renders as in vLLM's build_chat_params: "none" turns Qwen3's
// thinking off exactly as chat_template_kwargs enable_thinking=false does, another
// effort leaves it on, and an enable_thinking of the request's own wins.
func TestReasoningEffortSetsEnableThinkingAsVLLMDoes(t *testing.T) {
	tok, err := tokenize.LoadDir("Qwen/Qwen3-8B", filepath.Join(tokenizetest.Dir(t), "qwen3"), tokenize.Options{})
	if err != nil {
		t.Fatal(err)
	}
	render := func(fields string) string {
		t.Helper()
		var r ChatRequest
		if err := json.Unmarshal([]byte(`{"messages":[{"role":"user","content":"Name a prime."}]`+fields+`}`), &r); err != nil {
			t.Fatal(err)
		}
		text, err := tok.ApplyChatTemplate(r.Messages, r.ChatOptions())
		if err != nil {
			t.Fatal(err)
		}
		return text
	}
	off, on := render(`,"chat_template_kwargs":{"enable_thinking":false}`), render(``)
	if !strings.HasSuffix(off, "<think>\n\n</think>\n\n") || off == on {
		t.Fatalf("enable_thinking=false renders %q, thinking on %q: want the first to close an empty think block", off, on)
	}
	for _, tt := range []struct {
		fields string
		want   string
	}{
		{`,"reasoning_effort":"none"`, off},
		{`,"reasoning_effort":"low"`, on},
		{`,"reasoning_effort":"high","chat_template_kwargs":{"other":1}`, on},
		{`,"reasoning_effort":null`, on},
		{`,"reasoning_effort":"none","chat_template_kwargs":{"enable_thinking":true}`, on},
		{`,"reasoning_effort":"high","chat_template_kwargs":{"enable_thinking":false}`, off},
	} {
		if got := render(tt.fields); got != tt.want {
			t.Errorf("%s renders %q, want %q", tt.fields, got, tt.want)
		}
	}
	// The template sees reasoning_effort itself, over chat_template_kwargs'; the
	// request's map is left as it came.
	r := ChatRequest{ReasoningEffort: new(string), ChatTemplateKwargs: map[string]json.RawMessage{"reasoning_effort": json.RawMessage(`"low"`)}}
	*r.ReasoningEffort = "medium"
	if kw := r.ChatOptions().Kwargs; string(kw["reasoning_effort"]) != `"medium"` || string(kw["enable_thinking"]) != "true" {
		t.Errorf("kwargs %s, want reasoning_effort medium and enable_thinking true", kw)
	}
	if len(r.ChatTemplateKwargs) != 1 || string(r.ChatTemplateKwargs["reasoning_effort"]) != `"low"` {
		t.Errorf("the request's chat_template_kwargs became %s", r.ChatTemplateKwargs)
	}
}
