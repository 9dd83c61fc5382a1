// Package tokenizetest locates the real Hugging Face tokenizer files that tests
// compare against: scripts/fetch-tokenizers.sh (run by make test) puts Qwen3's and
// Llama 3's tokenizer.json and tokenizer_config.json under <repo>/.cache/tokenizers,
// or $KVINDEX_TEST_TOKENIZERS names another directory with qwen3/ and llama3/.
// Tests fail, never skip, when the files are missing. Safe for concurrent use.
package tokenizetest

import (
	"os"
	"path/filepath"
	"testing"
)

// Env names the directory holding qwen3/ and llama3/ when set.
const Env = "KVINDEX_TEST_TOKENIZERS"

// Dir returns the directory holding qwen3/ and llama3/, failing the test with
// instructions when the files are missing.
func Dir(t testing.TB) string {
	t.Helper()
	dir := os.Getenv(Env)
	if dir == "" {
		root, err := filepath.Abs(".")
		if err != nil {
			t.Fatal(err)
		}
		for {
			if _, err := os.Stat(filepath.Join(root, "go.mod")); err == nil {
				break
			}
			parent := filepath.Dir(root)
			if parent == root {
				t.Fatal("no go.mod above the test directory")
			}
			root = parent
		}
		dir = filepath.Join(root, ".cache", "tokenizers")
	}
	for _, model := range []string{"qwen3", "llama3"} {
		for _, f := range []string{"tokenizer.json", "tokenizer_config.json"} {
			if _, err := os.Stat(filepath.Join(dir, model, f)); err != nil {
				t.Fatalf("real tokenizer file missing: %v\nrun scripts/fetch-tokenizers.sh (make test does) or point %s at a directory with qwen3/ and llama3/", err, Env)
			}
		}
	}
	return dir
}
