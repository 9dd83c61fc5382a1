package ingest

import (
	"context"
	"fmt"
	"time"

	"github.com/kvindex/kvindex/internal/ingest/wire"
	zmq "github.com/pebbe/zmq4"
)

// subRcvHWM is the receive queue of SUB sockets, in messages. Engines queue up to
// 100k batches on their side (vLLM's publisher); a subscriber busy replaying or
// back-pressured should not drop sooner.
const subRcvHWM = 100_000

// drainBatch bounds how many messages a socket goroutine receives per poll, so it
// checks its context regularly even under a flood.
const drainBatch = 1024

// sockets holds what every ZMQ socket goroutine of a Manager (or relay) shares.
type sockets struct {
	zctx *zmq.Context
	// hardMaxFrame is every socket's ZMQ_MAXMSGSIZE (see ManagerConfig.MaxFrameBytes).
	hardMaxFrame int64
	pollInterval time.Duration
	badLog       *rateLimitedLog
}

func hardMaxFrame(maxFrame int) int64 { return 4*int64(maxFrame) + 1<<20 }

// newSub returns a SUB socket with the options every subscriber uses, subscribed to
// topic.
func (z *sockets) newSub(topic string) (*zmq.Socket, error) {
	sock, err := z.zctx.NewSocket(zmq.SUB)
	if err != nil {
		return nil, fmt.Errorf("zmq SUB socket: %w", err)
	}
	for _, set := range []func() error{
		func() error { return sock.SetLinger(0) },
		func() error { return sock.SetRcvhwm(subRcvHWM) },
		func() error { return sock.SetMaxmsgsize(z.hardMaxFrame) },
		func() error { return sock.SetSubscribe(topic) },
	} {
		if err := set(); err != nil {
			sock.Close()
			return nil, fmt.Errorf("zmq SUB socket option: %w", err)
		}
	}
	return sock, nil
}

// bindSocket opens the bind-mode SUB socket and returns it with its actual endpoint.
func (z *sockets) bindSocket(endpoint string) (*zmq.Socket, string, error) {
	sock, err := z.newSub("")
	if err != nil {
		return nil, "", err
	}
	if err := sock.Bind(endpoint); err != nil {
		sock.Close()
		return nil, "", fmt.Errorf("--zmq-bind %s: %w", endpoint, err)
	}
	addr, err := sock.GetLastEndpoint()
	if err != nil {
		sock.Close()
		return nil, "", fmt.Errorf("--zmq-bind %s: %w", endpoint, err)
	}
	return sock, addr, nil
}

// receive runs a socket's receive loop until ctx ends, handing every message to
// handle, and closes the socket. It is the only goroutine that touches sock.
func (z *sockets) receive(ctx context.Context, sock *zmq.Socket, source string, handle func(parts [][]byte) bool) {
	defer sock.Close()
	poller := zmq.NewPoller()
	poller.Add(sock, zmq.POLLIN)
	for ctx.Err() == nil {
		polled, err := poller.Poll(z.pollInterval)
		if err != nil {
			if retryable(err) {
				continue
			}
			if zmq.AsErrno(err) == zmq.ETERM {
				return
			}
			z.badLog.Warn(source+"/poll", "zmq poll failed", "err", err)
			continue
		}
		if len(polled) == 0 {
			continue
		}
		for range drainBatch {
			parts, err := sock.RecvMessageBytes(zmq.DONTWAIT)
			if err != nil {
				if !retryable(err) {
					z.badLog.Warn(source+"/recv", "zmq receive failed", "err", err)
				}
				break
			}
			if !handle(parts) {
				return
			}
		}
	}
}

// connectLoop dials one rank's PUB socket and feeds its batches, decoded, to sr.
func (r *run) connectLoop(ctx context.Context, endpoint, topic string, sr *streamRunner) {
	m := r.m
	sock, err := m.zs.newSub(topic)
	if err == nil {
		if err = sock.Connect(endpoint); err != nil {
			sock.Close()
		}
	}
	if err != nil {
		// Only a malformed endpoint fails here (connecting is asynchronous), and
		// specs are validated: this is a bug or a resource limit, not bad input.
		r.fail(fmt.Errorf("worker %s dp rank %d: subscribe %s: %w", sr.key.Worker, sr.key.DPRank, endpoint, err))
		return
	}
	m.log.Info("subscribed", "worker", sr.key.Worker, "dp_rank", sr.key.DPRank, "endpoint", endpoint)
	dec := wire.NewDecoder(m.cfg.MaxFrameBytes)
	m.zs.receive(ctx, sock, "zmq", func(parts [][]byte) bool {
		f, err := wire.ParseFrame(parts)
		if err != nil {
			m.metrics.decodeErrors.WithLabelValues("zmq", "bad_frame").Inc()
			m.badLog.Warn("zmq/bad_frame", "dropping malformed frame", "worker", sr.key.Worker, "err", err)
			return true
		}
		it := item{seq: f.Seq}
		var st wire.DecodeStats
		it.batch, st, it.err = dec.Decode(f.Payload)
		countDecode(r.env, "zmq", st, it.err)
		select {
		case sr.in <- it:
			return true
		case <-ctx.Done():
			return false
		}
	})
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
