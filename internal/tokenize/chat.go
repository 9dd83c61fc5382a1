package tokenize

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/ardanlabs/jinja"
)

// Chat templates are Jinja2 programs shipped in tokenizer_config.json (or
// chat_template.jinja). They are rendered the way vLLM does it: vLLM turns the request's
// messages into a "conversation" (below: conversationValue) and calls transformers'
// apply_chat_template, which renders with Jinja2 (trim_blocks, lstrip_blocks, a tojson
// filter that is Python's json.dumps, raise_exception) and the special tokens of
// tokenizer_config.json as variables. github.com/ardanlabs/jinja executes the template;
// it renders Qwen3's and Llama 3's templates byte for byte like Jinja2 (the golden tests
// compare with Jinja2's output) once tojson is transformers' own, which we substitute.

// tojsonName is what the template's tojson filter is renamed to: the engine looks a
// filter up among its built-ins first and in the render data only for unknown names,
// so the rename routes tojson to tojsonFilter.
const tojsonName = "kvindex_tojson"

// tokenizerConfig is what tokenizer_config.json contributes.
type tokenizerConfig struct {
	TokenizerClass string `json:"tokenizer_class"`
	AddBOSToken    *bool  `json:"add_bos_token"`
	AddEOSToken    *bool  `json:"add_eos_token"`
	// special holds bos_token, eos_token, ... when the file sets them.
	special map[string]*string
	// additional is additional_special_tokens.
	additional []string
	// templates maps a template name ("default", "tool_use", ...) to its source.
	templates map[string]string
}

// specialTokenNames are transformers' SPECIAL_TOKENS_ATTRIBUTES: templates see each one
// that is set as a variable of the same name.
var specialTokenNames = []string{"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"}

