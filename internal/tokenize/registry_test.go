package tokenize

import (
	"errors"
	"flag"
	"os"
	"slices"
	"testing"
)

func TestRegistryLookup(t *testing.T) {
	r := NewRegistry()
	b := NewBuiltin()
	r.Register("m1", b)
	if got, err := r.Lookup("m1"); err != nil || got != Tokenizer(b) {
		t.Fatalf("Lookup(m1) = %v, %v", got, err)
	}
	if _, err := r.Lookup("m2"); !errors.Is(err, ErrUnknownModel) {
		t.Fatalf("Lookup(m2) error = %v, want ErrUnknownModel", err)
	}
	r.Register("a", b)
	if got := r.Models(); !slices.Equal(got, []string{"a", "m1"}) {
		t.Fatalf("Models() = %v", got)
	}
}

func TestParseSpec(t *testing.T) {
	tests := []struct {
		in      string
		want    Spec
		wantErr bool
	}{
		{"meta-llama/Llama-3.1-8B=/models/llama", Spec{"meta-llama/Llama-3.1-8B", "/models/llama"}, false},
		{"a=b=c", Spec{}, true},
		// Two specs joined with ',' instead of ';'.
		{"Qwen/Qwen3-8B=/models/qwen3,meta-llama/Llama-3.1-8B=/models/llama", Spec{}, true},
		{"noequals", Spec{}, true},
		{"=dir", Spec{}, true},
		{"model=", Spec{}, true},
	}
	for _, tt := range tests {
		got, err := ParseSpec(tt.in)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("ParseSpec(%q) = %v, %v; want %v, err=%v", tt.in, got, err, tt.want, tt.wantErr)
		}
		if err != nil && !errors.Is(err, ErrBadSpec) {
			t.Errorf("ParseSpec(%q) error %v does not wrap ErrBadSpec", tt.in, err)
		}
	}
}

func TestSpecsIsARepeatableFlag(t *testing.T) {
	var specs Specs
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	fs.Var(&specs, "tokenizer", "")
	if err := fs.Parse([]string{"--tokenizer", "a=/x", "--tokenizer=b=/y;c=/z;"}); err != nil {
		t.Fatal(err)
	}
	if want := (Specs{{"a", "/x"}, {"b", "/y"}, {"c", "/z"}}); !slices.Equal(specs, want) {
		t.Fatalf("specs = %v, want %v", specs, want)
	}
	// String is a value Set takes back.
	var again Specs
	if err := again.Set(specs.String()); err != nil || !slices.Equal(again, specs) {
		t.Fatalf("Set(String() = %q) = %v, %v; want %v", specs.String(), again, err, specs)
	}
	for _, bad := range []string{"", ";", "a=/x;b"} {
		var s Specs
		if err := s.Set(bad); !errors.Is(err, ErrBadSpec) || len(s) != 0 {
			t.Errorf("Set(%q) = %v, specs %v; want ErrBadSpec and nothing added", bad, err, s)
		}
	}
}

func TestLoadDirectoryWithoutTokenizerJSONFails(t *testing.T) {
	_, err := Load(Spec{"m", t.TempDir()}, Options{})
	if !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Load(empty dir) error = %v, want one wrapping os.ErrNotExist", err)
	}
}
