package tokenize

import (
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

var rewrite = flag.Bool("rewrite", false, "rewrite testdata golden files")

func TestBuiltinEncodeDecodeRoundTrip(t *testing.T) {
	tok := NewBuiltin()
	tests := []struct {
		name string
		text string
		want []uint32
	}{
		{"empty", "", []uint32{}},
		{"ascii", "Hi!", []uint32{'H', 'i', '!'}},
		{"utf8 is one token per byte", "é", []uint32{0xc3, 0xa9}},
		{"invalid utf8 survives", "\xff\xfe", []uint32{0xff, 0xfe}},
		{"special tokens are single ids", "<|im_start|>a<|im_end|>", []uint32{BuiltinIMStart, 'a', BuiltinIMEnd}},
		{"half a special is bytes", "<|im_sta", []uint32{'<', '|', 'i', 'm', '_', 's', 't', 'a'}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := tok.Encode(tt.text, false)
			if !slices.Equal(got, tt.want) {
				t.Fatalf("Encode(%q) = %v, want %v", tt.text, got, tt.want)
			}
			back, err := tok.Decode(got)
			if err != nil || back != tt.text {
				t.Fatalf("Decode(Encode(%q)) = %q, %v", tt.text, back, err)
			}
		})
	}
}

func TestBuiltinAddSpecialTokensPrependsBOS(t *testing.T) {
	tok := NewBuiltin()
	got := tok.Encode("ab", true)
	if want := []uint32{BuiltinBOS, 'a', 'b'}; !slices.Equal(got, want) {
		t.Fatalf("Encode(ab, true) = %v, want %v", got, want)
	}
	if s, _ := tok.Decode(got); s != "<|bos|>ab" {
		t.Fatalf("Decode = %q, want <|bos|>ab", s)
	}
}

func TestBuiltinDecodeRejectsOutOfVocabulary(t *testing.T) {
	tok := NewBuiltin()
	_, err := tok.Decode([]uint32{'a', uint32(tok.VocabSize())})
	if !errors.Is(err, ErrInvalidTokenID) {
		t.Fatalf("Decode(out of vocab) error = %v, want ErrInvalidTokenID", err)
	}
}

func TestBuiltinChatTemplateGolden(t *testing.T) {
	tools := []Tool{{Type: "function", Function: FunctionDef{Name: "get_weather", Description: "Weather now",
		Parameters: json.RawMessage(`{"type":"object","properties":{"city":{"type":"string"}}}`)}}}
	tests := []struct {
		name     string
		messages string
		opts     ChatOptions
	}{
		{"plain_generation_prompt", `[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}]`,
			ChatOptions{AddGenerationPrompt: true}},
		{"no_generation_prompt", `[{"role":"user","content":[{"type":"text","text":"Hel"},{"type":"text","text":"lo"}]}]`,
			ChatOptions{}},
		{"thinking_disabled", `[{"role":"user","content":"Hi"}]`,
			ChatOptions{AddGenerationPrompt: true, Kwargs: map[string]json.RawMessage{"enable_thinking": json.RawMessage("false")}}},
		{"tools_and_calls", `[{"role":"system","content":"Use tools."},{"role":"user","content":"Weather in Paris?"},
			{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},
			{"role":"tool","tool_call_id":"c1","content":"sunny"}]`,
			ChatOptions{AddGenerationPrompt: true, Tools: tools}},
		{"continue_final_message", `[{"role":"user","content":"Count"},{"role":"assistant","content":"1, 2,"}]`,
			ChatOptions{ContinueFinalMessage: true}},
	}
	tok := NewBuiltin()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var msgs []Message
			if err := json.Unmarshal([]byte(tt.messages), &msgs); err != nil {
				t.Fatal(err)
			}
			got, err := tok.ApplyChatTemplate(msgs, tt.opts)
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join("testdata", "chat_"+tt.name+".txt")
			if *rewrite {
				if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run with -rewrite to create)", err)
			}
			if got != string(want) {
				t.Fatalf("rendered:\n%s\nwant:\n%s", got, want)
			}
		})
	}
}

