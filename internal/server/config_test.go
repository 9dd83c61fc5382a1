package server

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	kvindexv1 "github.com/kvindex/kvindex/api/proto/kvindex/v1"
	"github.com/kvindex/kvindex/internal/ingest"
)

func env(vars map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) {
		v, ok := vars[k]
		return v, ok
	}
}

func TestDefaultsAreValidAndDocumented(t *testing.T) {
	cfg, err := ParseFlags(nil, &bytes.Buffer{}, env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.GRPCAddr != "127.0.0.1:7070" || cfg.HTTPAddr != "127.0.0.1:7080" || cfg.Raft.RaftAddr != "127.0.0.1:7090" ||
		cfg.Join != "" || cfg.Ingest.Transport != ingest.TransportZMQ ||
		cfg.Ingest.NATSSubjectPrefix != "kv.events" || cfg.Ingest.DefaultBlockSize != 16 ||
		cfg.WorkerDeadAfter != 30*time.Second || cfg.WorkerHealthInterval != 5*time.Second ||
		cfg.ReadyMaxLag != DefaultReadyMaxLag || DefaultReadyMaxLag != 256 { // docs/api.md: 256
		t.Errorf("defaults = %+v", cfg)
	}
	var help bytes.Buffer
	if _, err := ParseFlags([]string{"--help"}, &help, env(nil)); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("--help = %v", err)
	}
	if cfg.ProbeAddr != "" {
		t.Errorf("--probe-addr defaults to %q, want off", cfg.ProbeAddr)
	}
	for _, name := range []string{"node-id", "data-dir", "grpc-addr", "http-addr", "probe-addr", "zmq-bind", "worker", "workers-file",
		"kv-event-transport", "nats-url", "nats-subject-prefix", "block-size", "max-body-bytes", "config",
		"tls-cert", "tls-key", "tls-client-ca", "admin-token", "ledger-token", "insecure-no-admin-token", "raft-tls-ca", "raft-tls-cert", "raft-tls-key",
		"http-read-timeout", "http-write-timeout", "max-discovered-workers", "max-discovered-dp-ranks", "discover-allow", "discover-replay-allow", "bind-replay-pattern", "ready-max-lag", "http-idle-timeout", "grpc-max-concurrent-streams", "max-watch-streams", "tokenizer", "fallback-tokenizer", "max-prompt-tokens", "watch-buffer",
		"worker-dead-after", "worker-health-interval", "raft-addr", "raft-advertise", "grpc-advertise", "bootstrap", "bootstrap-peers", "join", "raft-batch-max-events", "raft-batch-max-wait",
		"raft-snapshot-threshold", "raft-trailing-logs",
		"kube-selector", "kube-namespace", "kubeconfig", "kube-http-port", "kube-default-model", "kube-resync", "kube-unready-grace"} {
		if !strings.Contains(help.String(), "--"+name+" ") {
			t.Errorf("--help does not document --%s", name)
		}
		if !strings.Contains(help.String(), "$KVINDEX_"+strings.ToUpper(strings.ReplaceAll(name, "-", "_"))) {
			t.Errorf("--help does not name the variable of --%s", name)
		}
	}
}

