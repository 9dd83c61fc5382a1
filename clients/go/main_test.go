package kvindex_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/kvindex/kvindex/bench/fakeengine"
	"github.com/kvindex/kvindex/internal/ingest"
	"github.com/kvindex/kvindex/internal/server"
	"github.com/kvindex/kvindex/internal/tokenize"
	"github.com/kvindex/kvindex/internal/workerspec"
)

// The tests and examples of this package run against one real single-node
// indexer following one fake engine, started by TestMain.
var (
	exampleAddr  string // the indexer's gRPC address
	exampleHTTP  string // its REST base URL
	engineURL    string // the fake engine's OpenAI base URL
	engine       *fakeengine.Engine
	indexerSrv   *server.Server
	exampleToken = "example-admin-token"
)

const exampleModel = "demo/model"

func TestMain(m *testing.M) {
	stop, err := startIndexer()
	if err != nil {
		fmt.Fprintln(os.Stderr, "starting the test indexer:", err)
		os.Exit(1)
	}
	code := m.Run()
	stop()
	os.Exit(code)
}

func startIndexer() (func(), error) {
	ec := fakeengine.DefaultConfig()
	ec.Model = exampleModel
	ec.Port = 0
	ec.KVEventsEndpoint = "tcp://127.0.0.1:*"
	ec.KVEventsReplayEndpoint = "tcp://127.0.0.1:*"
	ec.TimeScale = 0
	ec.BlockSize = 4
	ec.NumGPUBlocks = 1024
	var err error
	if engine, err = fakeengine.New(ec, slog.New(slog.DiscardHandler)); err != nil {
		return nil, err
	}
	if err := engine.Start(); err != nil {
		return nil, err
	}
	engineURL = engine.URL()
	spec, err := workerspec.Parse(fmt.Sprintf("id=engine-0,model=%s,endpoint=%s,replay=%s,block-size=4,http=%s",
		exampleModel, engine.EventEndpoints()[0], engine.ReplayEndpoints()[0], engine.URL()))
	if err != nil {
		return nil, err
	}
	dataDir, err := os.MkdirTemp("", "kvindex-client-test-")
	if err != nil {
		engine.Close()
		return nil, err
	}
	cfg := server.DefaultConfig()
	cfg.NodeID = "example-node"
	cfg.DataDir = dataDir
	cfg.HTTPAddr, cfg.GRPCAddr, cfg.Raft.RaftAddr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	cfg.AdminToken = exampleToken
	cfg.Ingest.Workers = []workerspec.Spec{spec}
	cfg.Ingest.DefaultBlockSize = 4
	cfg.Ingest.PollInterval = 10 * time.Millisecond
	cfg.Ingest.IdleReplayInterval = 50 * time.Millisecond
	cfg.Tokenizers = tokenize.Specs{{Model: exampleModel, Dir: server.BuiltinTokenizer}}
	if indexerSrv, err = server.New(cfg, nil); err != nil {
		engine.Close()
		os.RemoveAll(dataDir)
		return nil, err
	}
	exampleAddr, exampleHTTP = indexerSrv.GRPCAddr(), "http://"+indexerSrv.HTTPAddr()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- indexerSrv.Run(ctx) }()
	stop := func() {
		cancel()
		<-done
		engine.Close()
		os.RemoveAll(dataDir)
	}
	// The examples score this prompt: cache it on the engine first.
	if err := generate(tokenize.NewBuiltin().Encode("The quick brown fox jumps over the lazy dog", true)); err != nil {
		stop()
		return nil, err
	}
	return stop, nil
}

// generate runs prompt on the engine and waits until the indexer applied it.
func generate(prompt []uint32) error {
	ctx := context.Background()
	if _, err := engine.Generate(ctx, fakeengine.Request{Prompt: prompt, MaxTokens: 1}); err != nil {
		return err
	}
	if err := engine.Flush(ctx); err != nil {
		return err
	}
	last := engine.CacheTruth().Ranks[0].LastSeq
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, ok := indexerSrv.Applier().Cursor(ingest.Stream{Worker: "engine-0"})
		if ok && int64(c.Seq) >= last {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the indexer never applied seq %d", last)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
