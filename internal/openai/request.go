package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"strconv"

	"github.com/kvindex/kvindex/internal/tokenize"
)

// ErrBadRequest is wrapped by every error about a request's content; servers answer
// it with 400.
var ErrBadRequest = errors.New("bad request")

func badRequest(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrBadRequest, fmt.Sprintf(format, args...))
}

// StreamOptions is OpenAI's stream_options.
type StreamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// CompletionRequest is the part of a /v1/completions body that decides the prompt.
type CompletionRequest struct {
	Model            string          `json:"model"`
	Prompt           json.RawMessage `json:"prompt"`
	MaxTokens        *LaxInt         `json:"max_tokens"`
	N                *LaxInt         `json:"n"`
	Stream           bool            `json:"stream"`
	StreamOptions    *StreamOptions  `json:"stream_options"`
	AddSpecialTokens *bool           `json:"add_special_tokens"`
	CacheSalt        string          `json:"cache_salt"`
	// KVTransferParams is vLLM's kv_transfer_params, kept raw: its fields belong to
	// the KV connector.
	KVTransferParams json.RawMessage `json:"kv_transfer_params"`
	// PromptEmbeds: the request carries vLLM's prompt_embeds (base64 tensors,
	// prompts of their own, served before the text prompt if there is one). Their
	// tokens and block hashes are not computable from the text; PromptTokens
	// ignores them.
	PromptEmbeds Present `json:"prompt_embeds"`
}

// Present records whether a member holds a value other than null, without
// keeping (or copying) the value.
type Present bool

func (p *Present) UnmarshalJSON(data []byte) error {
	*p = string(data) != "null"
	return nil
}

// ChatRequest is the part of a /v1/chat/completions body that decides the prompt.
type ChatRequest struct {
	Model                string                     `json:"model"`
	Messages             []tokenize.Message         `json:"messages"`
	MaxTokens            *LaxInt                    `json:"max_tokens"`
	MaxCompletionTokens  *LaxInt                    `json:"max_completion_tokens"`
	N                    *LaxInt                    `json:"n"`
	Stream               bool                       `json:"stream"`
	StreamOptions        *StreamOptions             `json:"stream_options"`
	Tools                []tokenize.Tool            `json:"tools"`
	AddGenerationPrompt  *bool                      `json:"add_generation_prompt"`
	ContinueFinalMessage bool                       `json:"continue_final_message"`
	AddSpecialTokens     bool                       `json:"add_special_tokens"`
	ChatTemplateKwargs   map[string]json.RawMessage `json:"chat_template_kwargs"`
	ReasoningEffort      *string                    `json:"reasoning_effort"`
	CacheSalt            string                     `json:"cache_salt"`
	KVTransferParams     json.RawMessage            `json:"kv_transfer_params"`
}

// CheckN refuses n other than 1: one request, one generation.
func CheckN(n *LaxInt) error {
	if n != nil && *n != 1 {
		return badRequest("n=%d is not supported; only n=1", *n)
	}
	return nil
}

// PromptTokens is the prompt as vLLM tokenizes it: a string (with special tokens
// unless add_special_tokens is false), a list of token ids, or a one-element list
// of either. Batches of several prompts, and lists nested deeper, are refused.
func (r *CompletionRequest) PromptTokens(tok tokenize.Tokenizer) ([]uint32, error) {
	return promptTokens(r.Prompt, tok, r.AddSpecialTokens == nil || *r.AddSpecialTokens)
}

// OutputTokens is the requested completion length; 0 when the request leaves it
// to the engine.
func (r *CompletionRequest) OutputTokens() int { return positive(r.MaxTokens) }

// ChatOptions are the chat template inputs of the request besides its messages.
//
// A reasoning_effort reaches the template as vLLM's build_chat_params
// (vllm/entrypoints/openai/chat_completion/protocol.py) passes it: as the
// template variable reasoning_effort, over chat_template_kwargs' own, and as
// enable_thinking = reasoning_effort != "none" unless chat_template_kwargs sets
// enable_thinking. Qwen3's template then closes an empty think block for "none",
// as enable_thinking=false does. The request's own map is never changed.
func (r *ChatRequest) ChatOptions() tokenize.ChatOptions {
	kwargs := r.ChatTemplateKwargs
	if r.ReasoningEffort != nil {
		kwargs = make(map[string]json.RawMessage, len(r.ChatTemplateKwargs)+2)
		maps.Copy(kwargs, r.ChatTemplateKwargs)
		effort, _ := json.Marshal(*r.ReasoningEffort) // a string always marshals
		kwargs["reasoning_effort"] = effort
		if _, set := r.ChatTemplateKwargs["enable_thinking"]; !set {
			kwargs["enable_thinking"] = json.RawMessage(strconv.FormatBool(*r.ReasoningEffort != "none"))
		}
	}
	return tokenize.ChatOptions{
		AddGenerationPrompt:  r.AddGenerationPrompt == nil || *r.AddGenerationPrompt,
		ContinueFinalMessage: r.ContinueFinalMessage,
		Tools:                r.Tools,
		Kwargs:               kwargs,
	}
}

