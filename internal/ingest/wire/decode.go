package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// DefaultMaxPayload is the payload size limit NewDecoder uses when given 0. A
// BlockStored of 64 blocks of 16 tokens takes 3-6 KiB; a 128k-token prompt stored at
// once, under 1 MiB.
const DefaultMaxPayload = 16 << 20

// maxNesting bounds how deep the decoder follows nested arrays and maps it skips
// (extra_keys, unknown fields): without it a payload of nested one-byte arrays
// would recurse once per byte.
const maxNesting = 32

var (
	// ErrMalformed: the payload is not a valid EventBatch (bad msgpack, wrong types,
	// missing required fields, truncated, trailing bytes). The message names where.
	ErrMalformed = errors.New("malformed event batch")
	// ErrOversize: the payload is larger than the decoder's limit.
	ErrOversize = errors.New("event batch over size limit")
)

// DecodeStats counts what one Decode call skipped rather than rejected.
type DecodeStats struct {
	// UnknownEvents counts events whose tag is not BlockStored, BlockRemoved or
	// AllBlocksCleared; they are dropped.
	UnknownEvents int
	// UnknownFields counts map keys and trailing array fields the decoder does not
	// know, and known fields that the event's kind does not carry; they are ignored.
	UnknownFields int
	// UnknownMedia counts medium strings that are not one of the six known media;
	// those events get MediumUnknown (indexed as GPU).
	UnknownMedia int
	// The first unknown event tag, field name (or "Kind[position]" for arrays) and
	// medium seen in the payload, for logging.
	FirstUnknownEvent, FirstUnknownField, FirstUnknownMedium string
}

// Decoder decodes msgpack EventBatch payloads. It keeps state between calls, so one
// Decoder must not be used by two goroutines at once; the batches it returns share
// nothing with it or with the payload.
type Decoder struct {
	maxPayload int
	r          bytes.Reader
	payload    []byte // what r reads, for the integer-list fast path
	dec        *msgpack.Decoder
	stats      DecodeStats
	// salt collects the plain strings of the current event's extra_keys[0]
	// (saltFromExtraKeys).
	salt extraKeyStrings
}

// NewDecoder returns a decoder that rejects payloads larger than maxPayload bytes
// (DefaultMaxPayload when maxPayload <= 0).
func NewDecoder(maxPayload int) *Decoder {
	if maxPayload <= 0 {
		maxPayload = DefaultMaxPayload
	}
	d := &Decoder{maxPayload: maxPayload}
	// bytes.Reader is an io.ByteScanner, so the msgpack decoder reads it directly
	// without buffering and d.r.Len() is always the number of unread bytes.
	d.dec = msgpack.NewDecoder(&d.r)
	return d
}

// Decode decodes one EventBatch payload. See the package doc for the accepted forms.
// Errors wrap ErrOversize or ErrMalformed; unknown events and fields are not errors
// but are counted in the returned stats.
func (d *Decoder) Decode(payload []byte) (EventBatch, DecodeStats, error) {
	d.stats = DecodeStats{}
	if len(payload) > d.maxPayload {
		return EventBatch{}, d.stats, fmt.Errorf("%w: %d bytes, limit %d", ErrOversize, len(payload), d.maxPayload)
	}
	d.r.Reset(payload)
	d.payload = payload
	batch, err := d.decodeBatch()
	if err == nil && d.r.Len() != 0 {
		err = fmt.Errorf("%d bytes after the batch", d.r.Len())
	}
	if err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return EventBatch{}, d.stats, fmt.Errorf("%w (truncated): %w", ErrMalformed, err)
		}
		return EventBatch{}, d.stats, fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	return batch, d.stats, nil
}

func (d *Decoder) decodeBatch() (EventBatch, error) {
	var b EventBatch
	c, err := d.peek()
	if err != nil {
		return b, err
	}
	switch {
	case isArrayCode(c):
		n, err := d.arrayLen()
		if err != nil {
			return b, err
		}
		if n < 2 {
			return b, fmt.Errorf("batch array has %d fields, want [ts, events, ...]", n)
		}
		if b.TS, err = d.float("ts"); err != nil {
			return b, err
		}
		if b.Events, err = d.events(); err != nil {
			return b, err
		}
		if n >= 3 {
			if b.DPRank, b.HasDPRank, err = d.optUint32("data_parallel_rank"); err != nil {
				return b, err
			}
		}
		for i := 3; i < n; i++ {
			d.unknownField(func() string { return fmt.Sprintf("EventBatch[%d]", i) })
			if err := d.skip(0); err != nil {
				return b, err
			}
		}
		return b, nil
	case isMapCode(c):
		return d.mapBatch()
	}
	return b, fmt.Errorf("batch is msgpack code 0x%02x, want array or map", c)
}

