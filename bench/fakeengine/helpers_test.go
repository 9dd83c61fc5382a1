package fakeengine

import (
	"encoding/binary"
	"fmt"
	"log/slog"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"
	"github.com/vmihailenco/msgpack/v5"
)

// testConfig is a small engine that never sleeps (simulated time only), binds its
// HTTP and ZMQ sockets to free loopback ports, and hashes deterministically.
func testConfig() Config {
	c := DefaultConfig()
	c.Port = 0
	c.KVEventsEndpoint = "tcp://127.0.0.1:*"
	c.TimeScale = 0
	c.BlockHashSeed = 12345
	c.BlockSize = 4
	c.NumGPUBlocks = 64
	return c
}

func startEngine(t *testing.T, cfg Config) *Engine {
	t.Helper()
	e, err := New(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := e.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return e
}

// seqPrompt returns n distinct-looking token ids starting at base.
func seqPrompt(base, n int) []uint32 {
	p := make([]uint32, n)
	for i := range p {
		p[i] = uint32((base + i) % 256)
	}
	return p
}

type frame struct {
	topic   string
	seq     uint64
	payload []byte
}

// subscriber is a real libzmq SUB socket on one rank's event stream.
type subscriber struct {
	t    *testing.T
	sock *zmq.Socket
	// lastSeq is the seq of the handshake batch; later batches follow it.
	lastSeq uint64
}

// subscribe connects to rank's PUB socket and waits until the subscription is live:
// it resets the (idle) engine's prefix cache until the AllBlocksCleared batch that
// produces arrives, so no later batch can be lost to ZMQ's slow-joiner window.
func subscribe(t *testing.T, e *Engine, rank int) *subscriber {
	t.Helper()
	sock, err := zmq.NewSocket(zmq.SUB)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sock.Close() })
	if err := sock.SetSubscribe(e.Topic()); err != nil {
		t.Fatal(err)
	}
	if err := sock.Connect(e.EventEndpoints()[rank]); err != nil {
		t.Fatal(err)
	}
	if err := sock.SetRcvtimeo(50 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	s := &subscriber{t: t, sock: sock}
	for attempt := 0; attempt < 200; attempt++ {
		if err := e.ResetPrefixCache(); err != nil {
			t.Fatal(err)
		}
		msg, err := sock.RecvMessageBytes(0)
		if err != nil {
			continue
		}
		f := toFrame(t, msg)
		if evs := decodeBatch(t, f.payload).events; len(evs) != 1 || evs[0].kind != "AllBlocksCleared" {
			t.Fatalf("handshake batch = %+v, want one AllBlocksCleared", evs)
		}
		s.lastSeq = f.seq
		if err := sock.SetRcvtimeo(10 * time.Second); err != nil {
			t.Fatal(err)
		}
		return s
	}
	t.Fatal("subscription never became live")
	return nil
}

func toFrame(t *testing.T, msg [][]byte) frame {
	t.Helper()
	if len(msg) != 3 || len(msg[1]) != 8 {
		t.Fatalf("frame = %d parts %q, want [topic, 8-byte seq, payload]", len(msg), msg)
	}
	return frame{topic: string(msg[0]), seq: binary.BigEndian.Uint64(msg[1]), payload: msg[2]}
}

func (s *subscriber) next() frame {
	s.t.Helper()
	msg, err := s.sock.RecvMessageBytes(0)
	if err != nil {
		s.t.Fatalf("no event batch received: %v", err)
	}
	return toFrame(s.t, msg)
}

// decodedEvent is a KV event read back with a generic msgpack decoder, whichever
// wire layout it used.
type decodedEvent struct {
	kind      string
	hashes    []uint64
	parent    *uint64
	tokens    []uint32
	blockSize uint64
	medium    any
	loraName  any
	extraKeys any
}

type decodedBatch struct {
	ts     float64
	events []decodedEvent
	dpRank uint64
}

func asUint(t *testing.T, v any) uint64 {
	t.Helper()
	switch n := v.(type) {
	case int8:
		return uint64(n)
	case int16:
		return uint64(n)
	case int32:
		return uint64(n)
	case int64:
		return uint64(n)
	case uint8:
		return uint64(n)
	case uint16:
		return uint64(n)
	case uint32:
		return uint64(n)
	case uint64:
		return n
	}
	t.Fatalf("%v (%T) is not an integer", v, v)
	return 0
}

func asUints(t *testing.T, v any) []uint64 {
	t.Helper()
	list, ok := v.([]any)
	if !ok {
		t.Fatalf("%v (%T) is not an array", v, v)
	}
	out := make([]uint64, len(list))
	for i, x := range list {
		out[i] = asUint(t, x)
	}
	return out
}

// decodeBatch decodes a payload generically: [ts, events, dp_rank] with events as
// tagged maps or arrays.
func decodeBatch(t *testing.T, payload []byte) decodedBatch {
	t.Helper()
	var raw []any
	if err := msgpack.Unmarshal(payload, &raw); err != nil {
		t.Fatalf("payload is not msgpack: %v", err)
	}
	if len(raw) != 3 {
		t.Fatalf("EventBatch has %d elements, want 3", len(raw))
	}
	ts, ok := raw[0].(float64)
	if !ok {
		t.Fatalf("ts = %T, want float64", raw[0])
	}
	b := decodedBatch{ts: ts, dpRank: asUint(t, raw[2])}
	events, ok := raw[1].([]any)
	if !ok {
		t.Fatalf("events = %T", raw[1])
	}
	for _, ev := range events {
		b.events = append(b.events, decodeEvent(t, ev))
	}
	return b
}

var fieldOrder = map[string][]string{
	"BlockStored":      {"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name", "extra_keys"},
	"BlockRemoved":     {"block_hashes", "medium"},
	"AllBlocksCleared": {},
}

func decodeEvent(t *testing.T, v any) decodedEvent {
	t.Helper()
	fields := map[string]any{}
	switch ev := v.(type) {
	case map[string]any:
		for k, x := range ev {
			fields[k] = x
		}
	case []any:
		if len(ev) == 0 {
			t.Fatal("empty event array")
		}
		tag, _ := ev[0].(string)
		order, ok := fieldOrder[tag]
		if !ok || len(ev)-1 > len(order) {
			t.Fatalf("array event %v has unknown tag or too many fields", ev)
		}
		fields["type"] = tag
		for i, x := range ev[1:] {
			fields[order[i]] = x
		}
	default:
		t.Fatalf("event %v (%T) is neither map nor array", v, v)
	}
	d := decodedEvent{medium: fields["medium"], loraName: fields["lora_name"], extraKeys: fields["extra_keys"]}
	d.kind, _ = fields["type"].(string)
	if h, ok := fields["block_hashes"]; ok {
		d.hashes = asUints(t, h)
	}
	if p := fields["parent_block_hash"]; p != nil {
		v := asUint(t, p)
		d.parent = &v
	}
	if tk, ok := fields["token_ids"]; ok {
		for _, x := range asUints(t, tk) {
			d.tokens = append(d.tokens, uint32(x))
		}
	}
	if bs, ok := fields["block_size"]; ok {
		d.blockSize = asUint(t, bs)
	}
	return d
}

func (d decodedEvent) String() string {
	return fmt.Sprintf("%s%v(medium=%v)", d.kind, d.hashes, d.medium)
}