// Flags beat KVINDEX_* variables, which beat the --config file, which beats the
// defaults; a --worker on the command line replaces the file's workers.
func TestConfigPrecedence(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "indexer.yaml")
	file := `node-id: from-file
http-addr: 127.0.0.1:9001
grpc-addr: 127.0.0.1:9002
block-size: 32
replay-timeout: 3s
worker:
  - id=f1,model=M,endpoint=tcp://10.0.0.1:5557
  - id=f2,model=M
tokenizer:
  - M=builtin
admin-token: from-file
`
	if err := os.WriteFile(path, []byte(file), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := ParseFlags([]string{"--config", path, "--http-addr=127.0.0.1:9100"}, &bytes.Buffer{},
		env(map[string]string{"KVINDEX_HTTP_ADDR": "127.0.0.1:9200", "KVINDEX_GRPC_ADDR": "127.0.0.1:9300"}))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.NodeID != "from-file" || cfg.HTTPAddr != "127.0.0.1:9100" || cfg.GRPCAddr != "127.0.0.1:9300" ||
		cfg.Ingest.DefaultBlockSize != 32 || cfg.Ingest.ReplayTimeout != 3*time.Second || len(cfg.Ingest.Workers) != 2 ||
		len(cfg.Tokenizers) != 1 || cfg.Tokenizers[0].Dir != "builtin" || cfg.AdminToken != "from-file" {
		t.Errorf("precedence wrong: %+v", cfg)
	}
	// --help shows the file's values as defaults, but never its tokens.
	secret := filepath.Join(dir, "secret.yaml")
	if err := os.WriteFile(secret, []byte("admin-token: s3cret-token\nledger-token: l3dger-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var help bytes.Buffer
	if _, err := ParseFlags([]string{"--config", secret, "--help"}, &help, env(nil)); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("--help = %v", err)
	}
	if h := help.String(); strings.Contains(h, "s3cret-token") || strings.Contains(h, "l3dger-token") || strings.Count(h, "(default <set by --config>)") != 2 {
		t.Errorf("--help must not print the --config file's admin and ledger tokens, only that they are set:\n%s", h)
	}
	cfg, err = ParseFlags([]string{"--worker", "id=cli,model=M"}, &bytes.Buffer{}, env(map[string]string{"KVINDEX_CONFIG": path}))
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Ingest.Workers) != 1 || cfg.Ingest.Workers[0].ID != "cli" || cfg.NodeID != "from-file" {
		t.Errorf("--worker should replace the file's workers: %+v", cfg.Ingest.Workers)
	}
	cfg, err = ParseFlags([]string{"--worker", "id=a,model=M", "--worker", "id=b,model=M"}, &bytes.Buffer{}, env(nil))
	if err != nil || len(cfg.Ingest.Workers) != 2 {
		t.Errorf("repeated --worker = %+v, %v", cfg.Ingest.Workers, err)
	}
	// A variable is set once: ';' separates the workers of KVINDEX_WORKER.
	cfg, err = ParseFlags(nil, &bytes.Buffer{}, env(map[string]string{"KVINDEX_WORKER": "id=a,model=M; id=b,model=M;"}))
	if err != nil || len(cfg.Ingest.Workers) != 2 || cfg.Ingest.Workers[1].ID != "b" {
		t.Errorf("KVINDEX_WORKER with two workers = %+v, %v", cfg.Ingest.Workers, err)
	}
	if _, err := ParseFlags([]string{"--worker", " ; "}, &bytes.Buffer{}, env(nil)); err == nil {
		t.Error("--worker naming no worker was accepted")
	}
}

// TestNonLoopbackListenersNeedATokenOrTheInsecureFlag: beyond loopback, a node
// starts with --admin-token or with --insecure-no-admin-token, never silently
// open; a --ledger-token needs an --admin-token wherever the node listens.
func TestNonLoopbackListenersNeedATokenOrTheInsecureFlag(t *testing.T) {
	for _, c := range []struct {
		args []string
		ok   bool
	}{
		{[]string{"--grpc-addr", "127.0.0.1:7070", "--http-addr", "localhost:7080"}, true},
		{[]string{"--grpc-addr", "[::1]:7070"}, true},
		{[]string{"--grpc-addr", "0.0.0.0:7070"}, false},
		{[]string{"--http-addr", "10.1.2.3:7080"}, false},
		{[]string{"--grpc-addr", "0.0.0.0:7070", "--admin-token", "t"}, true},
		{[]string{"--grpc-addr", "0.0.0.0:7070", "--insecure-no-admin-token"}, true},
		// A ledger token opens LoadService only: it does not stand for an admin token.
		{[]string{"--grpc-addr", "0.0.0.0:7070", "--ledger-token", "l", "--insecure-no-admin-token"}, false},
		{[]string{"--grpc-addr", "0.0.0.0:7070", "--admin-token", "t", "--ledger-token", "l"}, true},
		// The probe listener serves health and metrics only: no admin call to guard.
		{[]string{"--probe-addr", "0.0.0.0:7081"}, true},
	} {
		_, err := ParseFlags(append(c.args, "--raft-advertise", "10.0.0.1:7090"), &bytes.Buffer{}, env(nil))
		if (err == nil) != c.ok {
			t.Errorf("ParseFlags(%q) = %v, want ok=%v", c.args, err, c.ok)
		}
	}
}

