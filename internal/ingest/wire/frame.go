package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strings"
)

// EndOfReplaySeq is the sequence number of the end marker an engine's replay socket
// sends after the last buffered batch (Python's (-1).to_bytes(8, "big", signed=True)).
const EndOfReplaySeq uint64 = math.MaxUint64

var (
	// ErrBadFrame: a ZMQ multipart message does not have the expected parts.
	ErrBadFrame = errors.New("bad frame")
	// ErrBadTopic: a topic does not follow the kv@<pod>@<model> convention.
	ErrBadTopic = errors.New("bad topic")
)

// Frame is one sequenced batch as it arrives: the publisher's topic, its sequence
// number and the msgpack EventBatch payload (still encoded).
type Frame struct {
	Topic   string
	Seq     uint64
	Payload []byte
}

// ParseFrame parses a live PUB/SUB message [topic, seq (8 bytes big-endian), payload].
// vLLM and SGLang always send all three parts (the topic may be empty), so a
// two-part [seq, payload] message is rejected rather than guessed at. A seq of
// EndOfReplaySeq is rejected too: no engine reaches it (it is -1 to Python's
// signed encoding), and a stream taking it would have no seq left after it.
// Payload aliases parts[2].
func ParseFrame(parts [][]byte) (Frame, error) {
	if len(parts) != 3 {
		return Frame{}, fmt.Errorf("%w: %d parts, want [topic, seq, payload]", ErrBadFrame, len(parts))
	}
	seq, err := parseSeq(parts[1])
	if err != nil {
		return Frame{}, err
	}
	if seq == EndOfReplaySeq {
		return Frame{}, fmt.Errorf("%w: a live frame with the replay end marker's seq %d", ErrBadFrame, seq)
	}
	return Frame{Topic: string(parts[0]), Seq: seq, Payload: parts[2]}, nil
}

// ReplayRequest is the message a DEALER sends to an engine's ROUTER replay socket to
// ask for every buffered batch with seq >= startSeq: ["", startSeq 8 bytes BE]. The
// engine answers with one reply per batch, then an end marker (ParseReplayReply).
func ReplayRequest(startSeq uint64) [][]byte {
	seq := make([]byte, 8)
	binary.BigEndian.PutUint64(seq, startSeq)
	return [][]byte{{}, seq}
}

// ParseReplayReply parses one message a DEALER receives from a replay socket:
// ["", topic, seq, payload] (current vLLM) or ["", seq, payload] (older vLLM, SGLang).
// end reports the end marker (seq EndOfReplaySeq); its payload is empty and its
// Frame carries nothing else. Payload aliases the last part.
func ParseReplayReply(parts [][]byte) (f Frame, end bool, err error) {
	if len(parts) != 3 && len(parts) != 4 {
		return Frame{}, false, fmt.Errorf("%w: replay reply has %d parts, want 3 or 4", ErrBadFrame, len(parts))
	}
	if len(parts[0]) != 0 {
		return Frame{}, false, fmt.Errorf("%w: replay reply starts with a %d-byte part, want the empty delimiter", ErrBadFrame, len(parts[0]))
	}
	rest := parts[1:]
	if len(rest) == 3 {
		f.Topic = string(rest[0])
		rest = rest[1:]
	}
	if f.Seq, err = parseSeq(rest[0]); err != nil {
		return Frame{}, false, err
	}
	if f.Seq == EndOfReplaySeq {
		return Frame{Seq: f.Seq}, true, nil
	}
	f.Payload = rest[1]
	return f, false, nil
}

func parseSeq(b []byte) (uint64, error) {
	if len(b) != 8 {
		return 0, fmt.Errorf("%w: sequence number has %d bytes, want 8", ErrBadFrame, len(b))
	}
	return binary.BigEndian.Uint64(b), nil
}

// topicPrefix starts every topic of the llm-d convention.
const topicPrefix = "kv@"

// ParseTopic splits a topic of llm-d's convention, "kv@<pod>@<model>", as vLLM is
// configured to publish it (--kv-events-config '{"topic": "kv@$POD_NAME@$MODEL"}'):
// the worker is the pod name, the model is the served model name. The pod must not
// contain '@'; the model may (everything after the second '@'). Both must be
// non-empty.
func ParseTopic(topic string) (worker, model string, err error) {
	rest, ok := strings.CutPrefix(topic, topicPrefix)
	if !ok {
		return "", "", fmt.Errorf("%w: %q does not start with %q", ErrBadTopic, topic, topicPrefix)
	}
	worker, model, ok = strings.Cut(rest, "@")
	if !ok || worker == "" || model == "" {
		return "", "", fmt.Errorf("%w: %q, want kv@<pod>@<model>", ErrBadTopic, topic)
	}
	return worker, model, nil
}

// FormatTopic is the inverse of ParseTopic, for publishers (the engine simulator,
// the relay).
func FormatTopic(worker, model string) string {
	return topicPrefix + worker + "@" + model
}
