package tokenize

import (
	"encoding/json"
	"fmt"
	"strings"
)

// Special token ids of the Builtin tokenizer. Ids 0-255 are the bytes themselves.
const (
	BuiltinBOS     uint32 = 256 // "<|bos|>", added by Encode(..., true)
	BuiltinEOS     uint32 = 257 // "<|eos|>"
	BuiltinIMStart uint32 = 258 // "<|im_start|>", opens a chat turn
	BuiltinIMEnd   uint32 = 259 // "<|im_end|>", closes a chat turn
)

var builtinSpecials = [...]string{"<|bos|>", "<|eos|>", "<|im_start|>", "<|im_end|>"}

// Builtin is a byte-level tokenizer: every byte of the text is one token (id = byte
// value) except the four special-token strings, which are one token each. It is
// cheap (no tables), deterministic, and reversible, which is what the fake engine and
// tests need; token counts are about four times those of a real BPE vocabulary.
//
// Its chat template is ChatML (as Qwen uses):
//
//	<|im_start|>{role}\n{content}<|im_end|>\n            per message
//	<|im_start|>assistant\n                              add_generation_prompt
//	<think>\n\n</think>\n\n                              ... and enable_thinking=false
//
// Tools become a leading system turn ("# Tools" then one JSON object per line), merged
// with the first message when that is a system message; assistant tool calls are
// rendered as <tool_call>{json}</tool_call> lines and tool results are wrapped in
// <tool_response>...</tool_response>.
type Builtin struct{}

// NewBuiltin returns the built-in tokenizer.
func NewBuiltin() *Builtin { return &Builtin{} }

var _ Tokenizer = (*Builtin)(nil)

// VocabSize is 256 bytes plus four special tokens.
func (*Builtin) VocabSize() int { return 256 + len(builtinSpecials) }

// Encode returns one id per byte, special-token strings as their ids, and a leading
// BuiltinBOS when addSpecialTokens is set.
func (*Builtin) Encode(text string, addSpecialTokens bool) []uint32 {
	ids := make([]uint32, 0, len(text)+1)
	if addSpecialTokens {
		ids = append(ids, BuiltinBOS)
	}
	for i := 0; i < len(text); {
		if text[i] == '<' && strings.HasPrefix(text[i:], "<|") {
			if id, n, ok := matchSpecial(text[i:]); ok {
				ids = append(ids, id)
				i += n
				continue
			}
		}
		ids = append(ids, uint32(text[i]))
		i++
	}
	return ids
}

func matchSpecial(s string) (id uint32, n int, ok bool) {
	for k, sp := range builtinSpecials {
		if strings.HasPrefix(s, sp) {
			return 256 + uint32(k), len(sp), true
		}
	}
	return 0, 0, false
}

// Decode concatenates the bytes and special-token strings of ids.
func (b *Builtin) Decode(ids []uint32) (string, error) {
	var sb strings.Builder
	sb.Grow(len(ids))
	for i, id := range ids {
		switch {
		case id < 256:
			sb.WriteByte(byte(id))
		case int(id) < b.VocabSize():
			sb.WriteString(builtinSpecials[id-256])
		default:
			return "", fmt.Errorf("%w: ids[%d]=%d, vocabulary size is %d", ErrInvalidTokenID, i, id, b.VocabSize())
		}
	}
	return sb.String(), nil
}

// ApplyChatTemplate renders messages as ChatML (see Builtin).
func (*Builtin) ApplyChatTemplate(messages []Message, opts ChatOptions) (string, error) {
	if err := textOnly(messages); err != nil {
		return "", err
	}
	if opts.AddGenerationPrompt && opts.ContinueFinalMessage {
		return "", fmt.Errorf("%w: add_generation_prompt and continue_final_message cannot both be true", ErrInvalidMessages)
	}
	if opts.ContinueFinalMessage && (len(messages) == 0 || messages[len(messages)-1].Role != "assistant") {
		return "", fmt.Errorf("%w: continue_final_message needs a final assistant message", ErrInvalidMessages)
	}
	var sb strings.Builder
	rest := messages
	if len(opts.Tools) > 0 {
		sb.WriteString("<|im_start|>system\n")
		if len(rest) > 0 && rest[0].Role == "system" {
			sb.WriteString(rest[0].Content)
			sb.WriteString("\n\n")
			rest = rest[1:]
		}
		sb.WriteString("# Tools\n")
		for i, tool := range opts.Tools {
			line, err := json.Marshal(tool)
			if err != nil {
				return "", fmt.Errorf("%w: tools[%d]: %v", ErrInvalidMessages, i, err)
			}
			sb.Write(line)
			sb.WriteByte('\n')
		}
		sb.WriteString("<|im_end|>\n")
	}
	for i, m := range rest {
		if m.Role == "" || strings.ContainsAny(m.Role, "\n<|") {
			return "", fmt.Errorf("%w: message %d has role %q", ErrInvalidMessages, i, m.Role)
		}
		sb.WriteString("<|im_start|>")
		sb.WriteString(m.Role)
		sb.WriteByte('\n')
		if m.Role == "tool" {
			sb.WriteString("<tool_response>\n" + m.Content + "\n</tool_response>")
		} else {
			sb.WriteString(m.Content)
		}
		for _, call := range m.ToolCalls {
			line, err := json.Marshal(renderedCall(call.Function))
			if err != nil {
				return "", fmt.Errorf("%w: message %d tool call: %v", ErrInvalidMessages, i, err)
			}
			sb.WriteString("\n<tool_call>\n")
			sb.Write(line)
			sb.WriteString("\n</tool_call>")
		}
		if opts.ContinueFinalMessage && i == len(rest)-1 {
			return sb.String(), nil
		}
		sb.WriteString("<|im_end|>\n")
	}
	if opts.AddGenerationPrompt {
		sb.WriteString("<|im_start|>assistant\n")
		var thinking *bool
		if json.Unmarshal(opts.Kwargs["enable_thinking"], &thinking) == nil && thinking != nil && !*thinking {
			sb.WriteString("<think>\n\n</think>\n\n")
		}
	}
	return sb.String(), nil
}

// renderedCall shows the arguments as JSON when the model wrote valid JSON, and as a
// string otherwise, so that rendering never fails on a malformed call.
func renderedCall(f FunctionCall) any {
	if json.Valid([]byte(f.Arguments)) {
		return struct {
			Name      string          `json:"name"`
			Arguments json.RawMessage `json:"arguments"`
		}{f.Name, json.RawMessage(f.Arguments)}
	}
	return f
}