func TestBadConfigNamesTheFlag(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, c := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"--http-addr", "nocolon"}, nil, "--http-addr=\"nocolon\""},
		{nil, map[string]string{"KVINDEX_PROBE_ADDR": "7081"}, "--probe-addr=\"7081\""},
		{[]string{"--kv-event-transport", "kafka"}, nil, "--kv-event-transport=\"kafka\""},
		{[]string{"--kv-event-transport", "nats"}, nil, "needs --nats-url"},
		{[]string{"--worker", "id=w1"}, nil, "model must not be empty"},
		{[]string{"--log-level", "loud"}, nil, "--log-level=\"loud\""},
		{[]string{"--max-body-bytes", "10"}, nil, "--max-body-bytes=10"},
		{[]string{"--raft-batch-max-events", "0"}, nil, "--raft-batch-max-events = 0"},
		{[]string{"--raft-addr", "nocolon"}, nil, "--raft-addr=\"nocolon\""},
		{[]string{"--join", "127.0.0.1"}, nil, "--join=\"127.0.0.1\""},
		{[]string{"--join", "127.0.0.1:7070", "--bootstrap"}, nil, "give one of them"},
		{[]string{"--join", "127.0.0.1:7070", "--bootstrap-peers", "127.0.0.1:7071"}, nil, "give one of them"},
		{[]string{"--bootstrap", "--bootstrap-peers", "127.0.0.1:7071"}, nil, "give one of them"},
		{nil, map[string]string{"KVINDEX_BOOTSTRAP_PEERS": "127.0.0.1:7071,nocolon"}, "--bootstrap-peers: \"nocolon\""},
		{[]string{"--raft-leader-lease-timeout", "5s"}, nil, "--raft-leader-lease-timeout"},
		{[]string{"--max-prompt-tokens", "0"}, nil, "--max-prompt-tokens=0"},
		{[]string{"--tls-key", "k.pem"}, nil, "--tls-cert and --tls-key go together"},
		{[]string{"--tokenizer", "no-equals-sign"}, nil, "want <model>=<dir>"},
		{[]string{"stray"}, nil, "unexpected argument"},
		{[]string{"--grpc-addr", "0.0.0.0:7070"}, nil, "--grpc-addr=0.0.0.0:7070 listens beyond loopback without --admin-token"},
		{[]string{"--ledger-token", "l"}, nil, "--ledger-token is set without --admin-token"},
		{nil, map[string]string{"KVINDEX_LEDGER_TOKEN": "l"}, "--ledger-token is set without --admin-token"},
		{[]string{"--http-addr", ":7080"}, nil, "--http-addr=:7080 listens beyond loopback"},
		{[]string{"--http-read-timeout", "0s"}, nil, "--http-read-timeout=0s"},
		{[]string{"--max-watch-streams", "0"}, nil, "--max-watch-streams=0"},
		{[]string{"--max-discovered-workers", "-1"}, nil, "--max-discovered-workers=-1"},
		{[]string{"--max-discovered-dp-ranks", "0"}, nil, "--max-discovered-dp-ranks=0"},
		{[]string{"--discover-allow", "pod-["}, nil, "--discover-allow pattern \"pod-[\""},
		{[]string{"--discover-replay-allow", "nats://*"}, nil, "must start with tcp://"},
		{[]string{"--grpc-max-concurrent-streams", "0"}, nil, "--grpc-max-concurrent-streams=0"},
		{[]string{"--worker-dead-after", "-1s"}, nil, "--worker-dead-after=-1s"},
		{[]string{"--worker-health-interval", "0s"}, nil, "--worker-health-interval=0s"},
		{[]string{"--worker-dead-after", "10s", "--worker-health-interval", "20s"}, nil, "at most --worker-dead-after=10s"},
		{[]string{"--kube-selector", "app==("}, nil, "--kube-selector=\"app==(\""},
		{[]string{"--kube-http-port", "0"}, nil, "--kube-http-port=0"},
		{[]string{"--kube-resync", "0s"}, nil, "--kube-resync=0s"},
		{[]string{"--kube-unready-grace", "-1s"}, nil, "--kube-unready-grace=-1s"},
		{[]string{"--kube-selector", "app=vllm", "--max-discovered-workers", "0"}, nil, "--max-discovered-workers=0 allows none"},
		{nil, map[string]string{"KVINDEX_BLOCK_SIZE": "many"}, "KVINDEX_BLOCK_SIZE"},
		{[]string{"--config", write("unknown.yaml", "colour: red\n")}, nil, `unknown key "colour"`},
		{[]string{"--config", write("list.yaml", "node-id: [a, b]\n")}, nil, "node-id takes one value"},
		{[]string{"--config", write("nested.yaml", "worker:\n  - {id: w}\n")}, nil, "want a scalar"},
		{[]string{"--config", filepath.Join(dir, "missing.yaml")}, nil, "--config"},
	} {
		_, err := ParseFlags(c.args, &bytes.Buffer{}, env(c.env))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ParseFlags(%q, %v) = %v, want an error mentioning %q", c.args, c.env, err, c.want)
		}
	}
}

