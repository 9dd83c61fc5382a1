package server

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/metadata"

	kvindexv1 "github.com/kvindex/kvindex/api/proto/kvindex/v1"
	"github.com/kvindex/kvindex/internal/ingest"
	"github.com/kvindex/kvindex/internal/ingest/wire"
	"github.com/kvindex/kvindex/internal/raftstore"
	"github.com/kvindex/kvindex/internal/retry"
)

// Bind mode in a cluster: every member binds --zmq-bind (ingest.Manager.ServeBind);
// while a member does not lead, its bind socket's frames go to the leader over
// MemberService.ForwardEvents, and the leader hands them to its ingest through an
// ingest.FrameInput, the path of its own bind socket's frames. Nothing is
// acknowledged per frame: what is lost on the way (a full queue here, a stream
// that breaks, a leader change) shows as a sequence gap on the leader, which
// replays it from the engine.

// Bounds of a follower's queue of frames for the leader: while no leader takes
// them (an election, a stream being re-opened), frames wait here; past either
// bound they are dropped and counted.
const (
	forwardQueueFrames = 8192
	forwardQueueBytes  = 64 << 20
	// forwardLeaderCheck is how often an open stream checks that its member
	// still leads; a stream to a member that stopped leading (or died) ends.
	forwardLeaderCheck = 250 * time.Millisecond
	// forwardFrameOverhead is a frame's bytes in a message beyond topic and
	// payload (field tags, lengths, seq), rounded up.
	forwardFrameOverhead = 32
)

// frameForwarder is the ingest.Forwarder of a cluster member: a bounded queue
// that Forward fills from the bind socket's goroutine, and run, which streams
// the queue to whichever member leads. Forward is safe for concurrent use; run
// runs once.
type frameForwarder struct {
	node  *raftstore.Node
	peers *peers
	log   *slog.Logger
	// maxMessage bounds one ForwardEvents message (the leader's gRPC limit,
	// --max-body-bytes): a larger frame is dropped here.
	maxMessage int

	queue  chan wire.Frame
	queued atomic.Int64 // bytes in queue

	sent, full, tooLarge, failed prometheus.Counter
}

func newFrameForwarder(node *raftstore.Node, p *peers, maxMessage int, logger *slog.Logger, reg prometheus.Registerer) (*frameForwarder, error) {
	frames := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvindex_ingest_forward_frames_total",
		Help: "Bind socket frames a member that does not lead sent to the leader (sent) or dropped: queue full (full), larger than --max-body-bytes (too_large), lost with a stream that failed (failed)."},
		[]string{"result"})
	if reg != nil {
		if err := reg.Register(frames); err != nil {
			return nil, fmt.Errorf("registering kvindex_ingest_forward_frames_total: %w", err)
		}
	}
	return &frameForwarder{
		node: node, peers: p, log: logger, maxMessage: maxMessage,
		queue: make(chan wire.Frame, forwardQueueFrames),
		sent:  frames.WithLabelValues("sent"), full: frames.WithLabelValues("full"),
		tooLarge: frames.WithLabelValues("too_large"), failed: frames.WithLabelValues("failed"),
	}, nil
}

func frameSize(f wire.Frame) int { return len(f.Topic) + len(f.Payload) + forwardFrameOverhead }

// Forward queues f for the leader, or drops it (counted) when it cannot be
// sent or the queue is full. It never blocks.
func (f *frameForwarder) Forward(fr wire.Frame) {
	size := frameSize(fr)
	if size > f.maxMessage {
		f.tooLarge.Inc()
		return
	}
	if f.queued.Add(int64(size)) > forwardQueueBytes {
		f.queued.Add(-int64(size))
		f.full.Inc()
		return
	}
	select {
	case f.queue <- fr:
	default:
		f.queued.Add(-int64(size))
		f.full.Inc()
	}
}

// take removes a frame from the queue's accounting.
func (f *frameForwarder) take(fr wire.Frame) { f.queued.Add(-int64(frameSize(fr))) }

// run streams queued frames to the leader until ctx ends, opening a stream
// when there is something to send and a new one whenever the leader changes.
// This member itself may be the leader (its ingest starting, or frames queued
// before it led): its own ForwardEvents then takes them. While no member
// accepts a stream, the first frame waits and the queue fills.
func (f *frameForwarder) run(ctx context.Context) {
	var first *wire.Frame
	for attempt := 0; ; {
		if first == nil {
			select {
			case <-ctx.Done():
				return
			case fr := <-f.queue:
				f.take(fr)
				first = &fr
			}
		}
		id, addr := f.leader()
		err := errors.New("no leader known")
		if addr != "" {
			var opened bool
			if opened, err = f.stream(ctx, id, addr, *first); opened {
				first, attempt = nil, 0
			}
		}
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			f.log.Debug("forwarding bind-mode frames to the leader", "leader", id, "addr", addr, "err", err)
			if retry.Default.Wait(ctx, attempt) != nil {
				return
			}
			attempt++
		}
	}
}

// leader is the leader's id and gRPC address, empty when unknown.
func (f *frameForwarder) leader() (id, grpcAddr string) {
	st, err := f.node.Cluster()
	if err != nil || st.LeaderID == "" {
		return "", ""
	}
	for _, m := range st.Members {
		if m.ID == st.LeaderID {
			return m.ID, m.GRPCAddr
		}
	}
	return st.LeaderID, ""
}

