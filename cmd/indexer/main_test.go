package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"

	"github.com/kvindex/kvindex/bench/fakeengine"
	"github.com/kvindex/kvindex/bench/fakeengine/fakeenginetest"
	"github.com/kvindex/kvindex/internal/logbuf"
)

func startEngine(t *testing.T) *fakeengine.Engine {
	t.Helper()
	return fakeenginetest.Start(t, fakeenginetest.Config())
}

// startIndexer runs the binary's run() with args and returns its HTTP base URL
// and gRPC address, read from its JSON startup log line.
func startIndexer(t *testing.T, args ...string) (base, grpcAddr string) {
	t.Helper()
	logs := &logbuf.Buffer{}
	dataDir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, append([]string{"--http-addr=127.0.0.1:0", "--grpc-addr=127.0.0.1:0", "--raft-addr=127.0.0.1:0",
			"--data-dir=" + dataDir, "--raft-heartbeat-timeout=200ms", "--raft-election-timeout=200ms",
			"--raft-leader-lease-timeout=100ms", "--log-format=json"}, args...), io.Discard, logs)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("indexer: %v", err)
			}
		case <-time.After(15 * time.Second):
			t.Error("indexer did not stop")
		}
	})
	deadline := time.Now().Add(15 * time.Second)
	for {
		sc := bufio.NewScanner(strings.NewReader(logs.String()))
		for sc.Scan() {
			var line struct {
				Msg  string `json:"msg"`
				HTTP string `json:"http"`
				GRPC string `json:"grpc"`
			}
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "indexer started" {
				return "http://" + line.HTTP, line.GRPC
			}
		}
		select {
		case err := <-done:
			t.Fatalf("indexer exited: %v\n%s", err, logs.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no startup line in the logs:\n%s", logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// generate sends requests with prompts not sent before (each stores new blocks,
// so each publishes events) and returns the engine's last seq.
func generate(t *testing.T, e *fakeengine.Engine, requests int) int64 {
	t.Helper()
	for range requests {
		n := prompts.Add(1)
		prompt := make([]uint32, 9+n%5)
		for j := range prompt {
			prompt[j] = uint32((int(n)*31 + j*7) % 256)
		}
		if _, err := e.Generate(context.Background(), fakeengine.Request{Prompt: prompt, MaxTokens: 2}); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	return e.CacheTruth().Ranks[0].LastSeq
}

var prompts atomic.Int64

func httpGet(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s = %d %s %v", url, resp.StatusCode, body, err)
	}
	return string(body)
}

// waitForSeq polls GET /workers until worker's rank 0 reports last_seq.
func waitForSeq(t *testing.T, base, worker string, last int64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var resp struct {
			Workers []struct {
				Spec struct {
					ID string `json:"id"`
				} `json:"spec"`
				DpRanks []struct {
					LastSeq string `json:"last_seq"`
				} `json:"dp_ranks"`
			} `json:"workers"`
		}
		body := httpGet(t, base+"/workers")
		if err := json.Unmarshal([]byte(body), &resp); err != nil {
			t.Fatalf("GET /workers: %v in %s", err, body)
		}
		for _, w := range resp.Workers {
			if w.Spec.ID == worker && len(w.DpRanks) > 0 && w.DpRanks[0].LastSeq == strconv.FormatInt(last, 10) {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET /workers never showed %s at seq %d: %s", worker, last, body)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestIndexerFollowsAWorkerGivenByFlag(t *testing.T) {
	e := startEngine(t)
	base, _ := startIndexer(t, "--block-size=4", "--idle-replay-interval=50ms",
		"--worker", "id=e1,model="+e.Config().Model+",endpoint="+e.EventEndpoints()[0]+",replay="+e.ReplayEndpoints()[0])
	last := generate(t, e, 10)
	waitForSeq(t, base, "e1", last)
	metrics := httpGet(t, base+"/metrics")
	for _, want := range []string{
		`kvindex_ingest_events_total{type="BlockStored",worker="e1"}`,
		`kvindex_ingest_last_seq{dp_rank="0",worker="e1"} ` + strconv.FormatInt(last, 10),
		`kvindex_ingest_workers{source="flag"} 1`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if got := httpGet(t, base+"/readyz"); got != "ready\n" {
		t.Errorf("/readyz = %q", got)
	}
}

func TestRelaySubcommandFeedsAnIndexerOverNATS(t *testing.T) {
	ns, err := natsserver.NewServer(&natsserver.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats not ready")
	}
	t.Cleanup(ns.Shutdown)
	e := startEngine(t)
	base, _ := startIndexer(t, "--kv-event-transport=nats", "--nats-url="+ns.ClientURL(), "--nats-subject-prefix=infera.kv.events",
		"--block-size=4", "--idle-replay-interval=50ms")

	ctx, cancel := context.WithCancel(context.Background())
	relayDone := make(chan error, 1)
	go func() {
		relayDone <- run(ctx, []string{"relay", "--from", e.EventEndpoints()[0], "--replay", e.ReplayEndpoints()[0],
			"--worker", "w1", "--nats-url", ns.ClientURL(), "--nats-subject-prefix", "infera.kv.events", "--log-format", "json"}, io.Discard, io.Discard)
	}()
	defer func() {
		cancel()
		if err := <-relayDone; err != nil {
			t.Errorf("relay: %v", err)
		}
	}()
	// The relay's subscription goes live some time after it starts: the indexer
	// learns of w1 from its first relayed batch, then replays what came before
	// from the engine (Kv-Replay).
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(httpGet(t, base+"/workers"), `"w1"`) {
		if time.Now().After(deadline) {
			t.Fatal("w1 never appeared")
		}
		generate(t, e, 1)
	}
	last := generate(t, e, 10)
	waitForSeq(t, base, "w1", last)
	metrics := httpGet(t, base+"/metrics")
	if !strings.Contains(metrics, `kvindex_ingest_workers{source="discovered"} 1`) {
		t.Error("w1 is not counted as discovered")
	}
}

// TestSecondIndexerJoinsTheFirst starts two indexers through the command line,
// the second with --join: GET /cluster on either shows both as voters under one
// leader, and a worker given by flag to both is followed and reported by both.
func TestSecondIndexerJoinsTheFirst(t *testing.T) {
	e := startEngine(t)
	worker := "id=e1,model=" + e.Config().Model + ",endpoint=" + e.EventEndpoints()[0] + ",replay=" + e.ReplayEndpoints()[0]
	first, firstGRPC := startIndexer(t, "--node-id=first", "--block-size=4", "--idle-replay-interval=50ms", "--worker", worker)
	second, _ := startIndexer(t, "--node-id=second", "--join="+firstGRPC, "--block-size=4", "--idle-replay-interval=50ms", "--worker", worker)
	deadline := time.Now().Add(30 * time.Second)
	for _, base := range []string{first, second} {
		for {
			var cl struct {
				Leader  string `json:"leader"`
				Term    uint64 `json:"term"`
				Members []struct {
					ID       string `json:"id"`
					Suffrage string `json:"suffrage"`
				} `json:"members"`
			}
			body := httpGet(t, base+"/cluster")
			if err := json.Unmarshal([]byte(body), &cl); err != nil {
				t.Fatalf("GET /cluster: %v in %s", err, body)
			}
			if len(cl.Members) == 2 && cl.Members[0].ID == "first" && cl.Members[1].ID == "second" &&
				cl.Members[1].Suffrage == "voter" && cl.Leader == "first" && cl.Term > 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("GET %s/cluster never showed both members: %s", base, body)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	last := generate(t, e, 5)
	waitForSeq(t, first, "e1", last)
	waitForSeq(t, second, "e1", last)
}

func TestHelpDocumentsBothCommands(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"relay", "--help"}} {
		var out logbuf.Buffer
		if err := run(context.Background(), args, io.Discard, &out); err != nil {
			t.Errorf("%v: %v", args, err)
		}
		for _, want := range []string{"--nats-url", "KVINDEX_"} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("%v output lacks %q:\n%s", args, want, out.String())
			}
		}
	}
	if err := run(context.Background(), []string{"--worker", "id=x"}, io.Discard, io.Discard); err == nil {
		t.Error("an invalid --worker was accepted")
	}
}