func (d *Decoder) mapBatch() (EventBatch, error) {
	var b EventBatch
	n, err := d.mapLen()
	if err != nil {
		return b, err
	}
	var hasTS, hasEvents bool
	for i := 0; i < n; i++ {
		key, ok, err := d.key()
		if err != nil {
			return b, err
		}
		switch {
		case !ok:
			d.unknownField(func() string { return "EventBatch{non-string key}" })
			err = d.skip(0)
		case string(key) == "ts":
			b.TS, err = d.float("ts")
			hasTS = true
		case string(key) == "events":
			b.Events, err = d.events()
			hasEvents = true
		case string(key) == "data_parallel_rank" || string(key) == "attn_dp_rank":
			b.DPRank, b.HasDPRank, err = d.optUint32(string(key))
		default:
			d.unknownField(func() string { return string(key) })
			err = d.skip(0)
		}
		if err != nil {
			return b, err
		}
	}
	if !hasTS || !hasEvents {
		return b, errors.New("batch map needs both ts and events")
	}
	return b, nil
}

func (d *Decoder) events() ([]Event, error) {
	n, err := d.arrayLen()
	if err != nil {
		return nil, fmt.Errorf("events: %w", err)
	}
	if n < 0 {
		return nil, errors.New("events is nil")
	}
	// n is only bounded by the payload size, and an Event is much bigger than the
	// smallest wire event: let append grow the slice past a typical batch.
	events := make([]Event, 0, min(n, 256))
	for i := 0; i < n; i++ {
		ev, known, err := d.event()
		if err != nil {
			return nil, fmt.Errorf("events[%d]: %w", i, err)
		}
		if known {
			events = append(events, ev)
		}
	}
	return events, nil
}

// event decodes one tagged event, as a map {"type": tag, field: value...} or as an
// array [tag, field...]. known is false for an unknown tag (already skipped).
func (d *Decoder) event() (ev Event, known bool, err error) {
	c, err := d.peek()
	if err != nil {
		return ev, false, err
	}
	switch {
	case isArrayCode(c):
		return d.arrayEvent()
	case isMapCode(c):
		return d.mapEvent()
	}
	return ev, false, fmt.Errorf("event is msgpack code 0x%02x, want array or map", c)
}

func (d *Decoder) arrayEvent() (ev Event, known bool, err error) {
	n, err := d.arrayLen()
	if err != nil {
		return ev, false, err
	}
	if n < 1 {
		return ev, false, errors.New("event array has no tag")
	}
	tag, err := d.stringBytes("event tag")
	if err != nil {
		return ev, false, err
	}
	ev.Kind = kindOf(tag)
	if ev.Kind == 0 {
		d.unknownEvent(tag)
		return ev, false, d.skipN(n - 1)
	}
	d.salt = extraKeyStrings{}
	order := fieldOrder[ev.Kind]
	for pos := 0; pos < n-1; pos++ {
		// SGLang appends its metadata map right after medium (BlockStoredWithMetadata
		// is kw_only, so msgspec encodes it after every positional field).
		if ev.Kind == BlockStored && pos >= posFirstOptionalStored {
			c, err := d.peek()
			if err != nil {
				return ev, false, err
			}
			if isMapCode(c) {
				if err := d.decodeField(&ev, fMetadata); err != nil {
					return ev, false, err
				}
				continue
			}
		}
		if pos >= len(order) {
			d.unknownField(func() string { return fmt.Sprintf("%s[%d]", ev.Kind, pos) })
			if err := d.skip(0); err != nil {
				return ev, false, err
			}
			continue
		}
		if err := d.decodeField(&ev, order[pos]); err != nil {
			return ev, false, err
		}
	}
	if have, want := n-1, requiredPositions[ev.Kind]; have < want {
		return ev, false, fmt.Errorf("%s array has %d fields, want at least %d", ev.Kind, have, want)
	}
	d.saltFromExtraKeys(&ev)
	return ev, true, nil
}

