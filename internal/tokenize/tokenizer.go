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
	// ErrNotSupported: the tokenizer file uses a feature this package does not
	// implement exactly (a model, normalizer, pre-tokenizer, ... other than those of
	// byte-level BPE tokenizers), or the tokenizer has no chat template.
	ErrNotSupported = errors.New("tokenize: not supported")
	// ErrBadSpec: a --tokenizer value is not of the form <model>=<dir>.
	ErrBadSpec = errors.New("tokenize: bad tokenizer spec")
	// ErrBadTokenizerFile: a tokenizer.json or tokenizer_config.json is malformed.
	ErrBadTokenizerFile = errors.New("tokenize: invalid tokenizer file")
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
	// cannot render, and messages with media (Message.Media), are an error wrapping
	// ErrInvalidMessages.
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
	// {"enable_thinking": false}, as the request's JSON: templates see them as
	// Python's json.loads reads them (1.0 stays a float, objects keep their key
	// order). Unknown keys are ignored, as a Jinja template would.
	Kwargs map[string]json.RawMessage
}

// Message is one OpenAI chat message. Content is in the form vLLM passes to templates
// that take content as a string; templates that take it as a list of parts (see
// ContentFormat) get the parts of content given as an array (see UnmarshalJSON).
type Message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
	// Media are the types of the content parts that are not text (image_url,
	// input_audio, video_url, file, ...), in order; Content holds the text parts
	// only. Only the type is kept, never the part's data. The tokenizers here are
	// text-only: ApplyChatTemplate refuses a message with media, whose prompt the
	// model's multimodal processor builds (placeholder tokens per item, and block
	// hashes that include each item's hash).
	Media []string `json:"-"`
	Name  string   `json:"name,omitempty"`
	// ToolCalls are an assistant message's function calls; an empty list is the same
	// as none.
	ToolCalls  []ToolCall `json:"tool_calls,omitempty"`
	ToolCallID string     `json:"tool_call_id,omitempty"`
	// Reasoning is an assistant message's reasoning text: vLLM's "reasoning" field,
	// or "reasoning_content" (DeepSeek's and Qwen's name, which clients replaying
	// their responses send) when "reasoning" is absent. Templates see it as both
	// reasoning and reasoning_content.
	Reasoning *string `json:"reasoning,omitempty"`
	// Tools are the functions a "developer" message offers.
	Tools []Tool `json:"tools,omitempty"`
	// parts are the texts of content given as an array of parts (or null: no parts),
	// in order, empty ones included; partsGiven tells such content from a string
	// content, which is one part.
	parts      []string
	partsGiven bool
}

// textParts are the texts of the content's text parts.
func (m Message) textParts() []string {
	if m.partsGiven {
		return m.parts
	}
	return []string{m.Content}
}

// ToolCall is a function call an assistant message made.
type ToolCall struct {
	ID       string       `json:"id,omitempty"`
	Type     string       `json:"type,omitempty"`
	Function FunctionCall `json:"function"`
}

// FunctionCall names the called function; Arguments is the JSON text of its arguments.
type FunctionCall struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// UnmarshalJSON takes arguments as the OpenAI string, or as a JSON object or array
// (kept as its JSON text). Any other JSON value leaves Arguments empty, which vLLM
// renders as {} just like a string that is not valid JSON.
func (f *FunctionCall) UnmarshalJSON(data []byte) error {
	var raw struct {
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
	}
	if err := json.Unmarshal(data, &raw); err != nil {
		return err
	}
	*f = FunctionCall{Name: raw.Name}
	args := bytes.TrimSpace(raw.Arguments)
	switch {
	case len(args) == 0:
	case args[0] == '"':
		return json.Unmarshal(args, &f.Arguments)
	case args[0] == '{' || args[0] == '[':
		f.Arguments = string(args)
	}
	return nil
}

// Tool is a function offered to the model. Fields of the request that are not modelled
// here are kept, in order, and shown to the template after the known ones (as vLLM's
// pydantic models, which allow extra fields, dump them).
type Tool struct {
	Type     string      `json:"type"`
	Function FunctionDef `json:"function"`
	extra    []rawField
}

// FunctionDef describes an offered function; Parameters is its JSON Schema, verbatim.
type FunctionDef struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters,omitempty"`
	// hasDescription tells an absent description (None to templates) from "".
	hasDescription bool
	extra          []rawField
}

// rawField is a JSON object member kept verbatim.
type rawField struct {
	key   string
	value json.RawMessage
}

// UnmarshalJSON reads type and function and keeps any other member.
func (t *Tool) UnmarshalJSON(data []byte) error {
	*t = Tool{}
	return eachMember(data, func(key string, value []byte) error {
		switch key {
		case "type":
			return json.Unmarshal(value, &t.Type)
		case "function":
			return json.Unmarshal(value, &t.Function)
		}
		t.extra = append(t.extra, rawField{key, bytes.Clone(value)})
		return nil
	})
}

// UnmarshalJSON reads name, description and parameters and keeps any other member.
func (f *FunctionDef) UnmarshalJSON(data []byte) error {
	*f = FunctionDef{}
	return eachMember(data, func(key string, value []byte) error {
		switch key {
		case "name":
			return json.Unmarshal(value, &f.Name)
		case "description":
			var d *string
			if err := json.Unmarshal(value, &d); err != nil {
				return err
			}
			if d != nil {
				f.Description, f.hasDescription = *d, true
			}
			return nil
		case "parameters":
			if !isNull(value) {
				f.Parameters = bytes.Clone(value)
			}
			return nil
		}
		f.extra = append(f.extra, rawField{key, bytes.Clone(value)})
		return nil
	})
}

