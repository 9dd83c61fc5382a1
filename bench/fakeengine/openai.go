package fakeengine

import (
	"encoding/json"

	"github.com/kvindex/kvindex/internal/tokenize"
)

// OpenAI / vLLM response bodies and the /tokenize and /detokenize requests; the
// generation requests are internal/openai's. Unknown request fields are ignored, as
// vLLM does.

// tokenizeRequest is vLLM's /tokenize body: either prompt, or messages with the
// chat options.
type tokenizeRequest struct {
	Model                string                     `json:"model"`
	Prompt               *string                    `json:"prompt"`
	Messages             []tokenize.Message         `json:"messages"`
	AddGenerationPrompt  *bool                      `json:"add_generation_prompt"`
	ContinueFinalMessage bool                       `json:"continue_final_message"`
	AddSpecialTokens     *bool                      `json:"add_special_tokens"`
	ChatTemplateKwargs   map[string]json.RawMessage `json:"chat_template_kwargs"`
	Tools                []tokenize.Tool            `json:"tools"`
	ReturnTokenStrs      bool                       `json:"return_token_strs"`
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