// MediaPart is the type of the first content part of the messages that is not
// text (image_url, input_audio, ...; see tokenize.Message.Media), or "" when
// every part is text. A request with media has no prompt tokens here: the
// engine's multimodal processor builds its prompt, and PromptTokens refuses it.
func (r *ChatRequest) MediaPart() string {
	for _, m := range r.Messages {
		if len(m.Media) > 0 {
			return m.Media[0]
		}
	}
	return ""
}

// PromptTokens renders the messages with the model's chat template and encodes
// the text as vLLM does for chat (special tokens only with add_special_tokens).
func (r *ChatRequest) PromptTokens(tok tokenize.Tokenizer) ([]uint32, error) {
	if len(r.Messages) == 0 {
		return nil, badRequest("messages must not be empty")
	}
	text, err := tok.ApplyChatTemplate(r.Messages, r.ChatOptions())
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadRequest, err)
	}
	return tok.Encode(text, r.AddSpecialTokens), nil
}

// OutputTokens is max_completion_tokens, else max_tokens; 0 when neither is set.
func (r *ChatRequest) OutputTokens() int {
	if r.MaxCompletionTokens != nil {
		return positive(r.MaxCompletionTokens)
	}
	return positive(r.MaxTokens)
}

func positive(p *LaxInt) int {
	if p == nil || *p < 0 {
		return 0
	}
	return int(*p)
}

// promptShapes names the prompt shapes vLLM's /v1/completions accepts (str,
// list[int], list[str], list[list[int]]); the list ones must hold one prompt here.
const promptShapes = "prompt must be a string, a list of token ids, or a list of one of those"

// errTooDeep follows the field of a list found where a token id must be.
const errTooDeep = "is a list: prompts nested deeper than a list of token-id lists are not supported"

// promptTokens reads the prompt in time linear in its length and with memory
// bounded by a small multiple of it: the shape is picked from the first byte of
// each of at most two list levels (a third is refused, not descended into), and
// token ids are parsed straight into one slice sized by the body, with no
// allocation per id and no other allocation (json.Valid's pooled scanner is
// used only to tell a batch from invalid JSON in an error).
func promptTokens(raw json.RawMessage, tok tokenize.Tokenizer, addSpecial bool) ([]uint32, error) {
	raw = bytes.Trim(raw, jsonSpace)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, badRequest("prompt is required")
	}
	switch raw[0] {
	case '"':
		return encodeText(raw, tok, addSpecial)
	case '[':
	default:
		return nil, badRequest(promptShapes)
	}
	i := skipSpace(raw, 1)
	if i == len(raw) {
		return nil, badRequest("prompt is not valid JSON")
	}
	switch raw[i] {
	case ']':
		if i != len(raw)-1 {
			return nil, badRequest("prompt is not valid JSON")
		}
		return nil, badRequest("prompt must not be empty")
	case '"':
		// A list of text prompts, which must hold one.
		end := stringEnd(raw, i)
		if err := onlyElement(raw, end); err != nil {
			return nil, err
		}
		return encodeText(raw[i:end], tok, addSpecial)
	case '[':
		// A list of token-id prompts, which must hold one.
		if j := skipSpace(raw, i+1); j < len(raw) && raw[j] == '[' {
			return nil, badRequest("prompt[0][0] %s", errTooDeep)
		}
		ids, n, err := tokenIDs(raw[i:], "prompt[0]")
		if err != nil {
			return nil, err
		}
		if err := onlyElement(raw, i+n); err != nil {
			return nil, err
		}
		return ids, nil
	}
	ids, end, err := tokenIDs(raw, "prompt")
	if err == nil && end != len(raw) {
		return nil, badRequest("prompt is not valid JSON")
	}
	return ids, err
}

