package tokenize

import (
	"encoding/json"
	"path/filepath"
	"testing"
)

// dict(k=v, ...) renders its keys in call order, every time, as Jinja2 (Python's dict)
// does: 50 renders of the pyvalues template are all Jinja2's.
func TestDictKeepsKeywordOrder(t *testing.T) {
	var golden struct {
		Cases map[string]struct{ Prompt string } `json:"cases"`
	}
	readJSON(t, filepath.Join("testdata", "chat", "golden_pyvalues.json"), &golden)
	want := golden.Cases["user_only"].Prompt
	tok := chatTemplateTokenizer(t, "pyvalues")
	var msgs []Message
	if err := json.Unmarshal([]byte(`[{"role": "user", "content": "Hello!"}]`), &msgs); err != nil {
		t.Fatal(err)
	}
	for i := range 50 {
		got, err := tok.ApplyChatTemplate(msgs, ChatOptions{AddGenerationPrompt: true})
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Fatalf("render %d:\n%s\nJinja2 rendered\n%s", i, got, want)
		}
	}
}