func (d *Decoder) mapEvent() (ev Event, known bool, err error) {
	n, err := d.mapLen()
	if err != nil {
		return ev, false, err
	}
	var seen fieldSet
	d.salt = extraKeyStrings{}
	for i := 0; i < n; i++ {
		key, ok, err := d.key()
		if err != nil {
			return ev, false, err
		}
		if !ok {
			d.unknownField(func() string { return "event{non-string key}" })
			if err := d.skip(0); err != nil {
				return ev, false, err
			}
			continue
		}
		if string(key) == "type" {
			tag, err := d.stringBytes("event type")
			if err != nil {
				return ev, false, err
			}
			if ev.Kind = kindOf(tag); ev.Kind == 0 {
				d.unknownEvent(tag)
				// msgspec writes the tag first, so an unknown event's fields are skipped
				// unread, whatever types they have.
				return ev, false, d.skipN(2 * (n - i - 1))
			}
			continue
		}
		f, ok := fieldByName(key)
		if !ok {
			d.unknownField(func() string { return string(key) })
			if err := d.skip(0); err != nil {
				return ev, false, err
			}
			continue
		}
		if err := d.decodeField(&ev, f); err != nil {
			return ev, false, err
		}
		seen |= 1 << f
	}
	if ev.Kind == 0 {
		return ev, false, errors.New("event map has no type")
	}
	if foreign := seen &^ kindFields[ev.Kind]; foreign != 0 {
		for f := field(0); f < numFields; f++ {
			if foreign&(1<<f) != 0 {
				d.unknownField(func() string { return fieldNames[f] })
			}
		}
		ev = onlyFieldsOf(ev)
	}
	if missing := requiredFields[ev.Kind] &^ seen; missing != 0 {
		for f := field(0); f < numFields; f++ {
			if missing&(1<<f) != 0 {
				return ev, false, fmt.Errorf("%s without %s", ev.Kind, fieldNames[f])
			}
		}
	}
	d.saltFromExtraKeys(&ev)
	return ev, true, nil
}

// field identifies an event field; the same decoding serves the map and array forms.
type field uint8

const (
	fBlockHashes field = iota
	fParentBlockHash
	fTokenIDs
	fBlockSize
	fLoRAID
	fMedium
	fLoRAName
	fExtraKeys
	fGroupIdx
	fKVCacheSpecKind
	fSlidingWindow
	fLocality
	fOwnership
	fSessionID
	fCacheSalt
	fMetadata
	numFields
)

type fieldSet uint32

var fieldNames = [numFields]string{
	fBlockHashes:     "block_hashes",
	fParentBlockHash: "parent_block_hash",
	fTokenIDs:        "token_ids",
	fBlockSize:       "block_size",
	fLoRAID:          "lora_id",
	fMedium:          "medium",
	fLoRAName:        "lora_name",
	fExtraKeys:       "extra_keys",
	fGroupIdx:        "group_idx",
	fKVCacheSpecKind: "kv_cache_spec_kind",
	fSlidingWindow:   "kv_cache_spec_sliding_window",
	fLocality:        "locality",
	fOwnership:       "ownership",
	fSessionID:       "session_id",
	fCacheSalt:       "cache_salt",
	fMetadata:        "metadata",
}

func fieldByName(name []byte) (field, bool) {
	switch string(name) {
	case "block_hashes":
		return fBlockHashes, true
	case "parent_block_hash":
		return fParentBlockHash, true
	case "token_ids":
		return fTokenIDs, true
	case "block_size":
		return fBlockSize, true
	case "lora_id":
		return fLoRAID, true
	case "medium":
		return fMedium, true
	case "lora_name":
		return fLoRAName, true
	case "extra_keys":
		return fExtraKeys, true
	case "group_idx":
		return fGroupIdx, true
	case "kv_cache_spec_kind":
		return fKVCacheSpecKind, true
	case "kv_cache_spec_sliding_window":
		return fSlidingWindow, true
	case "locality":
		return fLocality, true
	case "ownership":
		return fOwnership, true
	case "session_id":
		return fSessionID, true
	case "cache_salt":
		return fCacheSalt, true
	case "metadata":
		return fMetadata, true
	}
	return 0, false
}

// fieldOrder is the array (msgspec array_like) field order per kind: vLLM's struct
// declaration order. SGLang's arrays are a prefix of vLLM's BlockStored (up to
// medium) plus its metadata map, which arrayEvent recognises by type.
var fieldOrder = [...][]field{
	BlockStored: {fBlockHashes, fParentBlockHash, fTokenIDs, fBlockSize, fLoRAID, fMedium,
		fLoRAName, fExtraKeys, fGroupIdx, fKVCacheSpecKind, fSlidingWindow, fLocality, fOwnership, fSessionID},
	BlockRemoved:     {fBlockHashes, fMedium, fGroupIdx, fLocality, fOwnership},
	AllBlocksCleared: nil,
}

