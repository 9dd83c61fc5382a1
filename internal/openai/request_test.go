package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/internal/tokenize"
)

// Every prompt shape vLLM's /v1/completions accepts (str, list[int], list[str],
// list[list[int]], the lists holding one prompt) is read as vLLM reads it, and
// every other shape is refused with ErrBadRequest (400) and a message naming the
// field at fault.
func TestCompletionPromptTokens(t *testing.T) {
	tok := tokenize.NewBuiltin()
	hi := tok.Encode("hi", true)
	hiPlain := tok.Encode("hi", false)
	no := false
	notID := func(field, v string) string {
		return fmt.Sprintf("%s = %s is not a token id (an integer from 0 to 4294967295)", field, v)
	}
	const tooDeep = "is a list: prompts nested deeper than a list of token-id lists are not supported"
	for _, c := range []struct {
		name   string
		prompt string
		noSpec bool
		want   []uint32
		err    string // the whole message after "bad request: "
	}{
		{name: "text adds special tokens", prompt: `"hi"`, want: hi},
		{name: "add_special_tokens false", prompt: `"hi"`, noSpec: true, want: hiPlain},
		{name: "token ids as given", prompt: `[5, 6, 7]`, want: []uint32{5, 6, 7}},
		{name: "token ids with JSON whitespace", prompt: " \n[ 5 ,\t6\r\n,7 ] ", want: []uint32{5, 6, 7}},
		{name: "smallest and largest id", prompt: `[0, 4294967295]`, want: []uint32{0, math.MaxUint32}},
		{name: "one-element list of ids", prompt: `[[5, 6]]`, want: []uint32{5, 6}},
		{name: "one-element list of ids with whitespace", prompt: `[ [5] ]`, want: []uint32{5}},
		{name: "one-element list of text", prompt: `["hi"]`, want: hi},
		{name: "one-element list of text, add_special_tokens false", prompt: `[ "hi" ]`, noSpec: true, want: hiPlain},
		{name: "missing", prompt: ``, err: "prompt is required"},
		{name: "null", prompt: `null`, err: "prompt is required"},
		{name: "invalid JSON", prompt: `[1, 2`, err: "prompt is not valid JSON"},
		{name: "empty list", prompt: `[]`, err: "prompt must not be empty"},
		{name: "empty inner list", prompt: `[[ ]]`, err: "prompt[0] must not be empty"},
		{name: "batch of text", prompt: `["a", "b"]`, err: "batched prompts are not supported; send one prompt per request"},
		{name: "batch of ids", prompt: `[[1, 2], [3]]`, err: "batched prompts are not supported; send one prompt per request"},
		{name: "batch of mixed", prompt: `["a", 1, [2]]`, err: "batched prompts are not supported; send one prompt per request"},
		{name: "negative id", prompt: `[1, -1]`, err: notID("prompt[1]", "-1")},
		{name: "id too large", prompt: `[4294967296]`, err: notID("prompt[0]", "4294967296")},
		{name: "id far too large", prompt: `[99999999999999999999999]`, err: notID("prompt[0]", "99999999999999999999999")},
		{name: "fractional id", prompt: `[1.0]`, err: notID("prompt[0]", "1.0")},
		{name: "exponent id", prompt: `[7, 1e3]`, err: notID("prompt[1]", "1e3")},
		{name: "text among ids", prompt: `[1, "a"]`, err: notID("prompt[1]", `"a"`)},
		{name: "null among ids", prompt: `[1, null]`, err: notID("prompt[1]", "null")},
		{name: "long element cut short", prompt: `[{"k": "` + strings.Repeat("x", 40) + `"}]`, err: notID("prompt[0]", `{"k": "`+strings.Repeat("x", 25)+"...")},
		{name: "bad id in the inner list", prompt: `[[5, true]]`, err: notID("prompt[0][1]", "true")},
		{name: "text in the inner list", prompt: `[["hi"]]`, err: notID("prompt[0][0]", `"hi"`)},
		{name: "list among ids", prompt: `[1, [2]]`, err: "prompt[1] " + tooDeep},
		{name: "three levels", prompt: `[[[1]]]`, err: "prompt[0][0] " + tooDeep},
		{name: "three levels of text", prompt: `[[["hi"]]]`, err: "prompt[0][0] " + tooDeep},
		{name: "three levels after ids", prompt: `[[1, [2]]]`, err: "prompt[0][1] " + tooDeep},
		{name: "object", prompt: `{"a": 1}`, err: "prompt must be a string, a list of token ids, or a list of one of those"},
		{name: "number", prompt: `5`, err: "prompt must be a string, a list of token ids, or a list of one of those"},
		{name: "boolean", prompt: `true`, err: "prompt must be a string, a list of token ids, or a list of one of those"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := CompletionRequest{Prompt: json.RawMessage(c.prompt)}
			if c.noSpec {
				r.AddSpecialTokens = &no
			}
			got, err := r.PromptTokens(tok)
			if c.err != "" {
				if !errors.Is(err, ErrBadRequest) || err.Error() != "bad request: "+c.err {
					t.Fatalf("PromptTokens(%s) = %v, %v; want ErrBadRequest %q", c.prompt, got, err, c.err)
				}
				return
			}
			if err != nil || !slices.Equal(got, c.want) {
				t.Fatalf("PromptTokens(%s) = %v, %v; want %v", c.prompt, got, err, c.want)
			}
		})
	}
}