// --max-body-bytes is the gRPC receive limit too: below the shared ledger's
// largest message the leader would refuse the routers' reports, so the node
// refuses to start, naming the value and the least it takes. The ledger is
// always served, so this holds whatever else is set.
func TestMaxBodyBytesHoldsTheLedgersMessages(t *testing.T) {
	least := kvindexv1.LedgerMinRecvBytes
	for _, c := range []struct {
		name  string
		value int
		ok    bool
	}{
		{"the default", int(DefaultConfig().MaxBodyBytes), true},
		{"the least", least, true},
		{"one byte less", least - 1, false},
		{"one ledger message's worth of decisions", kvindexv1.LedgerMaxMessageBytes, false},
		{"the old floor", 1024, false},
		{"zero", 0, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			args := []string{"--max-body-bytes", strconv.Itoa(c.value)}
			cfg, err := ParseFlags(args, &bytes.Buffer{}, env(nil))
			if c.ok {
				if err != nil || cfg.MaxBodyBytes != int64(c.value) {
					t.Fatalf("--max-body-bytes=%d: %v", c.value, err)
				}
				return
			}
			want := fmt.Sprintf("--max-body-bytes=%d is below %d", c.value, least)
			if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), want) {
				t.Fatalf("--max-body-bytes=%d: %v, want ErrInvalidConfig saying %q", c.value, err, want)
			}
		})
	}
}

// TestBootstrapPeersFlag: --bootstrap-peers (or KVINDEX_BOOTSTRAP_PEERS) is a
// comma-separated list, and a node with it does not bootstrap raft at start
// (bootstrap.go decides).
func TestBootstrapPeersFlag(t *testing.T) {
	cfg, err := ParseFlags(nil, &bytes.Buffer{}, env(map[string]string{"KVINDEX_BOOTSTRAP_PEERS": "a.ns.svc:7070, b.ns.svc:7070"}))
	if err != nil || !slices.Equal(cfg.BootstrapPeers, []string{"a.ns.svc:7070", "b.ns.svc:7070"}) || cfg.raftConfig().Bootstrap {
		t.Errorf("KVINDEX_BOOTSTRAP_PEERS: peers %q, raft bootstrap at start %v, %v", cfg.BootstrapPeers, cfg.raftConfig().Bootstrap, err)
	}
	if cfg, err := ParseFlags(nil, &bytes.Buffer{}, env(nil)); err != nil || !cfg.raftConfig().Bootstrap {
		t.Errorf("without --join and --bootstrap-peers a new node must bootstrap at start: %v", err)
	}
}

// TestLedgerTokenFlag: --ledger-token (or KVINDEX_LEDGER_TOKEN) sets
// Config.LedgerToken next to an admin token; one equal to the admin token
// gives nothing more but is accepted.
func TestLedgerTokenFlag(t *testing.T) {
	cfg, err := ParseFlags([]string{"--admin-token", "a"}, &bytes.Buffer{}, env(map[string]string{"KVINDEX_LEDGER_TOKEN": "l"}))
	if err != nil || cfg.AdminToken != "a" || cfg.LedgerToken != "l" {
		t.Errorf("KVINDEX_LEDGER_TOKEN: %+v, %v", cfg, err)
	}
	cfg, err = ParseFlags([]string{"--admin-token", "same", "--ledger-token", "same"}, &bytes.Buffer{}, env(nil))
	if err != nil || cfg.LedgerToken != "same" {
		t.Errorf("a ledger token equal to the admin token: %+v, %v", cfg, err)
	}
}