// posFirstOptionalStored is the array position of lora_name, the first BlockStored
// field after the ones every engine version sends.
const posFirstOptionalStored = 6

// requiredPositions is how many array fields each kind must have: BlockStored needs
// block_hashes, parent_block_hash, token_ids and block_size.
var requiredPositions = [...]int{BlockStored: 4, BlockRemoved: 1, AllBlocksCleared: 0}

func setOf(fs ...field) fieldSet {
	var s fieldSet
	for _, f := range fs {
		s |= 1 << f
	}
	return s
}

var (
	kindFields = [...]fieldSet{
		BlockStored:      setOf(append(fieldOrder[BlockStored], fCacheSalt, fMetadata)...),
		BlockRemoved:     setOf(fieldOrder[BlockRemoved]...),
		AllBlocksCleared: 0,
	}
	requiredFields = [...]fieldSet{
		BlockStored:      setOf(fBlockHashes, fTokenIDs, fBlockSize),
		BlockRemoved:     setOf(fBlockHashes),
		AllBlocksCleared: 0,
	}
)

func kindOf(tag []byte) EventKind {
	switch string(tag) {
	case tagBlockStored:
		return BlockStored
	case tagBlockRemoved:
		return BlockRemoved
	case tagAllBlocksCleared:
		return AllBlocksCleared
	}
	return 0
}

func (d *Decoder) decodeField(ev *Event, f field) error {
	var err error
	switch f {
	case fBlockHashes:
		ev.BlockHashes, err = d.hashes()
	case fParentBlockHash:
		ev.HasParent = false
		if !d.nextIsNil() {
			// 0 means "no parent" too: publishers of the llm-d ecosystem send it
			// for a root block in the array form (llm-d's event pool reads it so).
			ev.Parent, err = d.hash()
			ev.HasParent = err == nil && ev.Parent != 0
		} else {
			err = d.skipNil()
		}
	case fTokenIDs:
		ev.TokenIDs, err = d.tokens()
	case fBlockSize:
		var v uint64
		v, err = d.uint(math.MaxInt32)
		ev.BlockSize = int(v)
	case fLoRAID:
		ev.LoRAID, ev.HasLoRAID, err = d.optInt()
	case fMedium:
		ev.Medium, err = d.medium()
	case fLoRAName:
		ev.LoRAName, err = d.optString()
	case fGroupIdx:
		ev.GroupIdx, ev.HasGroupIdx, err = d.optInt()
	case fKVCacheSpecKind:
		ev.KVCacheSpecKind, err = d.optString()
	case fSlidingWindow:
		ev.SlidingWindow, ev.HasSlidingWindow, err = d.optInt()
	case fLocality:
		ev.Locality, err = d.optString()
	case fCacheSalt:
		ev.CacheSalt, err = d.optString()
	case fMetadata:
		err = d.metadata(ev)
	case fExtraKeys:
		err = d.extraKeys()
	case fOwnership, fSessionID:
		err = d.skip(0)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", fieldNames[f], err)
	}
	return nil
}

// onlyFieldsOf drops the fields ev's kind does not carry (a BlockRemoved map with
// token_ids, say).
func onlyFieldsOf(ev Event) Event {
	switch ev.Kind {
	case BlockRemoved:
		return Event{Kind: ev.Kind, BlockHashes: ev.BlockHashes, Medium: ev.Medium,
			GroupIdx: ev.GroupIdx, HasGroupIdx: ev.HasGroupIdx, Locality: ev.Locality}
	case AllBlocksCleared:
		return Event{Kind: ev.Kind}
	}
	return ev
}

// extraKeyStrings are the top-level plain strings of a BlockStored's extra_keys[0].
type extraKeyStrings struct {
	first, last []byte
	n           int
}

// extraKeys reads vLLM's extra_keys: per block nil or a tuple of the block's extra
// hash inputs, in the order LoRA name, multimodal keys (tuples), cache salt (a
// request's first block only), prompt-embedding hashes (bytes). Only the first
// block's plain strings are kept, for saltFromExtraKeys.
func (d *Decoder) extraKeys() error {
	n, err := d.arrayLen()
	if err != nil {
		return err
	}
	for i := 0; i < n; i++ {
		c, err := d.peek()
		if err != nil {
			return err
		}
		if i > 0 || !isArrayCode(c) {
			if err := d.skip(1); err != nil {
				return err
			}
			continue
		}
		m, err := d.arrayLen()
		if err != nil {
			return err
		}
		for j := 0; j < m; j++ {
			c, err := d.peek()
			if err != nil {
				return err
			}
			if !msgpcode.IsString(c) {
				if err := d.skip(2); err != nil {
					return err
				}
				continue
			}
			s, err := d.readBytes()
			if err != nil {
				return err
			}
			if d.salt.n == 0 {
				d.salt.first = s
			}
			d.salt.last = s
			d.salt.n++
		}
	}
	return nil
}