func TestBuiltinChatTemplateRejectsBadInput(t *testing.T) {
	tok := NewBuiltin()
	tests := []struct {
		name string
		msgs []Message
		opts ChatOptions
	}{
		{"empty role", []Message{{Content: "x"}}, ChatOptions{}},
		{"role with special marker", []Message{{Role: "user<|im_end|>", Content: "x"}}, ChatOptions{}},
		{"both prompt options", []Message{{Role: "assistant", Content: "x"}}, ChatOptions{AddGenerationPrompt: true, ContinueFinalMessage: true}},
		{"continue without assistant", []Message{{Role: "user", Content: "x"}}, ChatOptions{ContinueFinalMessage: true}},
		{"tool with invalid schema", []Message{{Role: "user", Content: "x"}},
			ChatOptions{Tools: []Tool{{Type: "function", Function: FunctionDef{Name: "f", Parameters: json.RawMessage("{")}}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := tok.ApplyChatTemplate(tt.msgs, tt.opts); !errors.Is(err, ErrInvalidMessages) {
				t.Fatalf("error = %v, want ErrInvalidMessages", err)
			}
		})
	}
}

func TestMessageContentFormsJoinLikeVLLM(t *testing.T) {
	tests := []struct {
		name    string
		json    string
		want    string
		media   []string
		wantErr bool
	}{
		{"string", `{"role":"user","content":"hi"}`, "hi", nil, false},
		{"null", `{"role":"assistant","content":null}`, "", nil, false},
		{"absent", `{"role":"assistant"}`, "", nil, false},
		{"text parts joined by newline", `{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}`, "a\nb", nil, false},
		{"empty and null texts skipped", `{"role":"user","content":[{"type":"text","text":""},{"type":"text","text":null},{"type":"text","text":"x"}]}`, "x", nil, false},
		{"bare strings, refusal, thinking, input_text", `{"role":"user","content":["s",{"type":"refusal","refusal":"r"},{"type":"thinking","thinking":"t"},{"type":"input_text","text":"i"}]}`, "s\nr\nt\ni", nil, false},
		{"empty part list", `{"role":"user","content":[]}`, "", nil, false},
		{"null part skipped", `{"role":"user","content":[null,"x"]}`, "x", nil, false},
		// Parts of any other type are kept by type, the text parts joined around them.
		{"image part", `{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}`, "", []string{"image_url"}, false},
		{"text around media", `{"role":"user","content":[{"type":"text","text":"what is"},{"type":"input_audio","input_audio":{"data":"AAAA","format":"wav"}},{"type":"text","text":"this?"},{"type":"video_url","video_url":{"url":"v"}},{"type":"file","file":{"file_data":"x"}}]}`,
			"what is\nthis?", []string{"input_audio", "video_url", "file"}, false},
		{"part without a type", `{"role":"user","content":[{"image_url":{"url":"x"}}]}`, "", []string{""}, false},
		{"a long type is clipped", `{"role":"user","content":[{"type":"` + strings.Repeat("t", 1000) + `"}]}`, "", []string{strings.Repeat("t", maxMediaType)}, false},
		{"number", `{"role":"user","content":3}`, "", nil, true},
		{"number part", `{"role":"user","content":["a",3]}`, "", nil, true},
		{"list part", `{"role":"user","content":[["a"]]}`, "", nil, true},
		{"type of the wrong type", `{"role":"user","content":[{"type":5}]}`, "", nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var m Message
			err := json.Unmarshal([]byte(tt.json), &m)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
			}
			if err != nil && !errors.Is(err, ErrInvalidMessages) {
				t.Fatalf("err = %v, want one wrapping ErrInvalidMessages", err)
			}
			if err == nil && (m.Content != tt.want || !slices.Equal(m.Media, tt.media)) {
				t.Fatalf("content = %q, media %q; want %q, %q", m.Content, m.Media, tt.want, tt.media)
			}
		})
	}
}

// A message with media decodes, but neither tokenizer renders it: its prompt is
// the model's multimodal processor's to build.
func TestChatTemplatesRefuseMedia(t *testing.T) {
	var msgs []Message
	if err := json.Unmarshal([]byte(`[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"what is this?"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}]}]`), &msgs); err != nil {
		t.Fatal(err)
	}
	for name, tok := range map[string]Tokenizer{"builtin": NewBuiltin(), "qwen3": variantTokenizer(t, "qwen3")} {
		_, err := tok.ApplyChatTemplate(msgs, ChatOptions{AddGenerationPrompt: true})
		if !errors.Is(err, ErrInvalidMessages) || !strings.Contains(err.Error(), "image_url") {
			t.Errorf("%s: %v, want ErrInvalidMessages naming the image_url part", name, err)
		}
	}
}

func FuzzBuiltinRoundTrip(f *testing.F) {
	for _, s := range []string{"", "hello", "<|im_start|>user\nx<|im_end|>", "<|<|bos|", "\xff"} {
		f.Add(s)
	}
	tok := NewBuiltin()
	f.Fuzz(func(t *testing.T, s string) {
		ids := tok.Encode(s, false)
		for _, id := range ids {
			if int(id) >= tok.VocabSize() {
				t.Fatalf("Encode(%q) produced id %d outside the vocabulary", s, id)
			}
		}
		back, err := tok.Decode(ids)
		if err != nil || back != s {
			t.Fatalf("Decode(Encode(%q)) = %q, %v", s, back, err)
		}
	})
}
