package fakeengine

import (
	"testing"

	"github.com/kvindex/kvindex/internal/tokenize"
)

func FuzzPromptTokens(f *testing.F) {
	for _, s := range []string{`"hi"`, `[1,2,3]`, `[[1,2]]`, `["a"]`, `[]`, `null`, `[1,"a"]`, `[-1]`, `[4294967296]`, `{"a":1}`, `[["a"],["b"]]`} {
		f.Add([]byte(s))
	}
	tok := tokenize.NewBuiltin()
	f.Fuzz(func(t *testing.T, raw []byte) {
		ids, err := promptTokens(raw, tok, false)
		if err == nil && ids == nil {
			t.Fatalf("promptTokens(%q) gave neither ids nor an error", raw)
		}
	})
}

func FuzzFaultsPatch(f *testing.F) {
	for _, s := range []string{`{}`, `{"fail_rate":0.5}`, `{"hang_before_first_token":"1s"}`, `{"fail_status":429}`, `[`, `{"drop_every_n_batches":-1}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		got, err := DefaultConfig().Faults.patch(raw)
		if err == nil {
			if verr := got.validate(); verr != nil {
				t.Fatalf("patch(%q) accepted invalid faults %+v: %v", raw, got, verr)
			}
		}
	})
}
