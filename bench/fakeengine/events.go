package fakeengine

import (
	"bytes"
	"fmt"

	"github.com/vmihailenco/msgpack/v5"
)

// EventKind is the msgspec tag of a KV cache event.
type EventKind string

// The three vLLM KV cache events.
const (
	BlockStored      EventKind = "BlockStored"
	BlockRemoved     EventKind = "BlockRemoved"
	AllBlocksCleared EventKind = "AllBlocksCleared"
)

// Media the engine names in events (vLLM's MEDIUM_GPU and MEDIUM_CPU).
const (
	MediumGPU = "GPU"
	MediumCPU = "CPU"
)

// Event is one KV cache event as vLLM's vllm/distributed/kv_events.py defines it.
// Fields a kind does not carry are ignored when encoding.
type Event struct {
	Kind        EventKind
	BlockHashes []uint64
	// ParentHash is the engine hash of the block before BlockHashes[0]; encoded as
	// nil when HasParent is false (the chain starts at the root).
	ParentHash uint64
	HasParent  bool
	// TokenIDs holds BlockSize tokens per stored block, in block order.
	TokenIDs  []uint32
	BlockSize int
	// LoRAID is vLLM's deprecated numeric adapter id; 0 is encoded as nil.
	LoRAID   int
	LoRAName string // "" is encoded as nil
	Medium   string
	// ExtraKeys holds, per stored block, the extra hash inputs in vLLM's raw tuple
	// form (LoRA name on every block, cache_salt on a sequence's first block). The
	// field is omitted from the wire when no block has any, as msgspec's
	// omit_defaults does.
	ExtraKeys [][]string
}

// Batch is vLLM's EventBatch: [ts, events, data_parallel_rank].
type Batch struct {
	TS     float64
	Events []Event
	DPRank uint32
}

// WireFormat says how events are laid out inside a batch.
type WireFormat string

const (
	// WireMap encodes events as msgspec tagged maps {"type": "BlockStored", ...}
	// (vLLM >= 0.26, current SGLang).
	WireMap WireFormat = "map"
	// WireArray encodes events as msgspec tagged arrays ["BlockStored", ...]
	// (vLLM <= 0.23, older SGLang).
	WireArray WireFormat = "array"
)

// EncodeBatch returns the msgpack payload of b exactly as msgspec encodes vLLM's
// EventBatch (array_like) with events in the given wire format: integers in their
// shortest msgpack form, floats as float64, absent optional values as nil, trailing
// default-valued fields omitted.
func EncodeBatch(b Batch, wire WireFormat) ([]byte, error) {
	if wire != WireMap && wire != WireArray {
		return nil, fmt.Errorf("%w: wire format %q", ErrInvalidConfig, wire)
	}
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	w := &writer{enc: enc}
	w.arrayLen(3)
	w.float(b.TS)
	w.arrayLen(len(b.Events))
	for i := range b.Events {
		if err := w.event(&b.Events[i], wire); err != nil {
			return nil, err
		}
	}
	w.uint(uint64(b.DPRank))
	if w.err != nil {
		return nil, fmt.Errorf("encode event batch: %w", w.err)
	}
	return buf.Bytes(), nil
}

// writer keeps the first encoding error so the layout code reads straight through.
type writer struct {
	enc *msgpack.Encoder
	err error
}

func (w *writer) do(err error) {
	if w.err == nil {
		w.err = err
	}
}

func (w *writer) arrayLen(n int)  { w.do(w.enc.EncodeArrayLen(n)) }
func (w *writer) mapLen(n int)    { w.do(w.enc.EncodeMapLen(n)) }
func (w *writer) str(s string)    { w.do(w.enc.EncodeString(s)) }
func (w *writer) uint(v uint64)   { w.do(w.enc.EncodeUint(v)) }
func (w *writer) float(v float64) { w.do(w.enc.EncodeFloat64(v)) }
func (w *writer) nil()            { w.do(w.enc.EncodeNil()) }

func (w *writer) optStr(s string) {
	if s == "" {
		w.nil()
		return
	}
	w.str(s)
}

func (w *writer) hashes(hs []uint64) {
	w.arrayLen(len(hs))
	for _, h := range hs {
		w.uint(h)
	}
}

// field writes the key in map form; array form is positional.
func (w *writer) field(wire WireFormat, name string) {
	if wire == WireMap {
		w.str(name)
	}
}

func (w *writer) event(e *Event, wire WireFormat) error {
	switch e.Kind {
	case BlockStored:
		withExtra := hasExtraKeys(e.ExtraKeys)
		n := 7
		if withExtra {
			n++
		}
		w.header(wire, e.Kind, n)
		w.field(wire, "block_hashes")
		w.hashes(e.BlockHashes)
		w.field(wire, "parent_block_hash")
		if e.HasParent {
			w.uint(e.ParentHash)
		} else {
			w.nil()
		}
		w.field(wire, "token_ids")
		w.arrayLen(len(e.TokenIDs))
		for _, t := range e.TokenIDs {
			w.uint(uint64(t))
		}
		w.field(wire, "block_size")
		w.uint(uint64(e.BlockSize))
		w.field(wire, "lora_id")
		if e.LoRAID == 0 {
			w.nil()
		} else {
			w.uint(uint64(e.LoRAID))
		}
		w.field(wire, "medium")
		w.optStr(e.Medium)
		w.field(wire, "lora_name")
		w.optStr(e.LoRAName)
		if withExtra {
			w.field(wire, "extra_keys")
			w.extraKeys(e.ExtraKeys)
		}
	case BlockRemoved:
		w.header(wire, e.Kind, 2)
		w.field(wire, "block_hashes")
		w.hashes(e.BlockHashes)
		w.field(wire, "medium")
		w.optStr(e.Medium)
	case AllBlocksCleared:
		w.header(wire, e.Kind, 0)
	default:
		return fmt.Errorf("encode event batch: unknown event kind %q", e.Kind)
	}
	return nil
}

// header opens an event with its msgspec tag: the "type" entry of a map, or the
// first element of an array.
func (w *writer) header(wire WireFormat, kind EventKind, fields int) {
	if wire == WireMap {
		w.mapLen(fields + 1)
		w.str("type")
	} else {
		w.arrayLen(fields + 1)
	}
	w.str(string(kind))
}

func (w *writer) extraKeys(keys [][]string) {
	w.arrayLen(len(keys))
	for _, k := range keys {
		if len(k) == 0 {
			w.nil()
			continue
		}
		w.arrayLen(len(k))
		for _, s := range k {
			w.str(s)
		}
	}
}

func hasExtraKeys(keys [][]string) bool {
	for _, k := range keys {
		if len(k) > 0 {
			return true
		}
	}
	return false
}
