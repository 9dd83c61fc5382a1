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
// messages into a "conversation" (below: conversationValue), with each message's content
// in the template's content format (contentformat.go), and calls transformers'
// apply_chat_template, which renders with Jinja2 (trim_blocks, lstrip_blocks, a tojson
// filter that is Python's json.dumps, raise_exception) and the special tokens of
// tokenizer_config.json as variables. github.com/ardanlabs/jinja executes the template;
// it renders Qwen3's and Llama 3's templates byte for byte like Jinja2 (the golden tests
// compare with Jinja2's output) once printing is Python's str(), tojson transformers'
// own and trim, str.strip and dict() Python's, which we substitute (templatesrc.go,
// pybuiltins.go).

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
	templates map[string]compiledTemplate
	// base are the special-token variables and our Python built-ins (pybuiltins.go).
	base map[string]jinja.Value
}

// compiledTemplate is one template with the content format it is rendered with.
type compiledTemplate struct {
	*jinja.Template
	format ContentFormat
}

// newChatTemplate compiles the templates of cfg, or jinjaFile (chat_template.jinja)
// when given, and settles each one's content format (format, or the detected one when
// format is auto).
func newChatTemplate(cfg *tokenizerConfig, jinjaFile []byte, format ContentFormat) (*chatTemplate, error) {
	sources := cfg.templates
	if len(jinjaFile) > 0 {
		sources = map[string]string{"default": string(jinjaFile)}
	}
	if len(sources) == 0 {
		return nil, nil
	}
	ct := &chatTemplate{templates: map[string]compiledTemplate{}, base: pyBuiltins()}
	for name, src := range sources {
		src = jinjaLines(src)
		if controlled, ok := applyWhitespaceControl(src); ok {
			src = controlled
		}
		tags, err := scanTags(src)
		if err != nil {
			return nil, fmt.Errorf("%w: chat template %q: %v", ErrNotSupported, name, err)
		}
		resolved, err := format.resolve(tags)
		if err != nil {
			return nil, fmt.Errorf("chat template %q: %w", name, err)
		}
		tmpl, err := jinja.Compile(rewriteTemplate(src, tags))
		if err != nil {
			return nil, fmt.Errorf("%w: chat template %q: %v", ErrNotSupported, name, err)
		}
		ct.templates[name] = compiledTemplate{Template: tmpl, format: resolved}
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
	return ct, nil
}

// pick chooses the template as transformers does: a template named "tool_use" when
// tools are given and there is one, else "default".
func (ct *chatTemplate) pick(withTools bool) (compiledTemplate, error) {
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
	return compiledTemplate{}, fmt.Errorf("%w: no default chat template among the named ones", ErrNotSupported)
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
	for k, raw := range opts.Kwargs {
		// Our built-ins' names (kvindex_...) stay ours; "dict", like any Jinja2 global,
		// may be replaced.
		if reservedTemplateVars[k] || strings.HasPrefix(k, "kvindex_") {
			continue
		}
		if data[k], err = parseJSONValue(raw); err != nil {
			return "", fmt.Errorf("%w: chat_template_kwargs %q: %v", ErrInvalidMessages, k, err)
		}
	}
	data["messages"] = conversationValue(messages, tmpl.format)
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
		return continueFinalMessage(out, messages, tmpl.format)
	}
	return out, nil
}

// continueFinalMessage cuts the rendered chat after the final message's content, as
// transformers does for continue_final_message, so the model continues that message:
// after the content with its trailing whitespace when the template kept it verbatim,
// else after the stripped content. Content given as parts is continued after its last
// part.
func continueFinalMessage(rendered string, messages []Message, format ContentFormat) (string, error) {
	if len(messages) == 0 {
		return "", fmt.Errorf("%w: continue_final_message needs a final message", ErrInvalidMessages)
	}
	final := messages[len(messages)-1].templateContent(format)
	if final.IsList() {
		parts := final.AsList().Items
		if len(parts) == 0 {
			return "", fmt.Errorf("%w: continue_final_message: the final message has no text to continue", ErrInvalidMessages)
		}
		final, _ = parts[len(parts)-1].AsDict().Get("text")
	}
	return cutAfter(rendered, final.AsString())
}

// cutAfter is transformers' cut after the final message's text.
func cutAfter(rendered, final string) (string, error) {
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

// conversationValue is vLLM's conversation: per message role and content (in the
// template's content format), then (for an assistant) tool_calls with arguments parsed
// into objects and reasoning as both reasoning and reasoning_content, (for a tool)
// tool_call_id, the name, and (for a developer) its tools. Keys are in vLLM's order,
// which tojson shows.
func conversationValue(messages []Message, format ContentFormat) jinja.Value {
	items := make([]jinja.Value, len(messages))
	for i, m := range messages {
		d := jinja.NewDict()
		msg := d.AsDict()
		msg.Set("role", jinja.NewString(m.Role))
		msg.Set("content", m.templateContent(format))
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
	return jinja.NewList(items)
}

// templateContent is the message's content as vLLM passes it to a template of the
// format: the joined string (ContentFormatString); or the list of text parts
// ({"type": "text", "text": ...}, a string content being one part), except for a tool
// message, whose parts vLLM joins with "\n" again, empty ones included (vLLM PR
// #39899, 2026: most templates take a tool result as a string only).
func (m Message) templateContent(format ContentFormat) jinja.Value {
	if format != ContentFormatOpenAI {
		return jinja.NewString(m.Content)
	}
	texts := m.textParts()
	if m.Role == "tool" {
		return jinja.NewString(strings.Join(texts, "\n"))
	}
	parts := make([]jinja.Value, len(texts))
	for i, text := range texts {
		part := jinja.NewDict()
		part.AsDict().Set("type", jinja.NewString("text"))
		part.AsDict().Set("text", jinja.NewString(text))
		parts[i] = part
	}
	return jinja.NewList(parts)
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
