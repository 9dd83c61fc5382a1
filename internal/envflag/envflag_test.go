package envflag

import (
	"bytes"
	"flag"
	"strings"
	"testing"
)

func TestPrecedenceFlagsOverEnvOverDefaults(t *testing.T) {
	env := map[string]string{"KVINDEX_GRPC_ADDR": "10.0.0.1:1", "KVINDEX_BLOCK_SIZE": "32", "KVINDEX_VERBOSE": "true"}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	tests := []struct {
		name      string
		args      []string
		wantAddr  string
		wantBlock int
		wantDebug bool
	}{
		{"env fills unset flags", nil, "10.0.0.1:1", 32, true},
		{"flag beats env", []string{"--grpc-addr", "127.0.0.1:9", "--block-size=64"}, "127.0.0.1:9", 64, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fs := flag.NewFlagSet("x", flag.ContinueOnError)
			addr := fs.String("grpc-addr", "127.0.0.1:7070", "")
			block := fs.Int("block-size", 16, "")
			debug := fs.Bool("verbose", false, "")
			missing := fs.String("unset-in-env", "default", "")
			if err := Parse(fs, "KVINDEX_", tt.args, lookup); err != nil {
				t.Fatal(err)
			}
			if *addr != tt.wantAddr || *block != tt.wantBlock || *debug != tt.wantDebug || *missing != "default" {
				t.Errorf("got addr=%q block=%d verbose=%v unset=%q; want %q %d %v %q",
					*addr, *block, *debug, *missing, tt.wantAddr, tt.wantBlock, tt.wantDebug, "default")
			}
		})
	}
}

// A one-letter flag is a short form: no variable fills it, so the long form
// from the command line is never beaten by the environment (KVINDEX_O=yaml
// used to override --output json), and usage names no variable for it.
func TestShortFlagsHaveNoVariable(t *testing.T) {
	lookup := func(k string) (string, bool) { return "yaml", k == "KVINDEX_O" || k == "KVINDEX_OUTPUT" }
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	var buf bytes.Buffer
	fs.SetOutput(&buf)
	short := fs.String("o", "", "short for --output")
	long := fs.String("output", "table", "")
	if err := Parse(fs, "KVINDEX_", []string{"--output", "json"}, lookup); err != nil {
		t.Fatal(err)
	}
	if *short != "" || *long != "json" {
		t.Errorf("-o %q, --output %q: want the short form unset by the environment and --output json", *short, *long)
	}
	Usage(fs, "KVINDEX_", "usage: x [flags]")()
	if strings.Contains(buf.String(), "$KVINDEX_O]") {
		t.Errorf("usage names a variable for -o:\n%s", buf.String())
	}
}

func TestBadEnvValueNamesTheVariable(t *testing.T) {
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	fs.Int("block-size", 16, "")
	lookup := func(k string) (string, bool) { return "sixteen", k == "KVINDEX_BLOCK_SIZE" }
	err := Parse(fs, "KVINDEX_", nil, lookup)
	if err == nil || !strings.Contains(err.Error(), "KVINDEX_BLOCK_SIZE") {
		t.Fatalf("want error naming KVINDEX_BLOCK_SIZE, got %v", err)
	}
}

func TestUsageListsEveryFlagWithItsEnvVar(t *testing.T) {
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	var buf bytes.Buffer
	fs.SetOutput(&buf)
	fs.String("nats-url", "", "NATS server `url`")
	fs.Int("block-size", 16, "tokens per block")
	Usage(fs, "KVINDEX_", "usage: x [flags]")()
	out := buf.String()
	for _, want := range []string{"--nats-url url", "$KVINDEX_NATS_URL", "--block-size", "(default 16)", "$KVINDEX_BLOCK_SIZE"} {
		if !strings.Contains(out, want) {
			t.Errorf("usage lacks %q:\n%s", want, out)
		}
	}
}

func TestListTrimsAndReplaces(t *testing.T) {
	var items []string
	l := List{Items: &items}
	if err := l.Set(" a, b,,c "); err != nil || l.String() != "a,b,c" {
		t.Fatalf("Set = %v, String = %q; want a,b,c", err, l.String())
	}
	if err := l.Set("d"); err != nil || len(items) != 1 || items[0] != "d" {
		t.Fatalf("a second Set gave %v, want it to replace the list with [d]", items)
	}
	if (List{}).String() != "" {
		t.Fatal("the zero List does not print empty")
	}
}
