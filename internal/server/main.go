package server

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/kvindex/kvindex/internal/envflag"
	"github.com/kvindex/kvindex/internal/ingest"
	"github.com/kvindex/kvindex/internal/logging"
	"github.com/kvindex/kvindex/internal/raftstore"
)

// raftMetricsExpiry is how long a raft metric not updated stays exported.
const raftMetricsExpiry = 5 * time.Minute

// Main is bin/indexer: `indexer [flags]` runs the index server until ctx ends;
// `indexer relay [flags]` forwards one engine's ZMQ event streams to NATS. --help
// prints the flags and returns nil.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "relay" {
		return relayMain(ctx, args[1:], stderr, os.LookupEnv)
	}
	cfg, err := ParseFlags(args, stderr, nil)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	s, err := New(cfg, logging.New(cfg.LogLevel, cfg.LogFormat, stderr))
	if err != nil {
		return err
	}
	// raft's own metrics go through a process-wide sink: one node per process here.
	if err := raftstore.ExportRaftMetrics(s.reg, raftMetricsExpiry); err != nil {
		s.log.Warn("raft's own metrics are not exported", "err", err)
	}
	return s.Run(ctx)
}

// RelayEnvPrefix prefixes the environment variables of `indexer relay` flags.
const RelayEnvPrefix = "KVINDEX_RELAY_"

func relayMain(ctx context.Context, args []string, stderr io.Writer, lookup func(string) (string, bool)) error {
	cfg := ingest.DefaultRelayConfig()
	level, format := "info", "text"
	fs := flag.NewFlagSet("indexer relay", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.From, "from", cfg.From, "the engine's ZMQ PUB `endpoint` of dp rank 0, e.g. tcp://engine:5557 (rank r: port + r)")
	fs.StringVar(&cfg.Topic, "topic", cfg.Topic, "ZMQ subscription prefix (default: every topic)")
	fs.IntVar(&cfg.DPSize, "dp-size", cfg.DPSize, "data-parallel ranks to relay")
	fs.StringVar(&cfg.Replay, "replay", cfg.Replay, "the engine's replay `endpoint` of dp rank 0, announced in Kv-Replay so the indexer can fill gaps")
	fs.StringVar(&cfg.Worker, "worker", cfg.Worker, "worker `id` in the NATS subjects <prefix>.<worker>.<dp_rank> (one subject token)")
	fs.StringVar(&cfg.Model, "model", cfg.Model, "served model, announced in Kv-Model (default: the indexer reads it from a kv@<pod>@<model> topic)")
	fs.StringVar(&cfg.NATSURL, "nats-url", cfg.NATSURL, "NATS server `url`")
	fs.StringVar(&cfg.NATSSubjectPrefix, "nats-subject-prefix", cfg.NATSSubjectPrefix, "subject prefix")
	fs.IntVar(&cfg.MaxFrameBytes, "max-frame-bytes", cfg.MaxFrameBytes, "largest batch forwarded, in `bytes`")
	fs.StringVar(&level, "log-level", level, "debug, info, warn or error")
	fs.StringVar(&format, "log-format", format, "text or json")
	fs.Usage = envflag.Usage(fs, RelayEnvPrefix, "usage: indexer relay --from tcp://engine:5557 --nats-url nats://... --worker w1\n\nForwards one engine's KV event batches from ZMQ to NATS, verbatim, with the sequence number in a Kv-Seq header.")
	if err := envflag.Parse(fs, RelayEnvPrefix, args, lookup); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if fs.NArg() > 0 {
		return invalid("relay: unexpected argument %q", fs.Arg(0))
	}
	if _, err := logging.ParseLevel(level); err != nil {
		return invalid("relay %v", err)
	}
	if err := logging.ValidateFormat(format); err != nil {
		return invalid("relay %v", err)
	}
	logger := logging.New(level, format, stderr)
	stats, err := ingest.RunRelay(ctx, cfg, logger)
	logger.Info("relay stopped", "forwarded", stats.Forwarded, "dropped", stats.Dropped)
	if err != nil {
		return fmt.Errorf("relay: %w", err)
	}
	return nil
}