// stringEnd is the index just past the JSON string that begins at raw[i], or
// len(raw) when it does not end.
func stringEnd(raw []byte, i int) int {
	for i++; i < len(raw); i++ {
		switch raw[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return len(raw)
}

// onlyElement checks that the list raw ends right after its first element, which
// ends at end: a comma there is a batch of prompts.
func onlyElement(raw []byte, end int) error {
	switch j := skipSpace(raw, end); {
	case j == len(raw)-1 && raw[j] == ']':
		return nil
	case j < len(raw) && raw[j] == ',' && json.Valid(raw):
		return badRequest("batched prompts are not supported; send one prompt per request")
	}
	return badRequest("prompt is not valid JSON")
}

// encodeText tokenizes a JSON string.
func encodeText(raw []byte, tok tokenize.Tokenizer, addSpecial bool) ([]uint32, error) {
	var text string
	if err := json.Unmarshal(raw, &text); err != nil {
		return nil, badRequest("prompt is not valid JSON")
	}
	return tok.Encode(text, addSpecial), nil
}

// tokenIDs parses the JSON array of token ids (integers from 0 to MaxUint32) at
// the start of raw, which begins with '[', and returns them with the index just
// past the array; field names it in errors. It checks the array's syntax itself,
// so an invalid one is refused where it goes wrong, and allocates the result
// once: an id takes at least two bytes of the array ("0,"), which bounds the
// count.
func tokenIDs(raw []byte, field string) ([]uint32, int, error) {
	ids := make([]uint32, 0, min(bytes.Count(raw, []byte{','})+1, len(raw)/2))
	for i := 1; ; { // past '['
		i = skipSpace(raw, i)
		if i < len(raw) && raw[i] == ']' && len(ids) == 0 {
			return nil, 0, badRequest("%s must not be empty", field)
		}
		start := i
		var v uint64
		for i < len(raw) && raw[i] >= '0' && raw[i] <= '9' && v <= math.MaxUint32 && (i == start || raw[start] != '0') {
			v = 10*v + uint64(raw[i]-'0')
			i++
		}
		if i == start || v > math.MaxUint32 || i < len(raw) && bytes.IndexByte([]byte("0123456789.eE"), raw[i]) >= 0 {
			return nil, 0, notTokenID(raw, start, field, len(ids))
		}
		ids = append(ids, uint32(v))
		switch i = skipSpace(raw, i); {
		case i < len(raw) && raw[i] == ',':
			i++
		case i < len(raw) && raw[i] == ']':
			return ids, i + 1, nil
		default:
			return nil, 0, badRequest("prompt is not valid JSON")
		}
	}
}

// notTokenID is the error for the element of field at index n, which begins at
// raw[start]. It shows at most the element's first 32 bytes, so it costs nothing
// like the element's size.
func notTokenID(raw []byte, start int, field string, n int) error {
	if start == len(raw) || raw[start] == ',' || raw[start] == ']' {
		return badRequest("prompt is not valid JSON")
	}
	if raw[start] == '[' {
		return badRequest("%s[%d] %s", field, n, errTooDeep)
	}
	// The element ends at a comma or bracket outside strings and nested values.
	end, depth, inString, escaped := start, 0, false, false
	for ; end < len(raw) && end-start <= 32; end++ {
		c := raw[end]
		switch {
		case escaped:
			escaped = false
		case inString:
			escaped, inString = c == '\\', c != '"'
		case c == '"':
			inString = true
		case c == '{' || c == '[':
			depth++
		case (c == '}' || c == ']') && depth > 0:
			depth--
		case (c == ',' || c == ']') && depth == 0:
			return badRequest("%s[%d] = %s is not a token id (an integer from 0 to %d)", field, n, bytes.Trim(raw[start:end], jsonSpace), uint32(math.MaxUint32))
		}
	}
	return badRequest("%s[%d] = %s... is not a token id (an integer from 0 to %d)", field, n, raw[start:start+min(32, len(raw)-start)], uint32(math.MaxUint32))
}

// jsonSpace is JSON's whitespace.
const jsonSpace = " \t\n\r"

// skipSpace returns the index of the first byte of raw at or after i that is not
// JSON whitespace.
func skipSpace(raw []byte, i int) int {
	for i < len(raw) && (raw[i] == ' ' || raw[i] == '\t' || raw[i] == '\n' || raw[i] == '\r') {
		i++
	}
	return i
}