// saltFromExtraKeys sets a BlockStored's CacheSalt from extra_keys when it has none:
// vLLM sends the salt nowhere else. Of the first block's plain strings, a leading one
// equal to the LoRA name is the LoRA key; the last one after it is the salt. (A vLLM
// that sent multimodal keys as plain strings would have one taken for a salt when no
// salt is set: its blocks would then be indexed apart, never matched wrongly.)
func (d *Decoder) saltFromExtraKeys(ev *Event) {
	strs := d.salt
	if ev.Kind != BlockStored || ev.CacheSalt != "" || strs.n == 0 {
		return
	}
	if ev.LoRAName != "" && string(strs.first) == ev.LoRAName {
		if strs.n == 1 {
			return
		}
	}
	ev.CacheSalt = string(strs.last)
}

// metadata decodes SGLang's BlockStoredMetadata map ({"cache_salt": ...}).
func (d *Decoder) metadata(ev *Event) error {
	n, err := d.mapLen()
	if err != nil || n < 0 {
		return err
	}
	for i := 0; i < n; i++ {
		key, ok, err := d.key()
		if err != nil {
			return err
		}
		if ok && string(key) == "cache_salt" {
			if ev.CacheSalt, err = d.optString(); err != nil {
				return fmt.Errorf("cache_salt: %w", err)
			}
			continue
		}
		d.unknownField(func() string {
			if !ok {
				return "metadata{non-string key}"
			}
			return "metadata." + string(key)
		})
		if err := d.skip(0); err != nil {
			return err
		}
	}
	return nil
}

func (d *Decoder) hashes() ([]uint64, error) {
	n, err := d.arrayLen()
	if err != nil {
		return nil, err
	}
	if n < 0 {
		return nil, errors.New("nil, want a list of hashes")
	}
	hs := make([]uint64, 0, min(n, maxPrealloc))
	for i := 0; i < n; i++ {
		if v, _, size := intAt(d.unread()); size > 0 {
			hs = append(hs, v)
			d.advance(size)
			continue
		}
		v, err := d.hash()
		if err != nil {
			return nil, fmt.Errorf("[%d]: %w", i, err)
		}
		hs = append(hs, v)
	}
	return hs, nil
}

// maxPrealloc caps how many list elements are allocated on the word of a length
// prefix; longer lists grow as they are actually read. A hash takes one payload byte
// but eight in memory.
const maxPrealloc = 4096

// hash reads an engine block hash: an integer (a negative one is reinterpreted as
// uint64, two's complement) or a byte string, of which the last 8 bytes are read
// big-endian (a shorter string as if left-padded with zeros).
func (d *Decoder) hash() (uint64, error) {
	c, err := d.peek()
	if err != nil {
		return 0, err
	}
	switch {
	case isIntCode(c):
		return d.dec.DecodeUint64()
	case msgpcode.IsBin(c):
		b, err := d.readBytes()
		if err != nil {
			return 0, err
		}
		if len(b) == 0 {
			return 0, errors.New("empty byte-string hash")
		}
		var h uint64
		for _, x := range b[max(0, len(b)-8):] {
			h = h<<8 | uint64(x)
		}
		return h, nil
	}
	return 0, fmt.Errorf("hash is msgpack code 0x%02x, want integer or bytes", c)
}

func (d *Decoder) tokens() ([]uint32, error) {
	n, err := d.arrayLen()
	if err != nil {
		return nil, err
	}
	if n < 0 {
		return nil, errors.New("nil, want a list of token ids")
	}
	ts := make([]uint32, 0, min(n, maxPrealloc))
	b := d.unread()
	off := 0
	for i := 0; i < n; i++ {
		v, neg, size := intAt(b[off:])
		if size == 0 || neg || v > math.MaxUint32 {
			// Let the general path say what is wrong.
			d.advance(off)
			_, err := d.uint(math.MaxUint32)
			return nil, fmt.Errorf("[%d]: %w", i, err)
		}
		ts = append(ts, uint32(v))
		off += size
	}
	d.advance(off)
	return ts, nil
}