// UnmarshalJSON accepts content as a string, null, or an array of parts: text parts
// (also input_text, output_text), refusal and thinking parts and bare strings
// contribute their text (a part whose text is null is skipped, as vLLM does).
// Content is the texts joined with "\n", empty ones skipped (vLLM's string content
// format), "" for null content; the texts themselves, empty ones included, are kept
// for templates that take content as parts. Any other part (an object of another
// type: image_url, input_audio, ...) is kept in Media by its type. A part that is
// neither a string, null nor an object, or content of another JSON type, is an
// error wrapping ErrInvalidMessages.
func (m *Message) UnmarshalJSON(data []byte) error {
	*m = Message{}
	if string(data) == "null" {
		return nil
	}
	var c content
	var reasoningContent *string
	err := eachMember(data, func(key string, value []byte) error {
		switch key {
		case "role":
			return json.Unmarshal(value, &m.Role)
		case "content":
			return c.decode(value)
		case "name":
			// vLLM keeps name only when it is a string.
			m.Name = ""
			_ = json.Unmarshal(value, &m.Name)
		case "tool_calls":
			return json.Unmarshal(value, &m.ToolCalls)
		case "tool_call_id":
			return json.Unmarshal(value, &m.ToolCallID)
		case "reasoning":
			return json.Unmarshal(value, &m.Reasoning)
		case "reasoning_content":
			// The older name of reasoning (see Message.Reasoning).
			return json.Unmarshal(value, &reasoningContent)
		case "tools":
			return json.Unmarshal(value, &m.Tools)
		}
		return nil
	})
	if err != nil {
		return err
	}
	if m.Reasoning == nil {
		m.Reasoning = reasoningContent
	}
	m.Content, m.Media, m.parts, m.partsGiven = c.text, c.media, c.parts, c.partsGiven
	return nil
}

// content is a message's content: the text of its text parts, and the types of
// the others. It is walked where it lies in the body (jsonscan.go): a media
// part's data is passed over, never copied.
type content struct {
	text  string
	media []string
	// parts and partsGiven are Message's.
	parts      []string
	partsGiven bool
}

// maxMediaType bounds the part type kept for a media part; the type names vLLM
// knows are far shorter.
const maxMediaType = 64

func (c *content) decode(data []byte) error {
	*c = content{}
	switch data[0] { // a value from eachMember: never empty, never space first
	case 'n':
		c.partsGiven = true
		return nil
	case '"':
		return json.Unmarshal(data, &c.text)
	case '[':
		c.partsGiven = true
		var texts []string
		err := eachElement(data, func(i int, part []byte) error {
			text, kind, err := partText(part)
			switch {
			case err != nil:
				return fmt.Errorf("content part %d: %w", i, err)
			case kind == mediaPart:
				c.media = append(c.media, text)
			case kind == textPart:
				c.parts = append(c.parts, text)
				if text != "" {
					texts = append(texts, text)
				}
			}
			return nil
		})
		c.text = strings.Join(texts, "\n")
		return err
	}
	return fmt.Errorf("%w: content must be a string, null or an array of parts, got %.20s", ErrInvalidMessages, data)
}

// partKind tells what partText read.
type partKind uint8

const (
	textPart  partKind = iota
	emptyPart          // null, or a text part whose text is null or absent
	mediaPart
)

// partText reads one element of an array content: a bare string, null, or an
// object, whose text it returns, or with media its type (at most maxMediaType
// bytes of it). Members other than the type and the texts (an image_url's data)
// are skipped, not decoded.
func partText(data []byte) (text string, kind partKind, err error) {
	if data[0] != '{' {
		var s *string
		if json.Unmarshal(data, &s) != nil {
			return "", 0, fmt.Errorf("%w: a part must be a string or an object, got %.20s", ErrInvalidMessages, data)
		}
		if s == nil {
			return "", emptyPart, nil
		}
		return *s, textPart, nil
	}
	var typ string
	var texts [3]*string // text, refusal, thinking
	err = eachMember(data, func(key string, value []byte) error {
		switch key {
		case "type":
			return json.Unmarshal(value, &typ)
		case "text":
			return json.Unmarshal(value, &texts[0])
		case "refusal":
			return json.Unmarshal(value, &texts[1])
		case "thinking":
			return json.Unmarshal(value, &texts[2])
		}
		return nil
	})
	if err != nil {
		return "", 0, fmt.Errorf("%w: %v", ErrInvalidMessages, err)
	}
	var t *string
	switch typ {
	case "text", "input_text", "output_text":
		t = texts[0]
	case "refusal":
		t = texts[1]
	case "thinking":
		t = texts[2]
	default:
		if len(typ) > maxMediaType {
			typ = strings.Clone(typ[:maxMediaType])
		}
		return typ, mediaPart, nil
	}
	if t == nil {
		return "", emptyPart, nil
	}
	return *t, textPart, nil
}

// textOnly refuses messages with media parts: their prompt is not text these
// tokenizers can render (see Message.Media).
func textOnly(messages []Message) error {
	for i, m := range messages {
		if len(m.Media) > 0 {
			return fmt.Errorf("%w: message %d has a content part of type %q; only text parts are supported", ErrInvalidMessages, i, m.Media[0])
		}
	}
	return nil
}
