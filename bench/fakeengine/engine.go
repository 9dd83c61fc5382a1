package fakeengine

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	zmq "github.com/pebbe/zmq4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/zeebo/xxh3"

	"github.com/kvindex/kvindex/internal/tokenize"
)

// Engine is one simulated vLLM engine: an OpenAI-compatible HTTP server over one
// or more data-parallel ranks, each with its own KV cache, scheduler and ZMQ event
// stream. Methods are safe for concurrent use.
type Engine struct {
	cfg   Config
	log   *slog.Logger
	tok   tokenize.Tokenizer
	loras map[string]int // LoRA module name -> lora_id (1-based)
	m     *metrics

	faults  atomic.Pointer[Faults]
	failSeq atomic.Uint64
	pickSeq atomic.Uint32

	lifecycle sync.Mutex
	started   bool
	closed    bool
	stop      chan struct{}
	ranksDone sync.WaitGroup
	ln        net.Listener
	srv       *http.Server
	serveDone chan struct{}
	zctx      *zmq.Context
	pubs      []*publisher
	ranks     []*rank
	addr      string
	topic     string
}

// New checks cfg and prepares an engine; Start binds its sockets.
func New(cfg Config, log *slog.Logger) (*Engine, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Fleet > 1 {
		return nil, invalid("--fleet=%d: use NewFleet for more than one engine", cfg.Fleet)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var tok tokenize.Tokenizer = tokenize.NewBuiltin()
	for _, spec := range cfg.Tokenizers {
		t, err := tokenize.Load(spec, tokenize.Options{})
		if err != nil {
			return nil, fmt.Errorf("--tokenizer=%s: %w", spec, err)
		}
		tok = t
	}
	e := &Engine{cfg: cfg, log: log, tok: tok, loras: map[string]int{}, m: newMetrics(), stop: make(chan struct{})}
	for i, name := range cfg.LoRAModules {
		e.loras[name] = i + 1
	}
	f := cfg.Faults
	e.faults.Store(&f)
	return e, nil
}

// Start binds the HTTP listener and the ZMQ sockets and starts serving.
func (e *Engine) Start() (err error) {
	e.lifecycle.Lock()
	defer e.lifecycle.Unlock()
	if e.started {
		return errors.New("fakeengine: engine already started")
	}
	e.started = true
	e.ln, err = net.Listen("tcp", net.JoinHostPort(e.cfg.Host, strconv.Itoa(e.cfg.Port)))
	if err != nil {
		e.closed = true
		return fmt.Errorf("fakeengine: listen: %w", err)
	}
	e.addr = e.ln.Addr().String()
	e.topic = e.cfg.KVEventsTopic
	if e.topic == "" {
		e.topic = "kv@" + e.addr + "@" + e.cfg.Model
	}
	defer func() {
		if err != nil {
			e.closed = true // nothing to close later: the sockets go here
			e.ln.Close()
			for _, p := range e.pubs {
				p.closeSockets()
			}
			if e.zctx != nil {
				e.zctx.Term()
			}
		}
	}()
	seed := e.cfg.BlockHashSeed
	if seed == 0 {
		var b [8]byte
		if _, err := rand.Read(b[:]); err != nil {
			return fmt.Errorf("fakeengine: block hash seed: %w", err)
		}
		seed = binary.LittleEndian.Uint64(b[:]) | 1
	}
	if e.cfg.KVEventsEndpoint != "" {
		if e.zctx, err = zmq.NewContext(); err != nil {
			return fmt.Errorf("fakeengine: zmq context: %w", err)
		}
		for r := 0; r < e.cfg.DataParallelSize; r++ {
			p, err := newPublisher(e.zctx, &e.cfg, r, e.topic, e.Faults, e.m, e.log)
			if err != nil {
				return fmt.Errorf("fakeengine: rank %d: %w", r, err)
			}
			e.pubs = append(e.pubs, p)
		}
	}
	for r := 0; r < e.cfg.DataParallelSize; r++ {
		var p *publisher
		if e.pubs != nil {
			p = e.pubs[r]
		}
		rk := newRank(uint32(r), &e.cfg, seed, e.addr, e.log, e.m, p, e.stop)
		rk.updateGauges()
		e.m.cacheConfig.WithLabelValues(strconv.Itoa(e.cfg.BlockSize), strconv.Itoa(e.cfg.NumGPUBlocks), rk.label).Set(1)
		for _, c := range []*prometheus.CounterVec{e.m.prefixQueries, e.m.prefixHits, e.m.promptTokens, e.m.genTokens} {
			c.WithLabelValues(e.cfg.Model, rk.label).Add(0)
		}
		e.ranks = append(e.ranks, rk)
	}
	for _, p := range e.pubs {
		p.start()
	}
	for _, rk := range e.ranks {
		e.ranksDone.Add(1)
		go func() {
			defer e.ranksDone.Done()
			rk.loop()
		}()
	}
	e.srv = &http.Server{Handler: e.Handler(), ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(e.log.Handler(), slog.LevelWarn)}
	e.serveDone = make(chan struct{})
	go func() {
		defer close(e.serveDone)
		if err := e.srv.Serve(e.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			e.log.Error("http server stopped", "err", err)
		}
	}()
	e.log.Info("fake engine started", "model", e.cfg.Model, "http", e.addr, "topic", e.topic,
		"events", e.EventEndpoints(), "replay", e.ReplayEndpoints(), "dp", e.cfg.DataParallelSize, "role", e.cfg.Role)
	return nil
}

// Close stops the engine: running requests fail with ErrEngineClosed, queued event
// batches are sent, sockets close. It is safe to call more than once.
func (e *Engine) Close() error {
	e.lifecycle.Lock()
	defer e.lifecycle.Unlock()
	if !e.started || e.closed {
		e.closed = true
		return nil
	}
	e.closed = true
	close(e.stop)
	e.ranksDone.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err := e.srv.Shutdown(ctx)
	if err != nil {
		e.srv.Close()
	}
	<-e.serveDone
	for _, p := range e.pubs {
		p.stopPublishing()
	}
	if e.zctx != nil {
		if terr := e.zctx.Term(); terr != nil && err == nil {
			err = terr
		}
		for _, p := range e.pubs {
			<-p.replayDone
		}
	}
	return err
}

// Config returns the engine's configuration.
func (e *Engine) Config() Config { return e.cfg }

// Addr is the bound HTTP host:port (valid after Start).
func (e *Engine) Addr() string { return e.addr }

// URL is the engine's base URL, http://host:port.
func (e *Engine) URL() string { return "http://" + e.addr }

// Topic is the ZMQ topic of every rank's events.
func (e *Engine) Topic() string { return e.topic }

// EventEndpoints are the PUB endpoints actually bound or connected, by rank (nil
// when events are disabled). Bound wildcard addresses read tcp://0.0.0.0:port.
func (e *Engine) EventEndpoints() []string {
	var out []string
	for _, p := range e.pubs {
		out = append(out, p.pubEndpoint)
	}
	return out
}

// ReplayEndpoints are the bound ROUTER endpoints by rank (nil without replay).
func (e *Engine) ReplayEndpoints() []string {
	var out []string
	for _, p := range e.pubs {
		if p.replayEndpoint != "" {
			out = append(out, p.replayEndpoint)
		}
	}
	return out
}

// Tokenizer is the tokenizer the engine uses for text prompts.
func (e *Engine) Tokenizer() tokenize.Tokenizer { return e.tok }

// Faults returns the faults in force.
func (e *Engine) Faults() Faults { return *e.faults.Load() }

// SetFaults replaces the injected faults.
func (e *Engine) SetFaults(f Faults) error {
	if err := f.validate(); err != nil {
		return err
	}
	e.faults.Store(&f)
	e.log.Info("faults changed", "faults", fmt.Sprintf("%+v", f))
	return nil
}

// Submit queues a request and returns the stream of its tokens.
func (e *Engine) Submit(req Request) (*Stream, error) {
	r, rk, err := e.prepare(req)
	if err != nil {
		return nil, err
	}
	s := newStream(r, rk)
	if !rk.submit(r) {
		return nil, ErrEngineClosed
	}
	return s, nil
}

func (e *Engine) accepting() bool {
	select {
	case <-e.stop:
		return false
	default:
		return e.ranks != nil
	}
}

// Generate runs a request to completion; Result.Output holds the generated tokens.
// Cancelling ctx aborts the request.
func (e *Engine) Generate(ctx context.Context, req Request) (Result, error) {
	s, err := e.Submit(req)
	if err != nil {
		return Result{}, err
	}
	defer s.Close()
	var out []uint32
	for {
		tok, err := s.Next(ctx)
		if errors.Is(err, io.EOF) {
			res := s.Result()
			res.Output = out
			return res, nil
		}
		if err != nil {
			return Result{}, err
		}
		out = append(out, tok)
	}
}

func badRequest(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrBadRequest, fmt.Sprintf(format, args...))
}