// intAt decodes the msgpack integer at the start of b: its value as a uint64 (a
// negative one in two's complement), whether it is negative, and its size in bytes;
// size is 0 when b does not start with a complete integer. Lists of token ids and
// hashes are most of a payload, and reading them here rather than through the
// msgpack decoder's byte-at-a-time interface calls makes decoding several times
// faster.
func intAt(b []byte) (v uint64, neg bool, size int) {
	if len(b) == 0 {
		return 0, false, 0
	}
	c := b[0]
	switch {
	case c <= msgpcode.PosFixedNumHigh:
		return uint64(c), false, 1
	case c >= msgpcode.NegFixedNumLow:
		return uint64(int64(int8(c))), true, 1
	}
	switch c {
	case msgpcode.Uint8:
		if len(b) >= 2 {
			return uint64(b[1]), false, 2
		}
	case msgpcode.Uint16:
		if len(b) >= 3 {
			return uint64(binary.BigEndian.Uint16(b[1:])), false, 3
		}
	case msgpcode.Uint32:
		if len(b) >= 5 {
			return uint64(binary.BigEndian.Uint32(b[1:])), false, 5
		}
	case msgpcode.Uint64:
		if len(b) >= 9 {
			return binary.BigEndian.Uint64(b[1:]), false, 9
		}
	case msgpcode.Int8:
		if len(b) >= 2 {
			x := int64(int8(b[1]))
			return uint64(x), x < 0, 2
		}
	case msgpcode.Int16:
		if len(b) >= 3 {
			x := int64(int16(binary.BigEndian.Uint16(b[1:])))
			return uint64(x), x < 0, 3
		}
	case msgpcode.Int32:
		if len(b) >= 5 {
			x := int64(int32(binary.BigEndian.Uint32(b[1:])))
			return uint64(x), x < 0, 5
		}
	case msgpcode.Int64:
		if len(b) >= 9 {
			x := int64(binary.BigEndian.Uint64(b[1:]))
			return uint64(x), x < 0, 9
		}
	}
	return 0, false, 0
}

// unread is the part of the payload the msgpack decoder has not read yet (it reads
// d.r directly, without buffering).
func (d *Decoder) unread() []byte { return d.payload[len(d.payload)-d.r.Len():] }

// advance skips n bytes of unread() that were decoded here.
func (d *Decoder) advance(n int) {
	// bytes.Reader.Seek fails only for a negative position, which n >= 0 cannot make.
	_, _ = d.r.Seek(int64(n), io.SeekCurrent)
}

// peek returns the next msgpack code without consuming it.
func (d *Decoder) peek() (byte, error) {
	if d.r.Len() == 0 {
		return 0, io.ErrUnexpectedEOF
	}
	return d.unread()[0], nil
}

// uint reads a non-negative integer no larger than limit.
func (d *Decoder) uint(limit uint64) (uint64, error) {
	c, err := d.peek()
	if err != nil {
		return 0, err
	}
	if !isIntCode(c) {
		return 0, fmt.Errorf("msgpack code 0x%02x, want integer", c)
	}
	if c == msgpcode.Uint64 {
		v, err := d.dec.DecodeUint64()
		if err == nil && v > limit {
			err = fmt.Errorf("%d out of range [0, %d]", v, limit)
		}
		return v, err
	}
	v, err := d.dec.DecodeInt64()
	if err == nil && (v < 0 || uint64(v) > limit) {
		err = fmt.Errorf("%d out of range [0, %d]", v, limit)
	}
	return uint64(v), err
}

func (d *Decoder) optInt() (int64, bool, error) {
	c, err := d.peek()
	if err != nil {
		return 0, false, err
	}
	if c == msgpcode.Nil {
		return 0, false, d.skipNil()
	}
	if !isIntCode(c) {
		return 0, false, fmt.Errorf("msgpack code 0x%02x, want integer or nil", c)
	}
	if c == msgpcode.Uint64 {
		v, err := d.dec.DecodeUint64()
		if err == nil && v > math.MaxInt64 {
			err = fmt.Errorf("%d out of int64 range", v)
		}
		return int64(v), err == nil, err
	}
	v, err := d.dec.DecodeInt64()
	return v, err == nil, err
}

func (d *Decoder) optUint32(name string) (uint32, bool, error) {
	if d.nextIsNil() {
		return 0, false, d.skipNil()
	}
	v, err := d.uint(math.MaxUint32)
	if err != nil {
		return 0, false, fmt.Errorf("%s: %w", name, err)
	}
	return uint32(v), true, nil
}

func (d *Decoder) float(name string) (float64, error) {
	c, err := d.peek()
	if err != nil {
		return 0, err
	}
	if c != msgpcode.Float && c != msgpcode.Double && !isIntCode(c) {
		return 0, fmt.Errorf("%s is msgpack code 0x%02x, want a number", name, c)
	}
	return d.dec.DecodeFloat64()
}

