package tokenize

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// Sentinel errors; wrapped with %w so callers can test with errors.Is.
var (
	// ErrInvalidTokenID: an id outside the tokenizer's vocabulary was given to Decode.
	ErrInvalidTokenID = errors.New("tokenize: token id out of vocabulary")
	// ErrInvalidMessages: the chat messages or options cannot be rendered.
	ErrInvalidMessages = errors.New("tokenize: invalid chat messages")
	// ErrUnknownModel: the registry has no tokenizer for the model.
	ErrUnknownModel = errors.New("tokenize: no tokenizer for model")
	// ErrNotSupported: the requested tokenizer source cannot be loaded (yet).
	ErrNotSupported = errors.New("tokenize: not supported")
	// ErrBadSpec: a --tokenizer value is not of the form <model>=<dir>.
	ErrBadSpec = errors.New("tokenize: bad tokenizer spec")
)

// Tokenizer turns text into token ids and back, and renders chat messages into the
// prompt text a model expects. Implementations are safe for concurrent use.
type Tokenizer interface {
	// Encode tokenizes text. With addSpecialTokens the model's usual prefix (a BOS
	// token for most models) is added, as Hugging Face's add_special_tokens does.
	// Special-token strings inside text are recognised as special tokens.
	Encode(text string, addSpecialTokens bool) []uint32
	// Decode turns ids back into text, special tokens rendered as their strings.
	// An id outside the vocabulary is an error wrapping ErrInvalidTokenID.
	Decode(ids []uint32) (string, error)
	// ApplyChatTemplate renders messages into prompt text (to be encoded with
	// addSpecialTokens false, as vLLM does for chat requests). Messages the template
	// cannot render are an error wrapping ErrInvalidMessages.
	ApplyChatTemplate(messages []Message, opts ChatOptions) (string, error)
	// VocabSize is one more than the largest valid token id.
	VocabSize() int
}

// ChatOptions are the template inputs of an OpenAI-style chat or /tokenize request
// besides the messages themselves.
type ChatOptions struct {
	// AddGenerationPrompt appends the header that starts the assistant's reply.
	AddGenerationPrompt bool
	// ContinueFinalMessage leaves the final (assistant) message open so the model
	// continues it; it excludes AddGenerationPrompt.
	ContinueFinalMessage bool
	// Tools are the functions offered to the model (OpenAI "tools").
	Tools []Tool
	// Kwargs are extra template variables (vLLM "chat_template_kwargs"), for example
	// {"enable_thinking": false}. Unknown keys are ignored, as a Jinja template would.
	Kwargs map[string]any
}

// Message is one OpenAI chat message. Content given as an array of parts is
// flattened to the concatenation of its text parts (see UnmarshalJSON).
type Message struct {
	Role       string     `json:"role"`
	Content    string     `json:"content"`
	Name       string     `json:"name,omitempty"`
	ToolCalls  []ToolCall `json:"tool_calls,omitempty"`
	ToolCallID string     `json:"tool_call_id,omitempty"`
}

// ToolCall is a function call an assistant message made.
type ToolCall struct {
	ID       string       `json:"id,omitempty"`
	Type     string       `json:"type,omitempty"`
	Function FunctionCall `json:"function"`
}

// FunctionCall names the called function; Arguments is the JSON text the model wrote.
type FunctionCall struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// Tool is a function offered to the model.
type Tool struct {
	Type     string      `json:"type"`
	Function FunctionDef `json:"function"`
}

// FunctionDef describes an offered function; Parameters is its JSON Schema, verbatim.
type FunctionDef struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters,omitempty"`
}

// UnmarshalJSON accepts content as a string, null, or an array of parts; text parts
// ({"type":"text","text":...}) are concatenated, any other part type is an error
// wrapping ErrInvalidMessages because the tokenizers here are text-only.
func (m *Message) UnmarshalJSON(data []byte) error {
	var raw struct {
		Role       string          `json:"role"`
		Content    json.RawMessage `json:"content"`
		Name       string          `json:"name"`
		ToolCalls  []ToolCall      `json:"tool_calls"`
		ToolCallID string          `json:"tool_call_id"`
	}
	if err := json.Unmarshal(data, &raw); err != nil {
		return err
	}
	content, err := flattenContent(raw.Content)
	if err != nil {
		return err
	}
	*m = Message{Role: raw.Role, Content: content, Name: raw.Name, ToolCalls: raw.ToolCalls, ToolCallID: raw.ToolCallID}
	return nil
}

func flattenContent(raw json.RawMessage) (string, error) {
	trimmed := bytes.TrimSpace(raw)
	if len(trimmed) == 0 || string(trimmed) == "null" {
		return "", nil
	}
	switch trimmed[0] {
	case '"':
		var s string
		err := json.Unmarshal(trimmed, &s)
		return s, err
	case '[':
		var parts []struct {
			Type string  `json:"type"`
			Text *string `json:"text"`
		}
		if err := json.Unmarshal(trimmed, &parts); err != nil {
			return "", err
		}
		var sb strings.Builder
		for i, p := range parts {
			if p.Type != "text" || p.Text == nil {
				return "", fmt.Errorf("%w: content part %d has type %q; only text parts are supported", ErrInvalidMessages, i, p.Type)
			}
			sb.WriteString(*p.Text)
		}
		return sb.String(), nil
	}
	return "", fmt.Errorf("%w: content must be a string, null or an array of parts, got %.20s", ErrInvalidMessages, trimmed)
}