func parseConfig(data []byte) (*tokenizerConfig, error) {
	cfg := &tokenizerConfig{special: map[string]*string{}, templates: map[string]string{}}
	if len(data) == 0 {
		return cfg, nil
	}
	if err := json.Unmarshal(data, cfg); err != nil {
		return nil, fmt.Errorf("%w: tokenizer_config.json: %v", ErrBadTokenizerFile, err)
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(data, &fields); err != nil {
		return nil, fmt.Errorf("%w: tokenizer_config.json: %v", ErrBadTokenizerFile, err)
	}
	for _, name := range specialTokenNames {
		tok, err := tokenContent(fields[name])
		if err != nil {
			return nil, fmt.Errorf("%w: tokenizer_config.json %s: %v", ErrBadTokenizerFile, name, err)
		}
		if tok != nil {
			cfg.special[name] = tok
		}
	}
	if raw := fields["additional_special_tokens"]; !isNull(raw) {
		var list []json.RawMessage
		if err := json.Unmarshal(raw, &list); err != nil {
			return nil, fmt.Errorf("%w: tokenizer_config.json additional_special_tokens: %v", ErrBadTokenizerFile, err)
		}
		for _, item := range list {
			tok, err := tokenContent(item)
			if err != nil || tok == nil {
				return nil, fmt.Errorf("%w: tokenizer_config.json additional_special_tokens: bad entry %s", ErrBadTokenizerFile, item)
			}
			cfg.additional = append(cfg.additional, *tok)
		}
	}
	if raw := fields["chat_template"]; !isNull(raw) {
		var one string
		if err := json.Unmarshal(raw, &one); err == nil {
			cfg.templates["default"] = one
		} else {
			var named []struct {
				Name     string `json:"name"`
				Template string `json:"template"`
			}
			if err := json.Unmarshal(raw, &named); err != nil {
				return nil, fmt.Errorf("%w: tokenizer_config.json chat_template: %v", ErrBadTokenizerFile, err)
			}
			for _, t := range named {
				cfg.templates[t.Name] = t.Template
			}
		}
	}
	return cfg, nil
}

// tokenContent reads a special token given as a string, as {"content": ...} (an
// AddedToken), or null.
func tokenContent(raw json.RawMessage) (*string, error) {
	if isNull(raw) {
		return nil, nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return &s, nil
	}
	var tok struct {
		Content *string `json:"content"`
	}
	if err := json.Unmarshal(raw, &tok); err != nil {
		return nil, err
	}
	return tok.Content, nil
}

// chatTemplate holds the compiled templates and the variables every render gets.
type chatTemplate struct {
	templates map[string]*jinja.Template
	// base are the special-token variables.
	base map[string]jinja.Value
}

func newChatTemplate(cfg *tokenizerConfig, jinjaFile []byte) (*chatTemplate, error) {
	sources := cfg.templates
	if len(jinjaFile) > 0 {
		sources = map[string]string{"default": string(jinjaFile)}
	}
	if len(sources) == 0 {
		return nil, nil
	}
	ct := &chatTemplate{templates: map[string]*jinja.Template{}, base: map[string]jinja.Value{}}
	for name, src := range sources {
		tmpl, err := jinja.Compile(renameFilter(jinjaLines(src), "tojson", tojsonName))
		if err != nil {
			return nil, fmt.Errorf("%w: chat template %q: %v", ErrNotSupported, name, err)
		}
		ct.templates[name] = tmpl
	}
	for name, tok := range cfg.special {
		ct.base[name] = jinja.NewString(*tok)
	}
	if len(cfg.additional) > 0 {
		items := make([]jinja.Value, len(cfg.additional))
		for i, tok := range cfg.additional {
			items[i] = jinja.NewString(tok)
		}
		ct.base["additional_special_tokens"] = jinja.NewList(items)
	}
	ct.base[tojsonName] = jinja.NewCallable(tojsonName, tojsonFilter)
	return ct, nil
}

// pick chooses the template as transformers does: a template named "tool_use" when
// tools are given and there is one, else "default".
func (ct *chatTemplate) pick(withTools bool) (*jinja.Template, error) {
	if withTools {
		if t, ok := ct.templates["tool_use"]; ok {
			return t, nil
		}
	}
	if t, ok := ct.templates["default"]; ok {
		return t, nil
	}
	if len(ct.templates) == 1 {
		for _, t := range ct.templates {
			return t, nil
		}
	}
	return nil, fmt.Errorf("%w: no default chat template among the named ones", ErrNotSupported)
}

// reservedTemplateVars are set by apply_chat_template itself; kwargs cannot replace them.
var reservedTemplateVars = map[string]bool{"messages": true, "tools": true, "documents": true, "add_generation_prompt": true}

// ApplyChatTemplate renders messages as vLLM renders a chat request's prompt. An error
// from the template (raise_exception, a missing value it requires) wraps
// ErrInvalidMessages; a tokenizer without a chat template gives ErrNotSupported.
func (t *HFTokenizer) ApplyChatTemplate(messages []Message, opts ChatOptions) (string, error) {
	if t.chat == nil {
		return "", fmt.Errorf("%w: model %q has no chat template", ErrNotSupported, t.model)
	}
	if err := textOnly(messages); err != nil {
		return "", err
	}
	if opts.AddGenerationPrompt && opts.ContinueFinalMessage {
		return "", fmt.Errorf("%w: add_generation_prompt and continue_final_message cannot both be true", ErrInvalidMessages)
	}
	tmpl, err := t.chat.pick(len(opts.Tools) > 0)
	if err != nil {
		return "", err
	}
	data := make(map[string]jinja.Value, len(t.chat.base)+len(opts.Kwargs)+4)
	for k, v := range t.chat.base {
		data[k] = v
	}
	for k, v := range opts.Kwargs {
		if !reservedTemplateVars[k] && k != tojsonName {
			data[k] = goValue(v)
		}
	}
	if data["messages"], err = conversationValue(messages); err != nil {
		return "", err
	}
	data["tools"] = jinja.None()
	if opts.Tools != nil {
		data["tools"] = toolsValue(opts.Tools)
	}
	data["documents"] = jinja.None()
	data["add_generation_prompt"] = jinja.NewBool(opts.AddGenerationPrompt)
	out, err := tmpl.RenderValues(data)
	if err != nil {
		return "", fmt.Errorf("%w: chat template of %q: %v", ErrInvalidMessages, t.model, err)
	}
	if opts.ContinueFinalMessage {
		return continueFinalMessage(out, messages)
	}
	return out, nil
}

// continueFinalMessage cuts the rendered chat after the final message's content, as
// transformers does for continue_final_message, so the model continues that message:
// after the content with its trailing whitespace when the template kept it verbatim,
// else after the stripped content.
func continueFinalMessage(rendered string, messages []Message) (string, error) {
	if len(messages) == 0 {
		return "", fmt.Errorf("%w: continue_final_message needs a final message", ErrInvalidMessages)
	}
	final := messages[len(messages)-1].Content
	trimmed := strings.TrimFunc(final, pyIsSpace)
	loc := strings.LastIndex(rendered, trimmed)
	if loc < 0 {
		return "", fmt.Errorf("%w: continue_final_message: the final message does not appear in the rendered chat", ErrInvalidMessages)
	}
	// transformers compares with the unstripped message, so this holds only when the
	// message has no leading whitespace.
	if left := strings.TrimLeftFunc(final, pyIsSpace); strings.HasPrefix(rendered[loc:], final) && len(left) == len(final) {
		return rendered[:loc+len(left)], nil
	}
	return rendered[:loc+len(trimmed)], nil
}

// pyIsSpace is Python's str.isspace for one character: Unicode white space plus the
// information separators U+001C..U+001F.
func pyIsSpace(r rune) bool { return unicode.IsSpace(r) || (r >= 0x1c && r <= 0x1f) }

// conversationValue is vLLM's conversation: per message role and content, then (for
// an assistant) tool_calls with arguments parsed into objects and reasoning as both
// reasoning and reasoning_content, (for a tool) tool_call_id, the name, and (for a
// developer) its tools. Keys are in vLLM's order, which tojson shows.
func conversationValue(messages []Message) (jinja.Value, error) {
	items := make([]jinja.Value, len(messages))
	for i, m := range messages {
		d := jinja.NewDict()
		msg := d.AsDict()
		msg.Set("role", jinja.NewString(m.Role))
		msg.Set("content", jinja.NewString(m.Content))
		switch m.Role {
		case "assistant":
			if len(m.ToolCalls) > 0 {
				calls := make([]jinja.Value, len(m.ToolCalls))
				for k, c := range m.ToolCalls {
					calls[k] = toolCallValue(c)
				}
				msg.Set("tool_calls", jinja.NewList(calls))
			}
			if m.Reasoning != nil {
				msg.Set("reasoning", jinja.NewString(*m.Reasoning))
				msg.Set("reasoning_content", jinja.NewString(*m.Reasoning))
			}
		case "tool":
			if m.ToolCallID != "" {
				msg.Set("tool_call_id", jinja.NewString(m.ToolCallID))
			}
		}
		if m.Name != "" {
			msg.Set("name", jinja.NewString(m.Name))
		}
		if m.Role == "developer" {
			tools := jinja.None()
			if m.Tools != nil {
				tools = toolsValue(m.Tools)
			}
			msg.Set("tools", tools)
		}
		items[i] = d
	}
	return jinja.NewList(items), nil
}

// toolCallValue is a tool call as vLLM's request model holds it: id, function
// (arguments, name), type; arguments parsed from their JSON text, {} when that is not
// valid JSON.
func toolCallValue(c ToolCall) jinja.Value {
	args, err := parseJSONValue([]byte(c.Function.Arguments))
	if err != nil {
		args = jinja.NewDict()
	}
	fn := jinja.NewDict()
	fn.AsDict().Set("arguments", args)
	fn.AsDict().Set("name", jinja.NewString(c.Function.Name))
	typ := c.Type
	if typ == "" {
		typ = "function"
	}
	call := jinja.NewDict()
	call.AsDict().Set("id", jinja.NewString(c.ID))
	call.AsDict().Set("function", fn)
	call.AsDict().Set("type", jinja.NewString(typ))
	return call
}

// toolsValue is the tools list as vLLM passes it (tool.model_dump()): type, function
// (name, description, parameters, then extra members), then extra members; an absent
// description or parameters is None.
func toolsValue(tools []Tool) jinja.Value {
	items := make([]jinja.Value, len(tools))
	for i, tool := range tools {
		fn := jinja.NewDict()
		f := fn.AsDict()
		f.Set("name", jinja.NewString(tool.Function.Name))
		desc := jinja.None()
		if tool.Function.hasDescription || tool.Function.Description != "" {
			desc = jinja.NewString(tool.Function.Description)
		}
		f.Set("description", desc)
		f.Set("parameters", rawJSONValue(tool.Function.Parameters))
		for _, x := range tool.Function.extra {
			f.Set(x.key, rawJSONValue(x.value))
		}
		typ := tool.Type
		if typ == "" {
			typ = "function"
		}
		d := jinja.NewDict()
		d.AsDict().Set("type", jinja.NewString(typ))
		d.AsDict().Set("function", fn)
		for _, x := range tool.extra {
			d.AsDict().Set(x.key, rawJSONValue(x.value))
		}
		items[i] = d
	}
	return jinja.NewList(items)
}

// rawJSONValue converts JSON text to a template value; absent or invalid is None.
func rawJSONValue(raw json.RawMessage) jinja.Value {
	if isNull(raw) {
		return jinja.None()
	}
	v, err := parseJSONValue(raw)
	if err != nil {
		return jinja.None()
	}
	return v
}

// jinjaLines does to a template source what Jinja2's lexer does first: every line
// break Python's str.splitlines knows (\r\n, \r, \n, \v, \f, \x1c-\x1e, \x85,
// U+2028, U+2029) becomes "\n", and a final line break is dropped (keep_trailing_newline
// is off in transformers).
func jinjaLines(src string) string {
	var sb strings.Builder
	sb.Grow(len(src))
	for i := 0; i < len(src); {
		r, w := utf8.DecodeRuneInString(src[i:])
		switch r {
		case '\r':
			if strings.HasPrefix(src[i:], "\r\n") {
				w = 2
			}
			fallthrough
		case '\n', '\v', '\f', 0x1c, 0x1d, 0x1e, 0x85, 0x2028, 0x2029:
			sb.WriteByte('\n')
		default:
			sb.WriteString(src[i : i+w])
		}
		i += w
	}
	return strings.TrimSuffix(sb.String(), "\n")
}

// renameFilter rewrites "| name" to "| newName" inside the template's {{ }} and {% %}
// tags, outside string literals.
func renameFilter(src, name, newName string) string {
	var sb strings.Builder
	sb.Grow(len(src))
	for i := 0; i < len(src); {
		open := strings.Index(src[i:], "{")
		if open < 0 || i+open+1 >= len(src) {
			sb.WriteString(src[i:])
			break
		}
		open += i
		kind := src[open+1]
		if kind != '{' && kind != '%' && kind != '#' {
			sb.WriteString(src[i : open+1])
			i = open + 1
			continue
		}
		sb.WriteString(src[i : open+2])
		i = open + 2
		if kind == '#' {
			end := strings.Index(src[i:], "#}")
			if end < 0 {
				sb.WriteString(src[i:])
				break
			}
			sb.WriteString(src[i : i+end+2])
			i += end + 2
			continue
		}
		closer := "}}"
		if kind == '%' {
			closer = "%}"
		}
		i = renameInTag(&sb, src, i, closer, name, newName)
	}
	return sb.String()
}

// renameInTag copies one tag's inside from src[i:] through its closer, renaming the
// filter, and returns the index after the closer.
func renameInTag(sb *strings.Builder, src string, i int, closer, name, newName string) int {
	var quote byte
	for i < len(src) {
		c := src[i]
		switch {
		case quote != 0:
			sb.WriteByte(c)
			if c == '\\' && i+1 < len(src) {
				sb.WriteByte(src[i+1])
				i++
			} else if c == quote {
				quote = 0
			}
			i++
		case c == '\'' || c == '"':
			quote = c
			sb.WriteByte(c)
			i++
		case strings.HasPrefix(src[i:], closer):
			sb.WriteString(closer)
			return i + len(closer)
		case c == '|':
			sb.WriteByte(c)
			i++
			j := i
			for j < len(src) && (src[j] == ' ' || src[j] == '\t' || src[j] == '\n' || src[j] == '\r') {
				j++
			}
			end := j + len(name)
			if strings.HasPrefix(src[j:], name) && (end == len(src) || !isIdentByte(src[end])) {
				sb.WriteString(src[i:j])
				sb.WriteString(newName)
				i = end
			}
		default:
			sb.WriteByte(c)
			i++
		}
	}
	return i
}

func isIdentByte(c byte) bool {
	return c == '_' || (c >= '0' && c <= '9') || isASCIILetter(c)
}