// acceptedHeader is the header a member sends when it accepts a ForwardEvents
// stream, before the follower sends anything.
const acceptedHeader = "x-kvindex-forward-accepted"

// stream opens a stream to the member id at addr and, once the member
// accepted it (opened), sends first and then every queued frame until the
// member stops leading, the stream fails or ctx ends. Frames taken from the
// queue and not sent are counted as failed; first is not taken when the
// member did not accept the stream.
func (f *frameForwarder) stream(ctx context.Context, id, addr string, first wire.Frame) (opened bool, err error) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// A Send blocked on flow control, to a member that died, ends when the
	// member stops leading here too.
	go func() {
		t := time.NewTicker(forwardLeaderCheck)
		defer t.Stop()
		for {
			select {
			case <-sctx.Done():
				return
			case <-t.C:
				if lid, _ := f.node.Leader(); lid != id {
					cancel()
					return
				}
			}
		}
	}()
	pctx, c, err := f.peers.member(sctx, addr)
	if err != nil {
		return false, err
	}
	st, err := c.ForwardEvents(pctx)
	if err != nil {
		return false, fromRemote(addr, err)
	}
	md, err := st.Header()
	if err == nil && len(md.Get(acceptedHeader)) == 0 {
		_, err = st.CloseAndRecv() // the member refused the stream: its answer says why
		err = cmp.Or(err, error(io.ErrUnexpectedEOF))
	}
	if err != nil {
		return false, fromRemote(addr, err)
	}
	batch := []wire.Frame{first}
	var carry *wire.Frame // taken from the queue, for the next message
	for {
		req := &kvindexv1.ForwardEventsRequest{Frames: make([]*kvindexv1.EventFrame, len(batch))}
		for i, fr := range batch {
			req.Frames[i] = &kvindexv1.EventFrame{Topic: fr.Topic, Seq: fr.Seq, Payload: fr.Payload}
		}
		if err := st.Send(req); err != nil {
			f.failed.Add(float64(len(batch)))
			if carry != nil {
				f.failed.Inc()
			}
			if errors.Is(err, io.EOF) { // the member ended the stream: its answer says why
				_, err = st.CloseAndRecv()
			}
			return true, fromRemote(addr, err)
		}
		f.sent.Add(float64(len(batch)))
		batch = batch[:0]
		if carry != nil {
			batch, carry = append(batch, *carry), nil
		} else {
			select {
			case fr := <-f.queue:
				f.take(fr)
				batch = append(batch, fr)
			case <-sctx.Done():
				st.CloseSend()
				return true, nil
			}
		}
		// Whatever else is queued goes in the same message, up to its bound;
		// the frame that would pass it goes in the next one.
		size := frameSize(batch[0])
	fill:
		for {
			select {
			case fr := <-f.queue:
				f.take(fr)
				if size += frameSize(fr); size > f.maxMessage {
					carry = &fr
					break fill
				}
				batch = append(batch, fr)
			default:
				break fill
			}
		}
	}
}

// memberService implements kvindex.v1.MemberService.
type memberService struct {
	kvindexv1.UnimplementedMemberServiceServer
	a *API
}

// ForwardEvents takes a follower's bind-mode frames into this leader's ingest
// (see the top of this file). It accepts the stream by sending its headers,
// and ends it with a not-leader error as soon as this member's ingest stops.
func (s memberService) ForwardEvents(stream kvindexv1.MemberService_ForwardEventsServer) error {
	in, err := s.a.backend.FrameInput()
	if err != nil {
		if lerr := s.a.leaderOnly(); lerr != nil {
			return lerr
		}
		return fmt.Errorf("%w: this member leads but its ingest is not running yet: %w", ErrUnavailable, err)
	}
	if err := stream.SendHeader(metadata.Pairs(acceptedHeader, "1")); err != nil {
		return err
	}
	ctx, cancel := context.WithCancelCause(stream.Context())
	defer cancel(nil)
	reqs := make(chan *kvindexv1.ForwardEventsRequest)
	go func() {
		for {
			req, err := stream.Recv()
			if err != nil {
				cancel(err)
				return
			}
			select {
			case reqs <- req:
			case <-ctx.Done():
				return
			}
		}
	}()
	var delivered uint64
	for {
		select {
		case req := <-reqs:
			for _, fr := range req.Frames {
				if in.Deliver(wire.Frame{Topic: fr.Topic, Seq: fr.Seq, Payload: fr.Payload}) != nil {
					return s.a.ingestEnded()
				}
				delivered++
			}
		case <-in.Done():
			return s.a.ingestEnded()
		case <-ctx.Done():
			if cause := context.Cause(ctx); !errors.Is(cause, io.EOF) {
				return cause
			}
			return stream.SendAndClose(&kvindexv1.ForwardEventsResponse{Delivered: delivered})
		}
	}
}

// ingestEnded is how a ForwardEvents stream ends when this member's ingest
// stopped: not leading any more (naming the leader when known), or shutting down.
func (a *API) ingestEnded() error {
	if err := a.leaderOnly(); err != nil {
		return err
	}
	return fmt.Errorf("%w: this member's ingest stopped", ErrUnavailable)
}

var _ ingest.Forwarder = (*frameForwarder)(nil)