// allocated is how many bytes f allocates (the heap's running total, which does
// not depend on when the collector runs).
func allocated(f func()) uint64 {
	var a, b runtime.MemStats
	runtime.ReadMemStats(&a)
	f()
	runtime.ReadMemStats(&b)
	return b.TotalAlloc - a.TotalAlloc
}

// A prompt nested thousands of lists deep is refused, naming the first level too
// deep, after work linear in its length: the refusal allocates less than the body
// (a parser descending level by level copies the rest at each: quadratic).
func TestDeeplyNestedPromptIsRefusedCheaply(t *testing.T) {
	tok := tokenize.NewBuiltin()
	const depth = 9000
	raw := []byte(strings.Repeat("[", depth) + "1" + strings.Repeat("]", depth))
	var err error
	n := allocated(func() { _, err = (&CompletionRequest{Prompt: raw}).PromptTokens(tok) })
	want := "bad request: prompt[0][0] is a list: prompts nested deeper than a list of token-id lists are not supported"
	if !errors.Is(err, ErrBadRequest) || err.Error() != want {
		t.Fatalf("a prompt nested %d deep: %v, want %q", depth, err, want)
	}
	if n > uint64(len(raw)) {
		t.Fatalf("refusing an %d-byte prompt nested %d deep allocated %d bytes, want at most the body's size", len(raw), depth, n)
	}
}

// Token-id prompts are parsed into one slice allocated once, whatever their
// length, and of at most twice the body's size (an id takes at least 2 bytes of
// JSON and 4 of uint32; slack is the allocator's size classes and the test's own
// bookkeeping), at the top level and inside a one-element list.
func TestTokenIDPromptAllocatesOnceWithinTwiceTheBody(t *testing.T) {
	tok := tokenize.NewBuiltin()
	const slack = 64 << 10
	ids := func(n int) string { return "[" + strings.TrimSuffix(strings.Repeat("0,", n), ",") + "]" }
	for _, c := range []struct {
		name string
		raw  string
		n    int
	}{
		{"1k ids", ids(1000), 1000},
		{"4Mi ids (an 8 MiB body)", ids(4 << 20), 4 << 20},
		{"4Mi ids in a one-element list", "[" + ids(4<<20) + "]", 4 << 20},
		{"multi-digit ids", "[" + strings.TrimSuffix(strings.Repeat("4294967295, ", 1<<20), ", ") + "]", 1 << 20},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := CompletionRequest{Prompt: []byte(c.raw)}
			var got []uint32
			var err error
			allocs := testing.AllocsPerRun(2, func() { got, err = r.PromptTokens(tok) })
			if err != nil || len(got) != c.n {
				t.Fatalf("got %d ids, %v; want %d", len(got), err, c.n)
			}
			if allocs != 1 {
				t.Errorf("%v allocations per prompt, want 1 (the id slice)", allocs)
			}
			if n := allocated(func() { got, err = r.PromptTokens(tok) }); n > 2*uint64(len(c.raw))+slack {
				t.Errorf("a %d-byte prompt allocated %d bytes, want at most twice the body", len(c.raw), n)
			}
		})
	}
	// A refused list costs no more: the slice is sized by the body, not by the
	// commas, which a string may hold any number of.
	raw := []byte(`[1, "` + strings.Repeat(",", 1<<20) + `"]`)
	if n := allocated(func() { _, _ = (&CompletionRequest{Prompt: raw}).PromptTokens(tok) }); n > 2*uint64(len(raw))+slack {
		t.Errorf("refusing a %d-byte list of a string of commas allocated %d bytes, want at most twice the body", len(raw), n)
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
	n := LaxInt(2)
	if err := CheckN(&n); !errors.Is(err, ErrBadRequest) {
		t.Errorf("CheckN(2) = %v, want ErrBadRequest", err)
	}
}

