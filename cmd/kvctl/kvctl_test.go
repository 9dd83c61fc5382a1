package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	kvindexv1 "github.com/kvindex/kvindex/api/proto/kvindex/v1"
	"github.com/kvindex/kvindex/bench/fakeengine"
	"github.com/kvindex/kvindex/internal/ingest"
	"github.com/kvindex/kvindex/internal/server"
	"github.com/kvindex/kvindex/internal/tokenize"
	"github.com/kvindex/kvindex/internal/workerspec"
)

const model = "kvctl/model"

// startIndexer runs an indexer following one fake engine that cached prompt.
func startIndexer(t *testing.T, prompt []uint32) string {
	t.Helper()
	ec := fakeengine.DefaultConfig()
	ec.Model, ec.Port, ec.TimeScale, ec.BlockSize, ec.NumGPUBlocks = model, 0, 0, 4, 256
	ec.KVEventsEndpoint, ec.KVEventsReplayEndpoint = "tcp://127.0.0.1:*", "tcp://127.0.0.1:*"
	e, err := fakeengine.New(ec, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	// No block-size: --block-size (DefaultBlockSize) applies, and kvctl workers shows it.
	spec, err := workerspec.Parse(fmt.Sprintf("id=eng,model=%s,endpoint=%s,replay=%s", model, e.EventEndpoints()[0], e.ReplayEndpoints()[0]))
	if err != nil {
		t.Fatal(err)
	}
	cfg := server.DefaultConfig()
	cfg.NodeID = "kvctl-node"
	cfg.HTTPAddr, cfg.GRPCAddr, cfg.Raft.RaftAddr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	cfg.DataDir = t.TempDir()
	cfg.AdminToken = "tok"
	// gone's engine is not there: its health endpoint refuses connections, so
	// the indexer declares it dead (another model, so that scores leave it out).
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln.Close()
	gone := workerspec.Spec{ID: "gone", Model: "kvctl/gone", HTTP: "http://" + ln.Addr().String()}
	cfg.Ingest.Workers = []workerspec.Spec{spec, gone}
	cfg.WorkerDeadAfter, cfg.WorkerHealthInterval = 200*time.Millisecond, 50*time.Millisecond
	cfg.Ingest.DefaultBlockSize = 4
	cfg.Ingest.IdleReplayInterval = 50 * time.Millisecond
	cfg.Tokenizers = tokenize.Specs{{Model: model, Dir: server.BuiltinTokenizer}}
	srv, err := server.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	if _, err := e.Generate(ctx, fakeengine.Request{Prompt: prompt, MaxTokens: 1}); err != nil {
		t.Fatal(err)
	}
	if err := e.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	last := e.CacheTruth().Ranks[0].LastSeq
	for deadline := time.Now().Add(30 * time.Second); ; {
		if c, ok := srv.Applier().Cursor(ingest.Stream{Worker: "eng"}); ok && int64(c.Seq) >= last {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the indexer never caught up")
		}
		time.Sleep(5 * time.Millisecond)
	}
	return srv.GRPCAddr()
}

func TestCommands(t *testing.T) {
	prompt := tokenize.NewBuiltin().Encode("kvctl scores this prompt", true) // 25 tokens: 6 blocks
	addr := startIndexer(t, prompt)
	ids := make([]string, len(prompt))
	for i, id := range prompt {
		ids[i] = fmt.Sprint(id)
	}
	env := map[string]string{"KVINDEX_KVCTL_ADDR": addr}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	cases := []struct {
		name   string
		args   []string
		env    map[string]string
		code   int
		stdout []string // substrings of stdout
		stderr string
		check  func(t *testing.T, stdout string)
	}{
		{name: "score tokens", args: []string{"score", "--model", model, "--tokens", strings.Join(ids, ",")}, code: 0,
			stdout: []string{"WORKER", "HIT RATE", "eng", "6 blocks of 4", "1.000"}},
		{name: "score text as json", args: []string{"score", "--model", model, "--text", "kvctl scores this prompt", "-o", "json"}, code: 0,
			check: func(t *testing.T, out string) {
				var r kvindexv1.ScoreResponse
				if err := protojson.Unmarshal([]byte(out), &r); err != nil || len(r.Scores) != 1 || r.Scores[0].MatchedBlocks != 6 {
					t.Errorf("score json = %s (%v)", out, err)
				}
			}},
		{name: "score other workers", args: []string{"score", "--model", model, "--tokens", "1,2,3,4", "--workers", "x,y", "--linearizable"}, code: 0,
			stdout: []string{"x  ", "y  "}},
		{name: "workers", args: []string{"workers"}, code: 0, stdout: []string{"ID", "DETACHED", "eng", model, "aggregated", "0:"},
			check: func(t *testing.T, out string) {
				for _, line := range strings.Split(out, "\n") {
					if f := strings.Fields(line); len(f) > 8 && f[0] == "eng" {
						if f[2] != "4" || f[8] != "0" || (f[4] != "live" && f[4] != "replaying") {
							// replaying: a live stream asks for what it may have missed while idle
							t.Errorf("eng's block size %s, detached %s, state %s; want the --block-size 4, 0, live:\n%s", f[2], f[8], f[4], out)
						}
						return
					}
				}
				t.Errorf("no row for eng:\n%s", out)
			}},
		{name: "workers shows a dead worker", args: []string{"workers", "--model", "kvctl/gone"}, code: 0, stdout: []string{"gone"},
			check: func(t *testing.T, out string) {
				// The leader declares gone dead after 200 ms of failed probes: ask until it shows.
				for deadline := time.Now().Add(30 * time.Second); ; {
					for _, line := range strings.Split(out, "\n") {
						if f := strings.Fields(line); len(f) > 4 && f[0] == "gone" && f[4] == "dead" {
							return
						}
					}
					if time.Now().After(deadline) {
						t.Fatalf("gone never showed as dead:\n%s", out)
					}
					time.Sleep(20 * time.Millisecond)
					var stdout bytes.Buffer
					run(context.Background(), []string{"workers", "--model", "kvctl/gone"}, &stdout, io.Discard, lookup)
					out = stdout.String()
				}
			}},
		{name: "workers json", args: []string{"workers", "--output", "json"}, code: 0, stdout: []string{`"id": "eng"`, `"gpu_blocks": "6"`}},
		{name: "cluster", args: []string{"cluster"}, code: 0, stdout: []string{"leader kvctl-node", "kvctl-node*", "voter", "DIGEST@APPLIED"}},
		{name: "stats", args: []string{"stats"}, code: 0, stdout: []string{"nodes", "stored_attached"}},
		{name: "dump", args: []string{"dump", "--workers", "eng"}, code: 0, stdout: []string{"6 blocks held", "eng", "gpu", model}},
		{name: "dump json", args: []string{"dump", "-o", "json"}, code: 0, stdout: []string{`"kind": "CHANGE_KIND_STORED"`, `"applied_index"`}},
		{name: "register without the token", args: []string{"register", "--id", "w2", "--model", model}, code: 1, stderr: "Unauthenticated"},
		{name: "register", args: []string{"register", "--id", "w2", "--model", model, "--block-size", "4", "--role", "prefill"},
			env: map[string]string{"KVINDEX_KVCTL_ADMIN_TOKEN": "tok"}, code: 0, stdout: []string{"registered w2"}},
		{name: "unregister", args: []string{"unregister", "--id", "w2", "--admin-token", "tok"}, code: 0, stdout: []string{"unregistered w2"}},
		{name: "unregister unknown", args: []string{"unregister", "--id", "w2", "--admin-token", "tok"}, code: 1, stderr: "NotFound"},
		{name: "unknown model text", args: []string{"score", "--model", "nope", "--text", "x"}, code: 1, stderr: "NotFound: unknown model"},
		{name: "score without model", args: []string{"score", "--tokens", "1"}, code: 2, stderr: "--model is required"},
		{name: "score with both prompts", args: []string{"score", "--model", model, "--tokens", "1", "--text", "x"}, code: 2, stderr: "one of --text and --tokens"},
		{name: "bad token", args: []string{"score", "--model", model, "--tokens", "1,x"}, code: 2, stderr: `"x" is not a token id`},
		{name: "block size beyond uint32", args: []string{"register", "--id", "a", "--model", "m", "--block-size", "4294967312"}, code: 2, stderr: "--block-size"},
		{name: "dp size beyond uint32", args: []string{"register", "--id", "a", "--model", "m", "--dp-size", "4294967297"}, code: 2, stderr: "--dp-size"},
		{name: "score block size beyond uint32", args: []string{"score", "--model", model, "--tokens", "1", "--block-size", "4294967300"}, code: 2, stderr: "--block-size"},
		{name: "bad role", args: []string{"register", "--id", "a", "--model", "m", "--role", "boss"}, code: 2, stderr: "--role"},
		{name: "bad output", args: []string{"workers", "-o", "yaml"}, code: 2, stderr: "want table or json"},
		{name: "unknown command", args: []string{"frobnicate"}, code: 2, stderr: "unknown command"},
		{name: "stray argument", args: []string{"workers", "extra"}, code: 2, stderr: "unexpected argument"},
		{name: "help", args: []string{"--help"}, code: 0, stderr: "$KVINDEX_KVCTL_ADDR"},
		{name: "command help", args: []string{"score", "--help"}, code: 0, stderr: "--tokens"},
		{name: "no member answers", args: []string{"stats", "--addr", "127.0.0.1:1", "--timeout", "2s"}, code: 1, stderr: "kvctl stats"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for k, v := range c.env {
				env[k] = v
			}
			defer func() {
				for k := range c.env {
					delete(env, k)
				}
			}()
			var stdout, stderr bytes.Buffer
			code := run(context.Background(), c.args, &stdout, &stderr, lookup)
			if code != c.code {
				t.Fatalf("exit %d, want %d; stdout %s; stderr %s", code, c.code, stdout.String(), stderr.String())
			}
			for _, want := range c.stdout {
				if !strings.Contains(stdout.String(), want) {
					t.Errorf("stdout lacks %q:\n%s", want, stdout.String())
				}
			}
			if !strings.Contains(stderr.String(), c.stderr) {
				t.Errorf("stderr lacks %q:\n%s", c.stderr, stderr.String())
			}
			if c.check != nil {
				c.check(t, stdout.String())
			}
		})
	}
}

// Flags > KVINDEX_* env: --output given on the command line must win over
// KVINDEX_KVCTL_O from the environment.
func TestOutputFlagBeatsEnv(t *testing.T) {
	lookup := func(k string) (string, bool) {
		if k == "KVINDEX_KVCTL_O" {
			return "yaml", true
		}
		return "", false
	}
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"stats", "--output", "json", "--addr", "127.0.0.1:1", "--timeout", "100ms"}, &stdout, &stderr, lookup)
	if strings.Contains(stderr.String(), `"yaml"`) {
		t.Errorf("exit %d, stderr %q: the environment's KVINDEX_KVCTL_O=yaml overrode --output json given on the command line", code, stderr.String())
	}
}