func (d *Decoder) medium() (Medium, error) {
	if d.nextIsNil() {
		return MediumGPU, d.skipNil()
	}
	name, err := d.stringBytes("medium")
	if err != nil {
		return 0, err
	}
	for m, known := range mediumNameBytes {
		if bytes.EqualFold(name, known) {
			return Medium(m), nil
		}
	}
	if m, ok := mediumByFamily(name); ok {
		return m, nil
	}
	d.stats.UnknownMedia++
	if d.stats.FirstUnknownMedium == "" {
		d.stats.FirstUnknownMedium = string(name)
	}
	return MediumUnknown, nil
}

// mediumFamilies classify the media that connectors name beyond vLLM's six, by a
// case-insensitive substring: vLLM's short-lived "FS" and "OBJ" (storage), and
// LMCache's backend names, which LMCacheConnector forwards ("LocalCPUBackend",
// "LocalDiskBackend", "RemoteBackend", ...). The first family that matches wins.
var mediumFamilies = []struct {
	sub    []byte
	medium Medium
}{
	{[]byte("CPU"), MediumCPU},
	{[]byte("DISK"), MediumDisk},
	{[]byte("FS"), MediumStorage},
	{[]byte("OBJ"), MediumStorage},
	{[]byte("STORAGE"), MediumStorage},
	{[]byte("REMOTE"), MediumExternal},
	{[]byte("EXTERNAL"), MediumExternal},
}

// mediumByFamily maps a medium name outside the six by its family (mediumFamilies).
func mediumByFamily(name []byte) (Medium, bool) {
	var buf [64]byte
	if len(name) > len(buf) {
		return 0, false
	}
	up := buf[:len(name)]
	for i, c := range name {
		if 'a' <= c && c <= 'z' {
			c -= 'a' - 'A'
		}
		up[i] = c
	}
	for _, f := range mediumFamilies {
		if bytes.Contains(up, f.sub) {
			return f.medium, true
		}
	}
	return 0, false
}

var mediumNameBytes = func() [][]byte {
	bs := make([][]byte, len(mediumNames))
	for i, n := range mediumNames {
		bs[i] = []byte(n)
	}
	return bs
}()

func (d *Decoder) optString() (string, error) {
	if d.nextIsNil() {
		return "", d.skipNil()
	}
	b, err := d.stringBytes("value")
	return string(b), err
}

// stringBytes reads a msgpack str; the result aliases the payload.
func (d *Decoder) stringBytes(what string) ([]byte, error) {
	c, err := d.peek()
	if err != nil {
		return nil, err
	}
	if !msgpcode.IsString(c) {
		return nil, fmt.Errorf("%s is msgpack code 0x%02x, want a string", what, c)
	}
	return d.readBytes()
}

// key reads a map key; ok is false when it is not a string (it is then skipped).
func (d *Decoder) key() (key []byte, ok bool, err error) {
	c, err := d.peek()
	if err != nil {
		return nil, false, err
	}
	if !msgpcode.IsString(c) {
		return nil, false, d.skip(0)
	}
	key, err = d.readBytes()
	return key, err == nil, err
}

// readBytes reads a str or bin. The result aliases the payload: copy it to keep it.
// Its length is checked against what is left of the payload (msgpack's DecodeBytes
// would allocate the claimed length first).
func (d *Decoder) readBytes() ([]byte, error) {
	b := d.unread()
	var n, header int
	switch c := b[0]; {
	case msgpcode.IsFixedString(c):
		n, header = int(c&msgpcode.FixedStrMask), 1
	case (c == msgpcode.Str8 || c == msgpcode.Bin8) && len(b) >= 2:
		n, header = int(b[1]), 2
	case (c == msgpcode.Str16 || c == msgpcode.Bin16) && len(b) >= 3:
		n, header = int(binary.BigEndian.Uint16(b[1:])), 3
	case (c == msgpcode.Str32 || c == msgpcode.Bin32) && len(b) >= 5:
		n, header = int(binary.BigEndian.Uint32(b[1:])), 5
	default:
		return nil, fmt.Errorf("string header 0x%02x cut short: %w", c, io.ErrUnexpectedEOF)
	}
	if n > len(b)-header {
		return nil, fmt.Errorf("%d-byte string with %d bytes left: %w", n, len(b)-header, io.ErrUnexpectedEOF)
	}
	d.advance(header + n)
	return b[header : header+n : header+n], nil
}

