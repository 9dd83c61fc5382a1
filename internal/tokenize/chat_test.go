package tokenize

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// chatCase is one entry of testdata/chat/cases.json: the fields of an OpenAI chat
// request that shape the prompt.
type chatCase struct {
	Name                 string                     `json:"name"`
	Messages             json.RawMessage            `json:"messages"`
	Tools                json.RawMessage            `json:"tools"`
	AddGenerationPrompt  bool                       `json:"add_generation_prompt"`
	ContinueFinalMessage bool                       `json:"continue_final_message"`
	ChatTemplateKwargs   map[string]json.RawMessage `json:"chat_template_kwargs"`
}

func readChatCases(t testing.TB) []chatCase {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", "chat", "cases.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cases []chatCase
	if err := json.Unmarshal(data, &cases); err != nil {
		t.Fatal(err)
	}
	return cases
}

// request decodes a case as a server decodes the request body.
func (c chatCase) request(t testing.TB) ([]Message, ChatOptions) {
	t.Helper()
	var msgs []Message
	if err := json.Unmarshal(c.Messages, &msgs); err != nil {
		t.Fatalf("%s: messages: %v", c.Name, err)
	}
	opts := ChatOptions{AddGenerationPrompt: c.AddGenerationPrompt, ContinueFinalMessage: c.ContinueFinalMessage, Kwargs: c.ChatTemplateKwargs}
	if len(c.Tools) > 0 {
		if err := json.Unmarshal(c.Tools, &opts.Tools); err != nil {
			t.Fatalf("%s: tools: %v", c.Name, err)
		}
	}
	return msgs, opts
}

// testTemplates are the templates written for the tests (testdata/chat/<name>.jinja),
// rendered with Llama 3's special tokens.
var testTemplates = []string{"features", "parts", "pyvalues", "whitespace"}

