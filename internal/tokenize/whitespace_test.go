package tokenize

import (
	"os"
	"path/filepath"
	"testing"
)

// FuzzWhitespaceControl: any source is either left to the caller (ok false) or
// becomes one that lexes whenever the source did, with no text left between tags
// for the engine's own trimming to reach.
func FuzzWhitespaceControl(f *testing.F) {
	for _, name := range testTemplates {
		src, err := os.ReadFile(filepath.Join("testdata", "chat", name+".jinja"))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(string(src))
	}
	f.Add("{%- if x -%} a {{- y -}} b {%+ endif +%}\n {# c -#} d")
	f.Add("{% raw %}{{ x }}{% endraw %}")
	f.Add(`a "\ b {{ '"' }} {#-#}{%-%}`)
	f.Fuzz(func(t *testing.T, src string) {
		src = jinjaLines(src)
		out, ok := applyWhitespaceControl(src)
		if !ok {
			return
		}
		if _, err := scanTags(src); err != nil {
			return
		}
		if _, err := scanTags(out); err != nil {
			t.Fatalf("%q lexes, but what it became does not: %q: %v", src, out, err)
		}
		if open := tagOpen(out, 0); out != "" && open != 0 {
			t.Fatalf("%q became %q, which starts with text", src, out)
		}
	})
}
