package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"

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
	MaxTokens        *int            `json:"max_tokens"`
	N                *int            `json:"n"`
	Stream           bool            `json:"stream"`
	StreamOptions    *StreamOptions  `json:"stream_options"`
	AddSpecialTokens *bool           `json:"add_special_tokens"`
	CacheSalt        string          `json:"cache_salt"`
	// KVTransferParams is vLLM's kv_transfer_params, kept raw: its fields belong to
	// the KV connector.
	KVTransferParams json.RawMessage `json:"kv_transfer_params"`
}

// ChatRequest is the part of a /v1/chat/completions body that decides the prompt.
type ChatRequest struct {
	Model                string             `json:"model"`
	Messages             []tokenize.Message `json:"messages"`
	MaxTokens            *int               `json:"max_tokens"`
	MaxCompletionTokens  *int               `json:"max_completion_tokens"`
	N                    *int               `json:"n"`
	Stream               bool               `json:"stream"`
	StreamOptions        *StreamOptions     `json:"stream_options"`
	Tools                []tokenize.Tool    `json:"tools"`
	AddGenerationPrompt  *bool              `json:"add_generation_prompt"`
	ContinueFinalMessage bool               `json:"continue_final_message"`
	AddSpecialTokens     bool               `json:"add_special_tokens"`
	ChatTemplateKwargs   map[string]any     `json:"chat_template_kwargs"`
	CacheSalt            string             `json:"cache_salt"`
	KVTransferParams     json.RawMessage    `json:"kv_transfer_params"`
}

// CheckN refuses n other than 1: one request, one generation.
func CheckN(n *int) error {
	if n != nil && *n != 1 {
		return badRequest("n=%d is not supported; only n=1", *n)
	}
	return nil
}

// PromptTokens is the prompt as vLLM tokenizes it: a string (with special tokens
// unless add_special_tokens is false), a list of token ids, or a one-element list
// of either. Batches of several prompts are refused.
func (r *CompletionRequest) PromptTokens(tok tokenize.Tokenizer) ([]uint32, error) {
	return promptTokens(r.Prompt, tok, r.AddSpecialTokens == nil || *r.AddSpecialTokens)
}

// OutputTokens is the requested completion length; 0 when the request leaves it
// to the engine.
func (r *CompletionRequest) OutputTokens() int { return positive(r.MaxTokens) }

// ChatOptions are the chat template inputs of the request besides its messages.
func (r *ChatRequest) ChatOptions() tokenize.ChatOptions {
	return tokenize.ChatOptions{
		AddGenerationPrompt:  r.AddGenerationPrompt == nil || *r.AddGenerationPrompt,
		ContinueFinalMessage: r.ContinueFinalMessage,
		Tools:                r.Tools,
		Kwargs:               r.ChatTemplateKwargs,
	}
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

func positive(p *int) int {
	if p == nil || *p < 0 {
		return 0
	}
	return *p
}

func promptTokens(raw json.RawMessage, tok tokenize.Tokenizer, addSpecial bool) ([]uint32, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, badRequest("prompt is required")
	}
	var text string
	if err := json.Unmarshal(raw, &text); err == nil {
		return tok.Encode(text, addSpecial), nil
	}
	var list []json.RawMessage
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, badRequest("prompt must be a string, a list of token ids, or a list of one of those")
	}
	if len(list) == 0 {
		return nil, badRequest("prompt must not be empty")
	}
	first := bytes.TrimSpace(list[0])
	if len(first) > 0 && (first[0] == '"' || first[0] == '[') {
		if len(list) > 1 {
			return nil, badRequest("batched prompts (%d) are not supported; send one prompt per request", len(list))
		}
		return promptTokens(first, tok, addSpecial)
	}
	ids := make([]uint32, len(list))
	for i, item := range list {
		var v int64
		if err := json.Unmarshal(item, &v); err != nil || v < 0 || v > math.MaxUint32 {
			return nil, badRequest("prompt[%d] = %s is not a token id", i, item)
		}
		ids[i] = uint32(v)
	}
	return ids, nil
}