// chatTemplateTokenizer returns the tokenizer whose template a golden file was rendered
// with: Qwen3's and Llama 3's own, or a test template with Llama 3's special tokens.
func chatTemplateTokenizer(t testing.TB, template string) *HFTokenizer {
	t.Helper()
	if !slices.Contains(testTemplates, template) {
		return variantTokenizer(t, template)
	}
	src, err := os.ReadFile(filepath.Join("testdata", "chat", template+".jinja"))
	if err != nil {
		t.Fatal(err)
	}
	tok, err := variantTokenizer(t, "llama3").WithChatTemplate(string(src))
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// knownChatDeviations are the (template, case) pairs where the Go renderer is known to
// differ from Jinja2, with the reason. The test checks that each still differs as
// described, so the list cannot go stale.
var knownChatDeviations = map[string]string{
	// Jinja2 raises when an attribute of an undefined value is read (messages[0].role
	// with no messages); ardanlabs/jinja yields undefined and renders on. vLLM answers
	// such a request with an error, so a prompt rendered for it is never cached by an
	// engine and scoring it is harmless.
	"qwen3/empty_messages": "renders where Jinja2 raises",
}

func TestChatTemplatesMatchJinja2(t *testing.T) {
	cases := readChatCases(t)
	if len(cases) < 20 {
		t.Fatalf("%d chat cases, want >= 20", len(cases))
	}
	for _, template := range append([]string{"qwen3", "llama3"}, testTemplates...) {
		t.Run(template, func(t *testing.T) {
			tok := chatTemplateTokenizer(t, template)
			data, err := os.ReadFile(filepath.Join("testdata", "chat", "golden_"+template+".json"))
			if err != nil {
				t.Fatal(err)
			}
			var golden struct {
				ContentFormat ContentFormat `json:"content_format"`
				Cases         map[string]struct {
					Prompt *string `json:"prompt"`
					Error  *string `json:"error"`
				} `json:"cases"`
			}
			if err := json.Unmarshal(data, &golden); err != nil {
				t.Fatal(err)
			}
			if got := tok.chat.templates["default"].format; got != golden.ContentFormat {
				t.Errorf("content format %q, the generator's (vLLM's rules on Jinja2's syntax tree) %q", got, golden.ContentFormat)
			}
			for _, c := range cases {
				want, ok := golden.Cases[c.Name]
				if !ok {
					t.Fatalf("case %s missing from golden_%s.json (regenerate with testdata/gen/chat.py)", c.Name, template)
				}
				msgs, opts := c.request(t)
				got, err := tok.ApplyChatTemplate(msgs, opts)
				if _, known := knownChatDeviations[template+"/"+c.Name]; known {
					if want.Error == nil || err != nil {
						t.Errorf("%s: known deviation no longer holds (Go error %v, Jinja2 error %v): update knownChatDeviations", c.Name, err, want.Error)
					}
					continue
				}
				switch {
				case want.Error != nil && err == nil:
					t.Errorf("%s: rendered %q, Jinja2 failed with %s", c.Name, got, *want.Error)
				case want.Error != nil && !errors.Is(err, ErrInvalidMessages):
					t.Errorf("%s: error %v does not wrap ErrInvalidMessages", c.Name, err)
				case want.Prompt != nil && err != nil:
					t.Errorf("%s: error %v, Jinja2 rendered %q", c.Name, err, *want.Prompt)
				case want.Prompt != nil && got != *want.Prompt:
					t.Errorf("%s: rendered\n%s\nJinja2 rendered\n%s", c.Name, got, *want.Prompt)
				}
			}
		})
	}
}

func TestChatTemplateRejectsContradictoryOptions(t *testing.T) {
	tok := variantTokenizer(t, "qwen3")
	msgs := []Message{{Role: "user", Content: "x"}, {Role: "assistant", Content: "y"}}
	_, err := tok.ApplyChatTemplate(msgs, ChatOptions{AddGenerationPrompt: true, ContinueFinalMessage: true})
	if !errors.Is(err, ErrInvalidMessages) {
		t.Fatalf("error = %v, want ErrInvalidMessages", err)
	}
	if _, err = tok.ApplyChatTemplate(nil, ChatOptions{ContinueFinalMessage: true}); !errors.Is(err, ErrInvalidMessages) {
		t.Fatalf("continue_final_message without messages: error = %v, want ErrInvalidMessages", err)
	}
}

func TestTokenizerWithoutChatTemplateRefusesChat(t *testing.T) {
	tok, err := newTiny(t, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tok.ApplyChatTemplate([]Message{{Role: "user", Content: "hi"}}, ChatOptions{}); !errors.Is(err, ErrNotSupported) {
		t.Fatalf("error = %v, want ErrNotSupported", err)
	}
	if _, err := tok.WithChatTemplate("{% for %}"); !errors.Is(err, ErrNotSupported) {
		t.Fatalf("WithChatTemplate(bad source) error = %v, want ErrNotSupported", err)
	}
	withTemplate, err := tok.WithChatTemplate("{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}")
	if err != nil {
		t.Fatal(err)
	}
	if got, err := withTemplate.ApplyChatTemplate([]Message{{Role: "user", Content: "hi"}}, ChatOptions{}); err != nil || got != "user:hi;" {
		t.Fatalf("ApplyChatTemplate = %q, %v; want user:hi;", got, err)
	}
}

// rewriteTemplate reroutes output, filters, str methods and dict() to pybuiltins.go
// and touches nothing else: not text, comments, raw blocks or string literals.
func TestRewriteTemplate(t *testing.T) {
	tests := []struct{ in, want string }{
		{"{{ x | tojson }}", "{{ kvindex_str(x | kvindex_tojson) }}"},
		{"{{x|tojson(indent=2)}}", "{{kvindex_str(x|kvindex_tojson(indent=2))}}"},
		{"{%- set y = x|tojson -%}", "{%- set y = x|kvindex_tojson -%}"},
		{"text | tojson {{ 'a|tojson' }}", "text | tojson {{ kvindex_str('a|tojson') }}"},
		{"{# x | tojson #}{{- \"|tojson\" | tojson -}}", "{# x | tojson #}{{- kvindex_str(\"|tojson\" | kvindex_tojson) -}}"},
		{"{% if x | tojsonish %}{% endif %}{{ tojson(x) }}", "{% if x | tojsonish %}{% endif %}{{ kvindex_str(tojson(x)) }}"},
		{"{ not a tag | tojson }", "{ not a tag | tojson }"},
		{"{% raw %}{{ x | tojson }}{% endraw %}{% set y = z|trim %}", "{% raw %}{{ x | tojson }}{% endraw %}{% set y = z|kvindex_trim %}"},
		{"{% filter trim %}x{% endfilter %}", "{% filter kvindex_trim %}x{% endfilter %}"},
		{"{% set s = x | string ~ y|string(z) %}", "{% set s = x | kvindex_string ~ y|kvindex_string(z) %}"},
		{"{{ {'a': x|tojson} }}", "{{ kvindex_str({'a': x|kvindex_tojson}) }}"},
		{"{% set c = m.content.strip() %}", "{% set c = kvindex_strip(m.content) %}"},
		{"{% set c = m['content'].split('</think>')[-1].lstrip('\\n') %}", "{% set c = kvindex_lstrip(m['content'].split('</think>')[-1], '\\n') %}"},
		{"{% set c = (a ~ b).strip().rstrip(x.strip()) %}", "{% set c = kvindex_rstrip(kvindex_strip((a ~ b)), kvindex_strip(x)) %}"},
		{"{% set c = not 'a' 'b'.strip() %}", "{% set c = not kvindex_strip('a' 'b') %}"},
		{"{% set c = x.strip %}{% set d = strip(x) %}", "{% set c = x.strip %}{% set d = strip(x) %}"},
		{"{{ x.strip().lstrip() }}", "{{ kvindex_str(kvindex_lstrip(kvindex_strip(x))) }}"},
		{"{% set d = dict(b=1, a=[1, 2]) %}", "{% set d = dict(b=1, a=[1, 2], kvindex_order=['b', 'a']) %}"},
		{"{% set d = dict(m, z=f(x, y=1),) %}", "{% set d = dict(m, z=f(x, y=1),kvindex_order=['z']) %}"},
		{"{{ dict(a=x|tojson) }}", "{{ kvindex_str(dict(a=x|kvindex_tojson, kvindex_order=['a'])) }}"},
		{"{% set d = dict(m) %}{% set e = dict(**kw) %}{% set f = x.dict(a=1) %}", "{% set d = dict(m) %}{% set e = dict(**kw) %}{% set f = x.dict(a=1) %}"},
	}
	for _, tt := range tests {
		tags, err := scanTags(tt.in)
		if err != nil {
			t.Fatalf("scanTags(%q): %v", tt.in, err)
		}
		if got := rewriteTemplate(tt.in, tags); got != tt.want {
			t.Errorf("rewriteTemplate(%q)\n = %q\nwant %q", tt.in, got, tt.want)
		}
	}
}

// Sources Jinja2's lexer refuses are refused.
func TestScanTagsRefusesWhatJinja2Refuses(t *testing.T) {
	for _, src := range []string{"{{ x ", "{% if x %", "{# note", "{% raw %}x", "{{ (x }}", "{{ x] }}", "{{ 'open }}", "{{ x ! y }}"} {
		if _, err := scanTags(src); err == nil {
			t.Errorf("scanTags(%q) accepted it", src)
		}
	}
}

func TestPythonFloatRepr(t *testing.T) {
	tests := []struct {
		f    float64
		want string
	}{
		{0, "0.0"}, {1, "1.0"}, {-2.5, "-2.5"}, {0.1, "0.1"}, {1e-4, "0.0001"}, {1e-5, "1e-05"},
		{1.5e-7, "1.5e-07"}, {1e15, "1000000000000000.0"}, {1e16, "1e+16"}, {1.2345e17, "1.2345e+17"},
		{123456.789, "123456.789"}, {1e300, "1e+300"}, {2.5e-300, "2.5e-300"}, {1.0 / 3, "0.3333333333333333"},
	}
	for _, tt := range tests {
		if got := pyFloatRepr(tt.f); got != tt.want {
			t.Errorf("pyFloatRepr(%v) = %q, want %q", tt.f, got, tt.want)
		}
	}
	if got := pyFloatRepr(-0.0 * 1); !strings.HasSuffix(got, "0.0") {
		t.Errorf("pyFloatRepr(0) = %q", got)
	}
}

// TestReasoningContentIsReasoning: clients replaying DeepSeek or Qwen responses
// send an assistant's reasoning as reasoning_content; it must render exactly as
// vLLM's reasoning field does (here in a Qwen3 tool-call conversation, where the
// template shows the reasoning of the turn after the last user message).
func TestReasoningContentIsReasoning(t *testing.T) {
	conversation := func(field string) string {
		return `[{"role":"user","content":"Weather in Paris?"},
			{"role":"assistant","content":"","` + field + `":"The user wants the weather; call the tool.",
			 "tool_calls":[{"id":"c1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},
			{"role":"tool","tool_call_id":"c1","content":"18C, sunny"}]`
	}
	tok := chatTemplateTokenizer(t, "qwen3")
	render := func(field string) string {
		var msgs []Message
		if err := json.Unmarshal([]byte(conversation(field)), &msgs); err != nil {
			t.Fatalf("%s: %v", field, err)
		}
		got, err := tok.ApplyChatTemplate(msgs, ChatOptions{AddGenerationPrompt: true})
		if err != nil {
			t.Fatalf("%s: %v", field, err)
		}
		return got
	}
	viaReasoning, viaContent := render("reasoning"), render("reasoning_content")
	if !strings.Contains(viaReasoning, "<think>\nThe user wants the weather; call the tool.\n</think>") {
		t.Fatalf("the template did not show the reasoning:\n%s", viaReasoning)
	}
	if viaContent != viaReasoning {
		t.Errorf("reasoning_content rendered\n%s\nreasoning rendered\n%s", viaContent, viaReasoning)
	}
	var both Message
	if err := json.Unmarshal([]byte(`{"role":"assistant","content":"x","reasoning":"a","reasoning_content":"b"}`), &both); err != nil {
		t.Fatal(err)
	}
	if both.Reasoning == nil || *both.Reasoning != "a" {
		t.Errorf("with both fields, Reasoning = %v, want reasoning's \"a\"", both.Reasoning)
	}
}
