package tokenize

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
)

// messagesOracle decodes messages with encoding/json alone, value by value, as the
// walk in place must: keys matched exactly and the last of a repeated one winning
// (as Python's json module and vLLM read them), content flattened as
// Message.UnmarshalJSON documents. ok is false where the walk must fail.
func messagesOracle(data []byte) (msgs []Message, ok bool) {
	var raws []map[string]json.RawMessage
	if json.Unmarshal(data, &raws) != nil {
		return nil, false
	}
	for _, raw := range raws {
		var m Message
		var rc *string
		for key, dst := range map[string]any{"role": &m.Role, "tool_calls": &m.ToolCalls, "tool_call_id": &m.ToolCallID,
			"reasoning": &m.Reasoning, "reasoning_content": &rc, "tools": &m.Tools} {
			if v, set := raw[key]; set && json.Unmarshal(v, dst) != nil {
				return nil, false
			}
		}
		if m.Reasoning == nil {
			m.Reasoning = rc
		}
		if v, set := raw["name"]; set {
			_ = json.Unmarshal(v, &m.Name)
		}
		var parts []json.RawMessage
		switch c := bytes.TrimSpace(raw["content"]); {
		case len(c) == 0 || string(c) == "null":
		case json.Unmarshal(c, &m.Content) == nil:
		case json.Unmarshal(c, &parts) == nil:
			var texts []string
			for _, p := range parts {
				var s *string
				var obj map[string]json.RawMessage
				if json.Unmarshal(p, &s) == nil {
					if s != nil && *s != "" {
						texts = append(texts, *s)
					}
					continue
				}
				if json.Unmarshal(p, &obj) != nil {
					return nil, false
				}
				var typ string
				var text, refusal, thinking *string
				for key, dst := range map[string]any{"type": &typ, "text": &text, "refusal": &refusal, "thinking": &thinking} {
					if v, set := obj[key]; set && json.Unmarshal(v, dst) != nil {
						return nil, false
					}
				}
				switch typ {
				case "text", "input_text", "output_text":
				case "refusal":
					text = refusal
				case "thinking":
					text = thinking
				default:
					m.Media = append(m.Media, typ[:min(len(typ), maxMediaType)])
					continue
				}
				if text != nil && *text != "" {
					texts = append(texts, *text)
				}
			}
			m.Content = strings.Join(texts, "\n")
		default:
			return nil, false
		}
		msgs = append(msgs, m)
	}
	return msgs, true
}

// FuzzMessagesDecode: any bytes decode as messages without a panic, and exactly
// as the encoding/json oracle reads them.
func FuzzMessagesDecode(f *testing.F) {
	for _, s := range []string{
		`[{"role":"user","content":"hi"}]`,
		`[{"role":"user","content":[{"type":"text","text":"a"},"b",null,{"type":"image_url","image_url":{"url":"x\"]}"}}]}]`,
		`[{"role":"assistant","content":null,"reasoning_content":"r","tool_calls":[{"id":"1","function":{"name":"f","arguments":{"a":[1,{}]}}}]}]`,
		`[{"role":"tool","tool_call_id":"1","content":[{"type":"refusal","refusal":"no"},{"type":"thinking","thinking":"\\"}]}]`,
		`[{"r\u006fle":"user","role":"system","content":" \"\\\\\" ","name":5}]`,
		`[{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"AA==","format":"wav"}},{"text":"t"}]}]`,
		`[{"role":"developer","tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}},"x":[true,false,null,-1.5e3]}]}]`,
		` [ { "role" : "user" , "content" : [ 3 ] } ] `, `[null]`, `[{"content":{}}]`, `[{"content":[{"type":5}]}]`, `[{"Role":"user"}]`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		// The walkers never panic, whatever the bytes, and walk any valid
		// array or object (whose first byte they check).
		first := data[skipSpace(data, 0):]
		arr := eachElement(data, func(int, []byte) error { return nil })
		obj := eachMember(data, func(string, []byte) error { return nil })
		if json.Valid(data) && (arr != nil && first[0] == '[' || obj != nil && first[0] == '{') {
			t.Fatalf("%q is valid JSON, but walking it failed: %v, %v", data, arr, obj)
		}
		var msgs []Message
		err := json.Unmarshal(data, &msgs)
		want, ok := messagesOracle(data)
		switch {
		case err != nil && ok:
			t.Fatalf("%q: %v, want %+v", data, err, want)
		case err == nil && !ok:
			t.Fatalf("%q: decoded %+v, want an error", data, msgs)
		case err != nil:
			var syntax *json.SyntaxError
			if !errors.As(err, &syntax) && !errors.Is(err, ErrInvalidMessages) && !errors.As(err, new(*json.UnmarshalTypeError)) {
				t.Fatalf("%q: error %v is neither a JSON error nor ErrInvalidMessages", data, err)
			}
		}
		for i := range min(len(msgs), len(want)) {
			g, w := msgs[i], want[i]
			if g.Role != w.Role || g.Content != w.Content || !reflect.DeepEqual(g.Media, w.Media) || g.Name != w.Name ||
				g.ToolCallID != w.ToolCallID || !reflect.DeepEqual(g.Reasoning, w.Reasoning) || len(g.ToolCalls) != len(w.ToolCalls) || len(g.Tools) != len(w.Tools) {
				t.Fatalf("%q: message %d = %+v, want %+v", data, i, g, w)
			}
		}
	})
}