// prepare validates req and picks its rank.
func (e *Engine) prepare(req Request) (*request, *rank, error) {
	r := &request{in: req, maxTokens: req.MaxTokens, promptLen: len(req.Prompt)}
	switch req.Model {
	case "", e.cfg.Model:
	default:
		id, ok := e.loras[req.Model]
		if !ok {
			return nil, nil, fmt.Errorf("%w: the model `%s` does not exist", ErrModelNotFound, req.Model)
		}
		r.loraName, r.loraID = req.Model, id
	}
	if len(req.Prompt) == 0 {
		return nil, nil, badRequest("the prompt must not be empty")
	}
	vocab := e.tok.VocabSize()
	for i, t := range req.Prompt {
		if int(t) >= vocab {
			return nil, nil, badRequest("token id %d at position %d is out of vocabulary (size %d)", t, i, vocab)
		}
	}
	if kv := req.KVTransfer; kv != nil {
		switch {
		case kv.DoRemoteDecode && kv.DoRemotePrefill:
			return nil, nil, badRequest("kv_transfer_params cannot set both do_remote_decode and do_remote_prefill")
		case kv.DoRemoteDecode && e.cfg.Role == RoleDecode:
			return nil, nil, badRequest("this engine has role decode and cannot prefill for a remote decode (do_remote_decode)")
		case kv.DoRemotePrefill && e.cfg.Role == RolePrefill:
			return nil, nil, badRequest("this engine has role prefill and cannot take a remote prefill (do_remote_prefill)")
		case kv.DoRemoteDecode:
			r.maxTokens = 1 // the prefill engine only produces the first token
		}
	}
	if r.maxTokens <= 0 {
		r.maxTokens = e.cfg.DefaultMaxTokens
	}
	if total := r.promptLen + r.maxTokens; total > e.cfg.MaxModelLen {
		return nil, nil, badRequest("This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the prompt, %d in the completion). Please reduce the length of the prompt or completion.",
			e.cfg.MaxModelLen, total, r.promptLen, r.maxTokens)
	}
	if need := blocksFor(r.promptLen+r.maxTokens-1, e.cfg.BlockSize); need > e.cfg.NumGPUBlocks {
		return nil, nil, badRequest("the request needs %d KV blocks but a rank has only %d", need, e.cfg.NumGPUBlocks)
	}
	r.tokens = make([]uint32, len(req.Prompt), len(req.Prompt)+r.maxTokens)
	copy(r.tokens, req.Prompt)
	promptBytes := make([]byte, 0, 4*len(req.Prompt))
	for _, t := range req.Prompt {
		promptBytes = binary.LittleEndian.AppendUint32(promptBytes, t)
	}
	r.outputStart = int(xxh3.Hash(promptBytes) % uint64(len(outputText)))
	if len(e.ranks) == 0 {
		return nil, nil, ErrEngineClosed
	}
	if req.PinDPRank {
		if int(req.DPRank) >= len(e.ranks) {
			return nil, nil, badRequest("data parallel rank %d does not exist (size %d)", req.DPRank, len(e.ranks))
		}
		return r, e.ranks[req.DPRank], nil
	}
	return r, e.leastLoaded(), nil
}

