package tokenize

import (
	"encoding/json"
	"path/filepath"
	"testing"

	"github.com/ardanlabs/jinja"
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

// parseJSONValue reads what Python's json.loads reads, as it reads it (shown through
// tojson, which is json.dumps), and refuses what it refuses. The expectations are
// Python 3.11's.
func TestParseJSONValueIsJSONLoads(t *testing.T) {
	tests := []struct{ in, want string }{
		{`{"b": 1, "a": {"d": 1.0, "c": [1e3, -0.0, 2.50, 10]}}`, `{"b": 1, "a": {"d": 1.0, "c": [1000.0, -0.0, 2.5, 10]}}`},
		{`{"a": 1, "b": 2, "a": 3}`, `{"a": 3, "b": 2}`},
		{`[NaN, Infinity, -Infinity, 1e400, -1e400]`, `[NaN, Infinity, -Infinity, Infinity, -Infinity]`},
		{" \t\n{\"x\" : [ ] , \"y\":{}}\r\n", `{"x": [], "y": {}}`},
		{`"\u00e9\ud83d\ude00\n"`, `"é😀\n"`},
		{`9223372036854775807`, `9223372036854775807`},
		{`-9223372036854775808`, `-9223372036854775808`},
		{`1E+2`, `100.0`},
		{`0.5e-3`, `0.0005`},
		{`Infinity`, `Infinity`},
		{`-Infinity`, `-Infinity`},
		{`[true,false,null]`, `[true, false, null]`},
	}
	for _, tt := range tests {
		v, err := parseJSONValue([]byte(tt.in))
		if err != nil {
			t.Errorf("%q: %v", tt.in, err)
			continue
		}
		got, err := tojsonFilter([]jinja.Value{v}, nil)
		if err != nil || got.AsString() != tt.want {
			t.Errorf("%q read as %v (%v), json.loads reads %s", tt.in, got, err, tt.want)
		}
	}
	for _, in := range []string{`[1,]`, `{'a': 1}`, `nan`, `-NaN`, `+1`, `01`, `1.`, `.5`, "\"a\tb\"", `{"a" 1}`, `[1 2]`,
		`"\x41"`, `NaN1`, `true false`, ``, `{"a":1,}`, `"open`} {
		if v, err := parseJSONValue([]byte(in)); err == nil {
			t.Errorf("%q read as %v; json.loads refuses it", in, v)
		}
	}
}
