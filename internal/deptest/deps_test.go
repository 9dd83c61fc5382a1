package deptest

import (
	"encoding/json"
	"io"
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/kvindex/kvindex/"

// rules says, per package, which of our packages it may import (directly or not) and
// which outside modules it must never pull in.
var rules = []struct {
	pkg        string
	mayImport  []string // of ours, as path prefixes under the module; nil = none
	mustAvoid  []string // outside import path prefixes
	stdlibOnly bool     // besides mayImport and allowThird
	allowThird []string
}{
	{pkg: "internal/kvblock", stdlibOnly: true, allowThird: []string{"github.com/zeebo/xxh3", "github.com/klauspost/cpuid"}},
	{pkg: "internal/radix", stdlibOnly: true},
	{pkg: "internal/workerspec", stdlibOnly: true, allowThird: []string{"gopkg.in/yaml.v3"}},
	{pkg: "internal/ingest/wire", mayImport: []string{"internal/radix"}, stdlibOnly: true,
		allowThird: []string{"github.com/vmihailenco/msgpack", "github.com/vmihailenco/tagparser"}},
	{pkg: "internal/ingest", mayImport: []string{"internal/ingest/wire", "internal/kvblock", "internal/radix", "internal/workerspec"},
		mustAvoid: []string{"github.com/hashicorp/raft", "google.golang.org/grpc"}},
	{pkg: "internal/raftstore", mayImport: []string{"internal/kvblock", "internal/radix", "internal/ingest", "internal/workerspec"},
		mustAvoid: []string{"google.golang.org/grpc"}},
	{pkg: "internal/tokenize", mayImport: nil,
		mustAvoid: []string{"github.com/hashicorp/raft", "github.com/pebbe/zmq4", "google.golang.org/grpc"}},
	{pkg: "internal/openai", mayImport: []string{"internal/tokenize"},
		mustAvoid: []string{"github.com/hashicorp/raft", "github.com/pebbe/zmq4", "google.golang.org/grpc"}},
	{pkg: "internal/console", stdlibOnly: true},
	{pkg: "internal/ledgerq", mayImport: []string{"api/"},
		mustAvoid: []string{"github.com/hashicorp/raft", "github.com/pebbe/zmq4", "go.etcd.io/bbolt", "k8s.io/"}},
	{pkg: "internal/router", mayImport: []string{"api/", "clients/go", "internal/console", "internal/ledgerq", "internal/retry", "internal/kvblock", "internal/tokenize", "internal/openai", "internal/workerspec", "internal/envflag", "internal/logging"},
		mustAvoid: []string{"github.com/hashicorp/raft", "github.com/hashicorp/raft-boltdb", "github.com/pebbe/zmq4", "go.etcd.io/bbolt", "k8s.io/", "helm.sh/"}},
	{pkg: "internal/kube", mayImport: []string{"internal/workerspec"},
		mustAvoid: []string{"github.com/hashicorp/raft", "github.com/pebbe/zmq4", "go.etcd.io/bbolt", "helm.sh/"}},
	{pkg: "internal/retry", stdlibOnly: true},
	{pkg: "clients/go", mayImport: []string{"api/", "internal/retry"},
		mustAvoid: []string{"github.com/hashicorp/raft", "github.com/hashicorp/raft-boltdb", "github.com/pebbe/zmq4"}},
}

type listed struct {
	ImportPath string
	Deps       []string
	Standard   bool
}

func deps(t *testing.T, pkg string) []listed {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", "-json", module+pkg).Output()
	if err != nil {
		t.Fatalf("go list %s: %v", pkg, err)
	}
	var all []listed
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var l listed
		if err := dec.Decode(&l); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		all = append(all, l)
	}
	return all
}

func hasPrefix(s string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

func TestPackagesImportOnlyDown(t *testing.T) {
	for _, r := range rules {
		t.Run(r.pkg, func(t *testing.T) {
			for _, d := range deps(t, r.pkg) {
				path := d.ImportPath
				switch {
				case path == module+r.pkg:
				case strings.HasPrefix(path, module):
					if !hasPrefix(strings.TrimPrefix(path, module), r.mayImport) {
						t.Errorf("%s imports %s, which lies above it or beside it", r.pkg, path)
					}
				case d.Standard || strings.HasPrefix(path, "vendor/") || strings.HasPrefix(path, "internal/"):
				case hasPrefix(path, r.mustAvoid):
					t.Errorf("%s pulls in %s", r.pkg, path)
				case r.stdlibOnly && !hasPrefix(path, r.allowThird) && !strings.HasPrefix(path, "golang.org/x/sys/cpu"):
					t.Errorf("%s must stay on the standard library, but pulls in %s", r.pkg, path)
				}
			}
		})
	}
}