// leastLoaded picks the rank with the fewest active requests, rotating the start
// so that ties spread.
func (e *Engine) leastLoaded() *rank {
	n := len(e.ranks)
	start := int(e.pickSeq.Add(1)) % n
	best := e.ranks[start]
	for i := 1; i < n; i++ {
		rk := e.ranks[(start+i)%n]
		if rk.active.Load() < best.active.Load() {
			best = rk
		}
	}
	return best
}

// ResetPrefixCache empties every rank's cache and publishes AllBlocksCleared. Like
// vLLM it refuses (ErrCacheInUse) while any request is queued or running.
func (e *Engine) ResetPrefixCache() error {
	if !e.accepting() {
		return ErrEngineClosed
	}
	for _, rk := range e.ranks {
		rk.mu.Lock()
		defer rk.mu.Unlock()
	}
	for _, rk := range e.ranks {
		if !rk.idle() {
			return fmt.Errorf("%w: rank %d has requests in flight", ErrCacheInUse, rk.idx)
		}
	}
	for _, rk := range e.ranks {
		rk.resetPrefixCache()
	}
	return nil
}

// RestartEventStream simulates an engine restart on every rank: in-flight requests
// fail with ErrEngineRestarted, caches empty without any event, sequence numbers
// start again at 0 and the replay buffers are emptied.
func (e *Engine) RestartEventStream() error {
	if !e.accepting() {
		return ErrEngineClosed
	}
	for _, rk := range e.ranks {
		rk.restart()
	}
	e.m.faults.WithLabelValues("restart").Inc()
	e.log.Info("event stream restarted")
	return nil
}

