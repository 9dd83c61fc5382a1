package fakeengine

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"

	"github.com/kvindex/kvindex/internal/tokenize"
)

// OpenAI / vLLM request and response bodies, limited to the fields the simulator
// uses; unknown request fields are ignored, as vLLM does.

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

type completionRequest struct {
	Model            string            `json:"model"`
	Prompt           json.RawMessage   `json:"prompt"`
	MaxTokens        *int              `json:"max_tokens"`
	N                *int              `json:"n"`
	Stream           bool              `json:"stream"`
	StreamOptions    *streamOptions    `json:"stream_options"`
	AddSpecialTokens *bool             `json:"add_special_tokens"`
	CacheSalt        string            `json:"cache_salt"`
	KVTransferParams *KVTransferParams `json:"kv_transfer_params"`
}

type chatRequest struct {
	Model                string             `json:"model"`
	Messages             []tokenize.Message `json:"messages"`
	MaxTokens            *int               `json:"max_tokens"`
	MaxCompletionTokens  *int               `json:"max_completion_tokens"`
	N                    *int               `json:"n"`
	Stream               bool               `json:"stream"`
	StreamOptions        *streamOptions     `json:"stream_options"`
	Tools                []tokenize.Tool    `json:"tools"`
	AddGenerationPrompt  *bool              `json:"add_generation_prompt"`
	ContinueFinalMessage bool               `json:"continue_final_message"`
	AddSpecialTokens     bool               `json:"add_special_tokens"`
	ChatTemplateKwargs   map[string]any     `json:"chat_template_kwargs"`
	CacheSalt            string             `json:"cache_salt"`
	KVTransferParams     *KVTransferParams  `json:"kv_transfer_params"`
}

// tokenizeRequest is vLLM's /tokenize body: either prompt, or messages with the
// chat options.
type tokenizeRequest struct {
	Model                string             `json:"model"`
	Prompt               *string            `json:"prompt"`
	Messages             []tokenize.Message `json:"messages"`
	AddGenerationPrompt  *bool              `json:"add_generation_prompt"`
	ContinueFinalMessage bool               `json:"continue_final_message"`
	AddSpecialTokens     *bool              `json:"add_special_tokens"`
	ChatTemplateKwargs   map[string]any     `json:"chat_template_kwargs"`
	Tools                []tokenize.Tool    `json:"tools"`
	ReturnTokenStrs      bool               `json:"return_token_strs"`
}

type tokenizeResponse struct {
	Count       int      `json:"count"`
	MaxModelLen int      `json:"max_model_len"`
	Tokens      []uint32 `json:"tokens"`
	TokenStrs   []string `json:"token_strs"`
}

type detokenizeRequest struct {
	Model  string   `json:"model"`
	Tokens []uint32 `json:"tokens"`
}

type promptTokensDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

type usage struct {
	PromptTokens        int                 `json:"prompt_tokens"`
	TotalTokens         int                 `json:"total_tokens"`
	CompletionTokens    int                 `json:"completion_tokens"`
	PromptTokensDetails promptTokensDetails `json:"prompt_tokens_details"`
}

func usageOf(res Result, completion int) *usage {
	return &usage{
		PromptTokens:        res.PromptTokens,
		TotalTokens:         res.PromptTokens + completion,
		CompletionTokens:    completion,
		PromptTokensDetails: promptTokensDetails{CachedTokens: res.CachedTokens},
	}
}

type completionChoice struct {
	Index        int     `json:"index"`
	Text         string  `json:"text"`
	Logprobs     any     `json:"logprobs"`
	FinishReason *string `json:"finish_reason"`
	StopReason   any     `json:"stop_reason"`
}

type chatMessage struct {
	Role      string `json:"role"`
	Content   string `json:"content"`
	ToolCalls []any  `json:"tool_calls"`
}

type chatDelta struct {
	Role    string `json:"role,omitempty"`
	Content string `json:"content"`
}

type chatChoice struct {
	Index        int          `json:"index"`
	Message      *chatMessage `json:"message,omitempty"`
	Delta        *chatDelta   `json:"delta,omitempty"`
	Logprobs     any          `json:"logprobs"`
	FinishReason *string      `json:"finish_reason"`
	StopReason   any          `json:"stop_reason"`
}

// response is a completion or chat response or stream chunk (Choices holds
// completionChoice or chatChoice values).
type response struct {
	ID               string            `json:"id"`
	Object           string            `json:"object"`
	Created          int64             `json:"created"`
	Model            string            `json:"model"`
	Choices          any               `json:"choices"`
	Usage            *usage            `json:"usage,omitempty"`
	KVTransferParams *KVTransferParams `json:"kv_transfer_params,omitempty"`
}

type errorBody struct {
	Error errorDetail `json:"error"`
}

type errorDetail struct {
	Message string `json:"message"`
	Type    string `json:"type"`
	Param   any    `json:"param"`
	Code    int    `json:"code"`
}

type modelCard struct {
	ID          string  `json:"id"`
	Object      string  `json:"object"`
	Created     int64   `json:"created"`
	OwnedBy     string  `json:"owned_by"`
	Root        string  `json:"root"`
	Parent      *string `json:"parent"`
	MaxModelLen int     `json:"max_model_len"`
}

type modelList struct {
	Object string      `json:"object"`
	Data   []modelCard `json:"data"`
}

// promptTokens reads an OpenAI completion prompt: a string (tokenized with
// addSpecial), a list of token ids, or a one-element list of either. Batches of
// several prompts are not supported.
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

func checkN(n *int) error {
	if n != nil && *n != 1 {
		return fmt.Errorf("%w: n=%d is not supported; only n=1", ErrBadRequest, *n)
	}
	return nil
}
