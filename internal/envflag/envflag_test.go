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