// arrayLen reads an array header (-1 for nil) whose length fits in the payload:
// every element takes at least one byte, so a bogus length cannot make us allocate.
func (d *Decoder) arrayLen() (int, error) {
	c, err := d.peek()
	if err != nil {
		return 0, err
	}
	if c != msgpcode.Nil && !isArrayCode(c) {
		return 0, fmt.Errorf("msgpack code 0x%02x, want an array", c)
	}
	n, err := d.dec.DecodeArrayLen()
	if err != nil {
		return 0, err
	}
	if n > d.r.Len() {
		return 0, fmt.Errorf("array of %d with %d bytes left: %w", n, d.r.Len(), io.ErrUnexpectedEOF)
	}
	return n, nil
}

// mapLen is arrayLen for maps (two bytes at least per entry).
func (d *Decoder) mapLen() (int, error) {
	c, err := d.peek()
	if err != nil {
		return 0, err
	}
	if c != msgpcode.Nil && !isMapCode(c) {
		return 0, fmt.Errorf("msgpack code 0x%02x, want a map", c)
	}
	n, err := d.dec.DecodeMapLen()
	if err != nil {
		return 0, err
	}
	if n > d.r.Len()/2 {
		return 0, fmt.Errorf("map of %d with %d bytes left: %w", n, d.r.Len(), io.ErrUnexpectedEOF)
	}
	return n, nil
}

func (d *Decoder) nextIsNil() bool {
	c, err := d.peek()
	return err == nil && c == msgpcode.Nil
}

// skipNil consumes the nil that nextIsNil saw.
func (d *Decoder) skipNil() error {
	d.advance(1)
	return nil
}

func (d *Decoder) skipN(n int) error {
	for i := 0; i < n; i++ {
		if err := d.skip(0); err != nil {
			return err
		}
	}
	return nil
}

// skip skips one value of any type, following at most maxNesting levels of arrays
// and maps.
func (d *Decoder) skip(depth int) error {
	if depth > maxNesting {
		return fmt.Errorf("values nested deeper than %d", maxNesting)
	}
	c, err := d.peek()
	if err != nil {
		return err
	}
	var n int
	switch {
	case isArrayCode(c):
		n, err = d.arrayLen()
	case isMapCode(c):
		n, err = d.mapLen()
		n *= 2
	case msgpcode.IsString(c) || msgpcode.IsBin(c):
		_, err := d.readBytes()
		return err
	case msgpcode.IsExt(c):
		return d.skipExt(c)
	default:
		// Numbers, nil and booleans: fixed sizes.
		return d.dec.Skip()
	}
	if err != nil {
		return err
	}
	for i := 0; i < n; i++ {
		if err := d.skip(depth + 1); err != nil {
			return err
		}
	}
	return nil
}

// skipExt skips an extension value (msgspec does not write any, but a payload may
// hold one) after checking its length against the payload: msgpack's Skip would
// allocate up to 1 MiB to read a bogus one.
func (d *Decoder) skipExt(c byte) error {
	b := d.unread()
	var n, header int
	switch {
	case msgpcode.IsFixedExt(c):
		n, header = 1<<(c-msgpcode.FixExt1), 2
	case c == msgpcode.Ext8 && len(b) >= 3:
		n, header = int(b[1]), 3
	case c == msgpcode.Ext16 && len(b) >= 4:
		n, header = int(binary.BigEndian.Uint16(b[1:])), 4
	case c == msgpcode.Ext32 && len(b) >= 6:
		n, header = int(binary.BigEndian.Uint32(b[1:])), 6
	default:
		return fmt.Errorf("extension header 0x%02x cut short: %w", c, io.ErrUnexpectedEOF)
	}
	if n > len(b)-header {
		return fmt.Errorf("%d-byte extension with %d bytes left: %w", n, len(b)-header, io.ErrUnexpectedEOF)
	}
	d.advance(header + n)
	return nil
}

func (d *Decoder) unknownField(name func() string) {
	d.stats.UnknownFields++
	if d.stats.FirstUnknownField == "" {
		d.stats.FirstUnknownField = name()
	}
}

func (d *Decoder) unknownEvent(tag []byte) {
	d.stats.UnknownEvents++
	if d.stats.FirstUnknownEvent == "" {
		d.stats.FirstUnknownEvent = string(tag)
	}
}

func isArrayCode(c byte) bool {
	return msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32
}

func isMapCode(c byte) bool {
	return msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32
}

func isIntCode(c byte) bool {
	return msgpcode.IsFixedNum(c) || (c >= msgpcode.Uint8 && c <= msgpcode.Int64)
}
