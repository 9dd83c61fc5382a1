package fakeengine

import (
	"encoding/binary"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	zmq "github.com/pebbe/zmq4"
)

// endSeq is the replay end marker: seq -1 as 8 big-endian bytes (ff x 8).
var endSeq = []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// pubItem is one instruction to the publishing goroutine, kept in order with the
// batches: a batch to send, a replay-buffer reset, or a flush barrier.
type pubItem struct {
	seq     int64
	batch   Batch
	reset   bool
	flushed chan struct{}
}

type replayEntry struct {
	seq     int64
	payload []byte
}

// publisher is one rank's event stream, as vLLM's ZmqEventPublisher: a PUB socket
// that sends [topic, seq (8 bytes big-endian), payload], a buffer of the last
// ReplayBufferSteps payloads, and an optional ROUTER socket answering replay
// requests from it.
//
// Each socket is used by one goroutine only (ZMQ sockets are not thread-safe): the
// PUB socket by pubLoop, the ROUTER socket by replayLoop. The replay buffer is
// shared under mu.
type publisher struct {
	log    *slog.Logger
	rank   string
	topic  []byte
	wire   WireFormat
	layout ReplayLayout
	faults func() Faults
	m      *metrics

	pubSock    *zmq.Socket
	routerSock *zmq.Socket
	// PubEndpoint and ReplayEndpoint are the endpoints actually bound or connected.
	pubEndpoint    string
	replayEndpoint string

	items      chan pubItem
	pubDone    chan struct{}
	replayDone chan struct{}

	mu     sync.Mutex
	buf    []replayEntry // ring, oldest at head
	head   int
	length int
}

func newPublisher(zctx *zmq.Context, cfg *Config, rank int, topic string, faults func() Faults, m *metrics, log *slog.Logger) (_ *publisher, err error) {
	p := &publisher{
		log:        log.With("dp_rank", rank),
		rank:       strconv.Itoa(rank),
		topic:      []byte(topic),
		wire:       cfg.KVEventsWire,
		layout:     cfg.ReplayLayout,
		faults:     faults,
		m:          m,
		items:      make(chan pubItem, 1024),
		pubDone:    make(chan struct{}),
		replayDone: make(chan struct{}),
		buf:        make([]replayEntry, cfg.ReplayBufferSteps),
	}
	defer func() {
		if err != nil {
			p.closeSockets()
		}
	}()
	endpoint, err := offsetEndpoint(cfg.KVEventsEndpoint, rank)
	if err != nil {
		return nil, err
	}
	if p.pubSock, err = zctx.NewSocket(zmq.PUB); err != nil {
		return nil, fmt.Errorf("kv events PUB socket: %w", err)
	}
	// Like vLLM's publisher: a deep send queue, and shutdown may not wait long for
	// slow subscribers.
	if err = p.pubSock.SetSndhwm(100000); err != nil {
		return nil, err
	}
	if err = p.pubSock.SetLinger(500 * time.Millisecond); err != nil {
		return nil, err
	}
	if bindsEndpoint(endpoint) {
		err = p.pubSock.Bind(endpoint)
	} else {
		err = p.pubSock.Connect(endpoint)
	}
	if err != nil {
		return nil, fmt.Errorf("kv events endpoint %s: %w", endpoint, err)
	}
	if p.pubEndpoint, err = p.pubSock.GetLastEndpoint(); err != nil {
		return nil, err
	}
	if cfg.KVEventsReplayEndpoint != "" {
		replay, err := offsetEndpoint(cfg.KVEventsReplayEndpoint, rank)
		if err != nil {
			return nil, err
		}
		if p.routerSock, err = zctx.NewSocket(zmq.ROUTER); err != nil {
			return nil, fmt.Errorf("kv events replay socket: %w", err)
		}
		// A replay may send the whole buffer at once; ROUTER silently drops what
		// exceeds the peer's high-water mark.
		if err = p.routerSock.SetSndhwm(2*cfg.ReplayBufferSteps + 16); err != nil {
			return nil, err
		}
		if err = p.routerSock.SetLinger(0); err != nil {
			return nil, err
		}
		if err = p.routerSock.Bind(replay); err != nil {
			return nil, fmt.Errorf("kv events replay endpoint %s: %w", replay, err)
		}
		if p.replayEndpoint, err = p.routerSock.GetLastEndpoint(); err != nil {
			return nil, err
		}
	}
	return p, nil
}

func (p *publisher) closeSockets() {
	if p.pubSock != nil {
		p.pubSock.Close()
	}
	if p.routerSock != nil {
		p.routerSock.Close()
	}
}

