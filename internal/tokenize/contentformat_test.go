package tokenize

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// The detection agrees with vLLM's rules applied to Jinja2's syntax tree (the
// generator's content_format) on every template of testdata/chat/content_formats.json:
// loops over content in its spellings, message lists and message variables through
// set, slices, filters, tests and conditions, and the forms vLLM does not follow or
// gives up on.
func TestContentFormatDetectionMatchesVLLM(t *testing.T) {
	var table []struct{ Name, Template string }
	readJSON(t, filepath.Join("testdata", "chat", "content_formats.json"), &table)
	var golden struct {
		Formats map[string]ContentFormat `json:"formats"`
	}
	readJSON(t, filepath.Join("testdata", "chat", "golden_content_formats.json"), &golden)
	if len(table) < 20 {
		t.Fatalf("%d templates, want >= 20", len(table))
	}
	seen := map[ContentFormat]int{}
	for _, tt := range table {
		want, ok := golden.Formats[tt.Name]
		if !ok {
			t.Fatalf("%s missing from golden_content_formats.json (regenerate with testdata/gen/chat.py)", tt.Name)
		}
		seen[want]++
		tags, err := scanTags(jinjaLines(tt.Template))
		if err != nil {
			t.Fatalf("%s: %v", tt.Name, err)
		}
		got, err := ContentFormatAuto.resolve(tags)
		if err != nil || got != want {
			t.Errorf("%s: detected %q (%v), vLLM %q", tt.Name, got, err, want)
		}
	}
	if seen[ContentFormatOpenAI] < 5 || seen[ContentFormatString] < 5 {
		t.Fatalf("the table has %d openai and %d string templates, want both", seen[ContentFormatOpenAI], seen[ContentFormatString])
	}
}

func readJSON(t *testing.T, path string, v any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// --chat-template-content-format string or openai overrides the detection, as vLLM's
// does; auto (or unset) detects.
func TestContentFormatOptionOverridesDetection(t *testing.T) {
	const src = "{{ messages[0].content | tojson }}"
	msgs := []Message{{Role: "user", Content: "hi"}}
	tiny, err := json.Marshal(tinyTokenizer())
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		format ContentFormat
		want   string
	}{
		{"", `"hi"`},
		{ContentFormatAuto, `"hi"`},
		{ContentFormatString, `"hi"`},
		{ContentFormatOpenAI, `[{"type": "text", "text": "hi"}]`},
	} {
		tok, err := NewHFTokenizer("m", HFFiles{TokenizerJSON: tiny, ChatTemplate: []byte(src)}, Options{ContentFormat: tt.format})
		if err != nil {
			t.Fatal(err)
		}
		if got, err := tok.ApplyChatTemplate(msgs, ChatOptions{}); err != nil || got != tt.want {
			t.Errorf("format %q: rendered %q, %v; want %q", tt.format, got, err, tt.want)
		}
		// A template given later (vLLM's --chat-template) is rendered with the option too.
		again, err := tok.WithChatTemplate(src)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := again.ApplyChatTemplate(msgs, ChatOptions{}); err != nil || got != tt.want {
			t.Errorf("format %q, WithChatTemplate: rendered %q, %v; want %q", tt.format, got, err, tt.want)
		}
	}
	_, err = NewHFTokenizer("m", HFFiles{TokenizerJSON: tiny, ChatTemplate: []byte(src)}, Options{ContentFormat: "parts"})
	if !errors.Is(err, ErrNotSupported) {
		t.Fatalf("format \"parts\": error %v, want ErrNotSupported", err)
	}
}