// Flush waits until every event batch produced so far has been handed to ZMQ.
func (e *Engine) Flush(ctx context.Context) error {
	if !e.accepting() {
		return ErrEngineClosed
	}
	for _, p := range e.pubs {
		select {
		case <-p.flush():
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// CachedBlock is one block the engine really caches, for comparing an index with.
//
// In JSON, hashes are plain numbers up to 2^64-1: exact for Go and Python decoders,
// not for JavaScript's.
type CachedBlock struct {
	Hash uint64 `json:"hash"`
	// ParentHash is nil for a block at the start of a sequence.
	ParentHash *uint64  `json:"parent_hash"`
	TokenIDs   []uint32 `json:"token_ids"`
	// Tiers are the media holding the block: "GPU", "CPU" or both.
	Tiers    []string `json:"tiers"`
	DPRank   uint32   `json:"dp_rank"`
	LoRAName string   `json:"lora_name,omitempty"`
	// ExtraKeys are the block's extra hash inputs (LoRA name, cache salt).
	ExtraKeys []string `json:"extra_keys,omitempty"`
}

// RankTruth is one rank's cache contents after the batches up to LastSeq (-1: no
// batch yet) have been published.
type RankTruth struct {
	DPRank  uint32        `json:"dp_rank"`
	LastSeq int64         `json:"last_seq"`
	Blocks  []CachedBlock `json:"blocks"`
}

// Truth is the engine's true cache contents (GET /debug/kv-blocks).
type Truth struct {
	Model     string      `json:"model"`
	BlockSize int         `json:"block_size"`
	Topic     string      `json:"topic"`
	Ranks     []RankTruth `json:"ranks"`
}

// CacheTruth returns what every rank caches, each consistent with the event
// batches it has enqueued up to its LastSeq.
func (e *Engine) CacheTruth() Truth {
	t := Truth{Model: e.cfg.Model, BlockSize: e.cfg.BlockSize, Topic: e.topic}
	for _, rk := range e.ranks {
		t.Ranks = append(t.Ranks, rk.truth())
	}
	return t
}