// A chat request with an image decodes: MediaPart names the part, PromptTokens
// refuses it (its prompt is the engine's multimodal processor's), and the image's
// data is scanned, never copied, so decoding a body of megabytes allocates
// kilobytes.
func TestChatRequestWithMediaDecodesWithoutCopyingTheMedia(t *testing.T) {
	body := []byte(`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"what is this?"},` +
		`{"type":"image_url","image_url":{"url":"data:image/png;base64,` + strings.Repeat("QUFB", 1<<20) + `"}}]}]}`)
	var r ChatRequest
	var err error
	n := allocated(func() { err = json.Unmarshal(body, &r) })
	if err != nil {
		t.Fatal(err)
	}
	if n > 64<<10 {
		t.Errorf("decoding a %d-byte body with an image allocated %d bytes, want at most 64 KiB", len(body), n)
	}
	if got := r.MediaPart(); got != "image_url" {
		t.Errorf("MediaPart = %q, want image_url", got)
	}
	if r.Messages[0].Content != "what is this?" {
		t.Errorf("content = %q, want the text part", r.Messages[0].Content)
	}
	if _, err := r.PromptTokens(tokenize.NewBuiltin()); !errors.Is(err, ErrBadRequest) {
		t.Errorf("PromptTokens with media: %v, want ErrBadRequest", err)
	}
	text := ChatRequest{Messages: []tokenize.Message{{Role: "user", Content: "hi"}}}
	if got := text.MediaPart(); got != "" {
		t.Errorf("text-only MediaPart = %q, want none", got)
	}
}

// vllmPrompt decodes raw with encoding/json as one of the prompt shapes vLLM's
// /v1/completions accepts, holding one prompt: the fuzz target's oracle.
func vllmPrompt(raw []byte, tok tokenize.Tokenizer) ([]uint32, bool) {
	var text string
	var texts []string
	var flat []uint32
	var nested [][]uint32
	switch {
	case json.Unmarshal(raw, &text) == nil && !bytes.Equal(bytes.TrimSpace(raw), []byte("null")):
		return tok.Encode(text, true), true
	case bytes.Contains(raw, []byte("null")):
		// encoding/json reads a null element as "" or 0; vLLM refuses it.
		return nil, false
	case json.Unmarshal(raw, &texts) == nil && len(texts) == 1:
		return tok.Encode(texts[0], true), true
	case json.Unmarshal(raw, &flat) == nil && len(flat) > 0:
		return flat, true
	case json.Unmarshal(raw, &nested) == nil && len(nested) == 1 && len(nested[0]) > 0:
		return nested[0], true
	}
	return nil, false
}

// FuzzPromptTokens: any bytes give token ids or an ErrBadRequest, never a
// panic; a prompt is accepted exactly when encoding/json reads it as one of
// vLLM's shapes, and read as it reads it.
func FuzzPromptTokens(f *testing.F) {
	for _, s := range []string{`"hi"`, `[1,2,3]`, `[[1,2]]`, `["a"]`, `[]`, `[[]]`, `null`, `[1,"a"]`, `[-1]`, `[1.0]`, `[1e3]`,
		`[4294967296]`, `{"a":1}`, `[["a"],["b"]]`, `[[[1]]]`, `[[["a"]]]`, `[1,[2]]`, `[["a"]]`, ` [ [ 5 , 6 ] ] `, `[1,`, `[[1],[2]]`,
		`["a\"]"]`, `["a", "b"]`, `[null]`} {
		f.Add([]byte(s))
	}
	tok := tokenize.NewBuiltin()
	f.Fuzz(func(t *testing.T, raw []byte) {
		ids, err := (&CompletionRequest{Prompt: raw}).PromptTokens(tok)
		want, ok := vllmPrompt(raw, tok)
		switch {
		case err != nil && !errors.Is(err, ErrBadRequest):
			t.Fatalf("PromptTokens(%q) error %v is not ErrBadRequest", raw, err)
		case err != nil && ok:
			t.Fatalf("PromptTokens(%q) refused a prompt of vLLM's shapes: %v", raw, err)
		case err == nil && !ok:
			t.Fatalf("PromptTokens(%q) accepted %v, which is none of vLLM's prompt shapes", raw, ids)
		case err == nil && !slices.Equal(ids, want):
			t.Fatalf("PromptTokens(%q) = %v, want %v", raw, ids, want)
		}
	})
}
