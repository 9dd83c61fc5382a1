package openai

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/internal/tokenize"
)

func TestCompletionPromptTokens(t *testing.T) {
	tok := tokenize.NewBuiltin()
	hi := tok.Encode("hi", true)
	hiPlain := tok.Encode("hi", false)
	no := false
	for _, c := range []struct {
		name   string
		prompt string
		noSpec bool
		want   []uint32
		err    string
	}{
		{name: "text adds special tokens", prompt: `"hi"`, want: hi},
		{name: "add_special_tokens false", prompt: `"hi"`, noSpec: true, want: hiPlain},
		{name: "token ids as given", prompt: `[5, 6, 7]`, want: []uint32{5, 6, 7}},
		{name: "one-element list of ids", prompt: `[[5, 6]]`, want: []uint32{5, 6}},
		{name: "one-element list of text", prompt: `["hi"]`, want: hi},
		{name: "missing", prompt: ``, err: "prompt is required"},
		{name: "null", prompt: `null`, err: "prompt is required"},
		{name: "empty list", prompt: `[]`, err: "must not be empty"},
		{name: "batch", prompt: `["a", "b"]`, err: "batched prompts (2)"},
		{name: "negative id", prompt: `[1, -1]`, err: "prompt[1] = -1"},
		{name: "id too large", prompt: `[4294967296]`, err: "is not a token id"},
		{name: "object", prompt: `{"a": 1}`, err: "must be a string"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := CompletionRequest{Prompt: json.RawMessage(c.prompt)}
			if c.noSpec {
				r.AddSpecialTokens = &no
			}
			got, err := r.PromptTokens(tok)
			if c.err != "" {
				if !errors.Is(err, ErrBadRequest) || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("PromptTokens(%s) = %v, %v; want ErrBadRequest mentioning %q", c.prompt, got, err, c.err)
				}
				return
			}
			if err != nil || !slices.Equal(got, c.want) {
				t.Fatalf("PromptTokens(%s) = %v, %v; want %v", c.prompt, got, err, c.want)
			}
		})
	}
}

func TestChatPromptTokensRenderTheTemplate(t *testing.T) {
	tok := tokenize.NewBuiltin()
	var r ChatRequest
	if err := json.Unmarshal([]byte(`{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hello"}],"max_completion_tokens":7,"max_tokens":3}`), &r); err != nil {
		t.Fatal(err)
	}
	text, err := tok.ApplyChatTemplate(r.Messages, tokenize.ChatOptions{AddGenerationPrompt: true})
	if err != nil {
		t.Fatal(err)
	}
	got, err := r.PromptTokens(tok)
	if want := tok.Encode(text, false); err != nil || !slices.Equal(got, want) {
		t.Fatalf("chat PromptTokens = %v, %v; want the template rendered and encoded without special tokens %v", got, err, want)
	}
	if r.OutputTokens() != 7 {
		t.Errorf("OutputTokens = %d, want max_completion_tokens 7 over max_tokens 3", r.OutputTokens())
	}
	if _, err := (&ChatRequest{}).PromptTokens(tok); !errors.Is(err, ErrBadRequest) {
		t.Errorf("no messages: %v, want ErrBadRequest", err)
	}
	n := 2
	if err := CheckN(&n); !errors.Is(err, ErrBadRequest) {
		t.Errorf("CheckN(2) = %v, want ErrBadRequest", err)
	}
}

func FuzzPromptTokens(f *testing.F) {
	for _, s := range []string{`"hi"`, `[1,2,3]`, `[[1,2]]`, `["a"]`, `[]`, `null`, `[1,"a"]`, `[-1]`, `[4294967296]`, `{"a":1}`, `[["a"],["b"]]`} {
		f.Add([]byte(s))
	}
	tok := tokenize.NewBuiltin()
	f.Fuzz(func(t *testing.T, raw []byte) {
		r := CompletionRequest{Prompt: raw}
		ids, err := r.PromptTokens(tok)
		if err == nil && ids == nil {
			t.Fatalf("PromptTokens(%q) gave neither ids nor an error", raw)
		}
		if err != nil && !errors.Is(err, ErrBadRequest) {
			t.Fatalf("PromptTokens(%q) error %v is not ErrBadRequest", raw, err)
		}
	})
}
