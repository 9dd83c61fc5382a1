package fakeengine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"
)

// Errors returned by Engine methods; HTTP handlers map them to status codes.
var (
	// ErrBadRequest: the request cannot be served as given (400).
	ErrBadRequest = errors.New("bad request")
	// ErrModelNotFound: the request names a model this engine does not serve (404).
	ErrModelNotFound = errors.New("model not found")
	// ErrEngineRestarted: the request was aborted by a simulated engine restart.
	ErrEngineRestarted = errors.New("engine restarted")
	// ErrAborted: the caller closed the stream before the request finished.
	ErrAborted = errors.New("request aborted")
	// ErrEngineClosed: the engine is shutting down or not started.
	ErrEngineClosed = errors.New("engine closed")
	// ErrCacheInUse: the prefix cache cannot be reset while requests hold blocks
	// (vLLM refuses the same way).
	ErrCacheInUse = errors.New("prefix cache in use")
)

// Request is one generation request in token space.
type Request struct {
	Prompt []uint32
	// MaxTokens <= 0 means Config.DefaultMaxTokens.
	MaxTokens int
	// Model is the served model or one of its LoRA modules; "" is the base model.
	Model     string
	CacheSalt string
	// PinDPRank sends the request to DPRank (vLLM's X-data-parallel-rank header);
	// otherwise the least loaded rank takes it.
	PinDPRank bool
	DPRank    uint32
	// KVTransfer carries vLLM's kv_transfer_params (prefill/decode disaggregation).
	KVTransfer *KVTransferParams
}

// KVTransferParams are vLLM's kv_transfer_params as the NIXL connector uses them.
// A prefill engine given DoRemoteDecode answers with DoRemotePrefill set and the
// remote_* fields naming its blocks; a decode engine given that answer treats the
// prompt as transferred.
type KVTransferParams struct {
	DoRemoteDecode  bool    `json:"do_remote_decode"`
	DoRemotePrefill bool    `json:"do_remote_prefill"`
	RemoteEngineID  string  `json:"remote_engine_id,omitempty"`
	RemoteBlockIDs  []int32 `json:"remote_block_ids,omitempty"`
	RemoteHost      string  `json:"remote_host,omitempty"`
	RemotePort      int     `json:"remote_port,omitempty"`
	TPSize          int     `json:"tp_size,omitempty"`
}

// kvTransferParams decodes a request's raw kv_transfer_params (nil when absent).
func kvTransferParams(raw json.RawMessage) (*KVTransferParams, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var kv KVTransferParams
	if err := json.Unmarshal(raw, &kv); err != nil {
		return nil, fmt.Errorf("%w: kv_transfer_params: %v", ErrBadRequest, err)
	}
	return &kv, nil
}

// Result describes a finished request. Sim* durations are simulated engine time
// (independent of --time-scale): queueing plus the steps the request took part in.
type Result struct {
	PromptTokens int
	// CachedTokens is prompt_tokens_details.cached_tokens: prompt tokens served from
	// the prefix cache (GPU or CPU tier) or, on a decode engine, received from the
	// prefill engine.
	CachedTokens int
	Output       []uint32
	FinishReason string
	DPRank       uint32
	SimTTFT      time.Duration
	SimE2E       time.Duration
	KVTransfer   *KVTransferParams
}

type reqState uint8

const (
	stateWaiting reqState = iota
	statePrefill
	stateDecode
	stateDone
)

// request is the scheduler's view of one Request; its fields are owned by the
// rank's step loop, except aborted.
type request struct {
	in        Request
	loraName  string
	loraID    int
	maxTokens int
	tokens    []uint32 // prompt, then generated tokens
	promptLen int
	// hashes[i] is the engine hash of full block i of tokens.
	hashes       []uint64
	blocks       []blockID
	cachedBlocks int // leading blocks already given a hash (hit or cached here)
	computed     int // tokens whose KV is computed
	cachedTokens int
	reservedLeft int // blocks promised at admission but not yet allocated
	transferred  bool
	outputs      int
	outputStart  int
	state        reqState
	arrival      time.Duration
	firstToken   time.Duration
	aborted      atomic.Bool
	stream       *Stream
}

// Stream delivers a request's tokens as the engine produces them.
type Stream struct {
	req    *request
	rank   *rank
	notify chan struct{}

	mu      sync.Mutex
	pending []uint32
	done    bool
	result  Result
	err     error
}

func newStream(r *request, rk *rank) *Stream {
	s := &Stream{req: r, rank: rk, notify: make(chan struct{}, 1)}
	r.stream = s
	return s
}

func (s *Stream) push(tok uint32) {
	s.mu.Lock()
	s.pending = append(s.pending, tok)
	s.mu.Unlock()
	s.signal()
}

func (s *Stream) finish(res Result, err error) {
	s.mu.Lock()
	s.done, s.result, s.err = true, res, err
	s.mu.Unlock()
	s.signal()
}

func (s *Stream) signal() {
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

// Next returns the next generated token, io.EOF after the last one, or the error
// that ended the request. Cancelling ctx aborts nothing: call Close for that.
func (s *Stream) Next(ctx context.Context) (uint32, error) {
	for {
		s.mu.Lock()
		if len(s.pending) > 0 {
			tok := s.pending[0]
			s.pending = s.pending[1:]
			s.mu.Unlock()
			return tok, nil
		}
		done, err := s.done, s.err
		s.mu.Unlock()
		if done {
			if err != nil {
				return 0, err
			}
			return 0, io.EOF
		}
		select {
		case <-s.notify:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

// Result returns the outcome once Next has returned io.EOF; Output is left empty
// (the tokens went through Next).
func (s *Stream) Result() Result {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.result
}

// Close aborts the request if it is still running; its blocks are released at the
// engine's next step.
func (s *Stream) Close() {
	if s.req.aborted.CompareAndSwap(false, true) {
		s.rank.kick()
	}
}