// start runs the goroutines that own the sockets.
func (p *publisher) start() {
	go p.pubLoop()
	if p.routerSock != nil {
		go p.replayLoop()
	} else {
		close(p.replayDone)
	}
}

func (p *publisher) enqueue(seq int64, b Batch) { p.items <- pubItem{seq: seq, batch: b} }
func (p *publisher) enqueueReset()              { p.items <- pubItem{reset: true} }

// flush returns a channel closed once everything enqueued before it has been sent.
func (p *publisher) flush() <-chan struct{} {
	ch := make(chan struct{})
	p.items <- pubItem{flushed: ch}
	return ch
}

// stopPublishing ends pubLoop after it drained the queue; the PUB socket is closed
// there. The ROUTER loop ends when the ZMQ context terminates.
func (p *publisher) stopPublishing() {
	close(p.items)
	<-p.pubDone
}

func (p *publisher) pubLoop() {
	defer close(p.pubDone)
	defer p.pubSock.Close()
	seqBytes := make([]byte, 8)
	for it := range p.items {
		switch {
		case it.flushed != nil:
			close(it.flushed)
			continue
		case it.reset:
			p.mu.Lock()
			p.head, p.length = 0, 0
			clear(p.buf)
			p.mu.Unlock()
			continue
		}
		payload, err := EncodeBatch(it.batch, p.wire)
		if err != nil {
			p.log.Error("dropping unencodable event batch", "seq", it.seq, "err", err)
			continue
		}
		p.remember(it.seq, payload)
		if n := p.faults().DropEveryNBatches; n > 0 && (it.seq+1)%int64(n) == 0 {
			p.m.batches.WithLabelValues(p.rank, "dropped").Inc()
			continue
		}
		binary.BigEndian.PutUint64(seqBytes, uint64(it.seq))
		if _, err := p.pubSock.SendMessage(p.topic, seqBytes, payload); err != nil {
			p.log.Warn("kv event batch not sent", "seq", it.seq, "err", err)
			p.m.batches.WithLabelValues(p.rank, "failed").Inc()
			continue
		}
		p.m.batches.WithLabelValues(p.rank, "published").Inc()
	}
}

func (p *publisher) remember(seq int64, payload []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	idx := (p.head + p.length) % len(p.buf)
	if p.length == len(p.buf) {
		p.head = (p.head + 1) % len(p.buf)
	} else {
		p.length++
	}
	p.buf[idx] = replayEntry{seq: seq, payload: payload}
}

// since copies the buffered batches with seq >= start, oldest first.
func (p *publisher) since(start uint64) []replayEntry {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []replayEntry
	for i := 0; i < p.length; i++ {
		e := p.buf[(p.head+i)%len(p.buf)]
		if uint64(e.seq) >= start {
			out = append(out, e)
		}
	}
	return out
}

func (p *publisher) replayLoop() {
	defer close(p.replayDone)
	defer p.routerSock.Close()
	for {
		frames, err := p.routerSock.RecvMessageBytes(0)
		if err != nil {
			if zmq.AsErrno(err) == zmq.ETERM {
				return
			}
			p.log.Warn("replay receive failed", "err", err)
			continue
		}
		// [identity, "", start seq (8 bytes big-endian)], as a DEALER sends it.
		if len(frames) != 3 || len(frames[1]) != 0 || len(frames[2]) != 8 {
			p.log.Warn("ignoring malformed replay request", "frames", len(frames))
			p.m.replays.WithLabelValues(p.rank, "malformed").Inc()
			continue
		}
		p.m.replays.WithLabelValues(p.rank, "served").Inc()
		if err := p.serveReplay(frames[0], binary.BigEndian.Uint64(frames[2])); err != nil {
			if zmq.AsErrno(err) == zmq.ETERM {
				return
			}
			p.log.Warn("replay reply failed", "err", err)
		}
	}
}

func (p *publisher) serveReplay(client []byte, start uint64) error {
	seqBytes := make([]byte, 8)
	for _, e := range p.since(start) {
		binary.BigEndian.PutUint64(seqBytes, uint64(e.seq))
		var err error
		if p.layout == ReplayNew {
			_, err = p.routerSock.SendMessage(client, "", p.topic, seqBytes, e.payload)
		} else {
			_, err = p.routerSock.SendMessage(client, "", seqBytes, e.payload)
		}
		if err != nil {
			return err
		}
	}
	var err error
	if p.layout == ReplayNew {
		_, err = p.routerSock.SendMessage(client, "", "", endSeq, "")
	} else {
		_, err = p.routerSock.SendMessage(client, "", endSeq, "")
	}
	return err
}
