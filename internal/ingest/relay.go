package ingest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvindex/kvindex/internal/ingest/wire"
	"github.com/kvindex/kvindex/internal/workerspec"
	"github.com/nats-io/nats.go"
	zmq "github.com/pebbe/zmq4"
)

// RelayConfig configures a relay: one engine's ZMQ event streams forwarded to NATS
// (bin/indexer relay). The relay does not decode: NATS carries the engine's bytes
// and sequence numbers, and the indexer applies the same sequence rules to them.
type RelayConfig struct {
	// From is the engine's PUB endpoint of dp rank 0; rank r is at From's port + r.
	From string
	// Topic is the ZMQ subscription prefix ("" = every topic).
	Topic string
	// DPSize is the number of data-parallel ranks to relay (0 means 1).
	DPSize int
	// Replay is the engine's replay endpoint of rank 0, announced in Kv-Replay so
	// the indexer can fill gaps ("" = none).
	Replay string
	// Worker is the worker id in subjects: a single NATS subject token.
	Worker string
	// Model is announced in Kv-Model; "" lets the indexer read it from the topic.
	Model             string
	NATSURL           string
	NATSSubjectPrefix string
	MaxFrameBytes     int
	PollInterval      time.Duration
}

// DefaultRelayConfig returns the defaults.
func DefaultRelayConfig() RelayConfig {
	return RelayConfig{
		DPSize:            1,
		NATSSubjectPrefix: DefaultNATSSubjectPrefix,
		MaxFrameBytes:     DefaultMaxFrameBytes,
		PollInterval:      50 * time.Millisecond,
	}
}

// Validate reports the first bad value, naming its flag.
func (c RelayConfig) Validate() error {
	switch {
	case c.From == "":
		return invalidConfig("relay --from is required")
	case c.NATSURL == "":
		return invalidConfig("relay --nats-url is required")
	case c.DPSize < 0 || c.DPSize > workerspec.MaxDPSize:
		return invalidConfig("relay --dp-size=%d must be between 1 and %d", c.DPSize, workerspec.MaxDPSize)
	case c.MaxFrameBytes < 1024 || c.MaxFrameBytes > 1<<30:
		return invalidConfig("relay --max-frame-bytes=%d must be between 1024 and %d", c.MaxFrameBytes, 1<<30)
	case c.PollInterval <= 0:
		return invalidConfig("relay poll interval %v must be positive", c.PollInterval)
	}
	if err := validSubjectToken(c.Worker); err != nil {
		return invalidConfig("relay --worker=%q: %v", c.Worker, err)
	}
	if err := validSubjectPrefix(c.NATSSubjectPrefix); err != nil {
		return invalidConfig("relay --nats-subject-prefix=%q: %v", c.NATSSubjectPrefix, err)
	}
	spec := workerspec.Spec{ID: c.Worker, Model: "m", DPSize: c.DPSize, Endpoint: c.From, Replay: c.Replay}
	if err := spec.Validate(); err != nil {
		return fmt.Errorf("%w: relay: %w", ErrInvalidConfig, err)
	}
	return nil
}

// RelayStats counts what a relay forwarded.
type RelayStats struct {
	Forwarded, Dropped uint64
}

// RunRelay forwards every rank's batches to NATS until ctx ends, then flushes what
// it published and closes its sockets. Frames that are malformed or over
// MaxFrameBytes are dropped and logged (rate-limited); the indexer sees the gap.
func RunRelay(ctx context.Context, cfg RelayConfig, logger *slog.Logger) (RelayStats, error) {
	if err := cfg.Validate(); err != nil {
		return RelayStats{}, err
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	nc, err := nats.Connect(cfg.NATSURL, nats.Name("kvindex-relay-"+cfg.Worker), nats.MaxReconnects(-1),
		nats.ReconnectWait(500*time.Millisecond))
	if err != nil {
		return RelayStats{}, fmt.Errorf("relay --nats-url %s: %w", cfg.NATSURL, err)
	}
	defer nc.Close()
	zctx, err := zmq.NewContext()
	if err != nil {
		return RelayStats{}, fmt.Errorf("relay: zmq context: %w", err)
	}
	zs := &sockets{zctx: zctx, hardMaxFrame: hardMaxFrame(cfg.MaxFrameBytes), pollInterval: cfg.PollInterval,
		badLog: newRateLimitedLog(logger, 10*time.Second)}
	rl := &relay{cfg: cfg, nc: nc, zs: zs}
	ranks := workerspec.Spec{DPSize: cfg.DPSize}.Ranks()
	socks := make([]*zmq.Socket, 0, ranks)
	for rank := range ranks {
		from, _ := workerspec.OffsetEndpoint(cfg.From, rank) // validated
		sock, err := zs.newSub(cfg.Topic)
		if err == nil {
			if err = sock.Connect(from); err != nil {
				sock.Close()
			}
		}
		if err != nil {
			for _, s := range socks {
				s.Close()
			}
			zctx.Term()
			return RelayStats{}, fmt.Errorf("relay: subscribe %s: %w", from, err)
		}
		socks = append(socks, sock)
		logger.Info("relaying", "from", from, "worker", cfg.Worker, "dp_rank", rank, "subject", Subject(cfg.NATSSubjectPrefix, cfg.Worker, rank))
	}
	var wg sync.WaitGroup
	for rank, sock := range socks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rl.forward(ctx, uint32(rank), sock)
		}()
	}
	wg.Wait()
	var errs []error
	if err := nc.Flush(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
		errs = append(errs, fmt.Errorf("relay: nats flush: %w", err))
	}
	if err := zctx.Term(); err != nil {
		errs = append(errs, fmt.Errorf("relay: zmq context: %w", err))
	}
	return RelayStats{Forwarded: rl.forwarded.Load(), Dropped: rl.dropped.Load()}, errors.Join(errs...)
}

type relay struct {
	cfg                RelayConfig
	nc                 *nats.Conn
	zs                 *sockets
	forwarded, dropped atomic.Uint64
}

// forward publishes one rank's frames; it owns sock.
func (rl *relay) forward(ctx context.Context, rank uint32, sock *zmq.Socket) {
	subject := Subject(rl.cfg.NATSSubjectPrefix, rl.cfg.Worker, rank)
	replay, _ := workerspec.Spec{Replay: rl.cfg.Replay}.ReplayEndpoint(rank) // validated
	rl.zs.receive(ctx, sock, "relay", func(parts [][]byte) bool {
		f, err := wire.ParseFrame(parts)
		if err == nil && len(f.Payload) > rl.cfg.MaxFrameBytes {
			err = fmt.Errorf("%w: %d bytes, limit %d", wire.ErrOversize, len(f.Payload), rl.cfg.MaxFrameBytes)
		}
		if err != nil {
			rl.dropped.Add(1)
			rl.zs.badLog.Warn("relay/bad_frame", "relay dropping frame", "err", err)
			return true
		}
		msg := &nats.Msg{Subject: subject, Data: f.Payload, Header: nats.Header{}}
		msg.Header.Set(HeaderSeq, strconv.FormatUint(f.Seq, 10))
		if f.Topic != "" {
			msg.Header.Set(HeaderTopic, f.Topic)
		}
		if rl.cfg.Model != "" {
			msg.Header.Set(HeaderModel, rl.cfg.Model)
		}
		if replay != "" {
			msg.Header.Set(HeaderReplay, replay)
		}
		if err := rl.nc.PublishMsg(msg); err != nil {
			rl.dropped.Add(1)
			rl.zs.badLog.Warn("relay/publish", "relay publish failed", "err", err)
			return true
		}
		rl.forwarded.Add(1)
		return true
	})
}
