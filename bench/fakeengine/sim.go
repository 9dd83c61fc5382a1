package fakeengine

import (
	"fmt"
	"time"
)

// SimRank is one rank's KV cache and step scheduler — the same code an Engine's
// ranks run — driven by its caller on a virtual clock: no goroutine, socket,
// timer or sleep. The route bench's offline simulator runs thousands of them in
// one process. The caller owns the clock: Advance moves an idle rank's clock to
// an arrival, Submit queues a request (taken at the start of the next step, as a
// live rank takes its inbox), Step runs one scheduler step and returns how long it
// lasted in simulated time; the caller schedules the next Step at Now().
//
// Every step's KV events go to the sink given to NewSimRank, with the seq a live
// rank would publish them under, so an index fed from it sees exactly what ingest
// would see from the ZMQ stream.
//
// Concurrency: a SimRank is not safe for concurrent use; one goroutine drives it.
type SimRank struct {
	e    *Engine
	rk   *rank
	live []*SimRequest
}

// SimRequest is one request submitted to a SimRank.
type SimRequest struct {
	r          *request
	s          *Stream
	firstToken time.Duration
	sawFirst   bool
	done       bool
	result     Result
	err        error
}

// FirstToken returns the simulated time at which the request's first token was
// produced (the end of the step that produced it), once it was.
func (q *SimRequest) FirstToken() (time.Duration, bool) { return q.firstToken, q.sawFirst }

// Done returns the request's result once it has finished (err when it failed).
func (q *SimRequest) Done() (Result, error, bool) { return q.result, q.err, q.done }

// NewSimRank returns a rank with cfg's cache, scheduler and timing (TimeScale,
// sockets and fleet settings are ignored). sink, when not nil, receives every
// step's events. cfg.BlockHashSeed 0 means 1, so runs are reproducible.
func NewSimRank(cfg Config, idx uint32, sink func(seq int64, events []Event)) (*SimRank, error) {
	cfg.TimeScale = 0
	cfg.Fleet = 0
	cfg.KVEventsEndpoint, cfg.KVEventsReplayEndpoint = "", ""
	if cfg.BlockHashSeed == 0 {
		cfg.BlockHashSeed = 1
	}
	e, err := New(cfg, nil)
	if err != nil {
		return nil, err
	}
	rk := newRank(idx, &e.cfg, cfg.BlockHashSeed, "sim", e.log, e.m, nil, nil)
	rk.sink = sink
	e.ranks = []*rank{rk}
	return &SimRank{e: e, rk: rk}, nil
}

// Now is the rank's simulated clock.
func (s *SimRank) Now() time.Duration { return s.rk.simNow }

// Advance moves the clock of an idle rank forward to t (an arrival after an idle
// spell); a busy rank's clock moves only by its steps.
func (s *SimRank) Advance(t time.Duration) {
	if s.Idle() && t > s.rk.simNow {
		s.rk.simNow = t
	}
}

// Idle reports whether no request is queued or running.
func (s *SimRank) Idle() bool { return s.rk.idle() }

// Submit validates req as the engine would and queues it for the next step.
func (s *SimRank) Submit(req Request) (*SimRequest, error) {
	req.PinDPRank, req.DPRank = false, 0
	r, rk, err := s.e.prepare(req)
	if err != nil {
		return nil, err
	}
	q := &SimRequest{r: r, s: newStream(r, rk)}
	if !rk.submit(r) {
		return nil, ErrEngineClosed
	}
	s.live = append(s.live, q)
	return q, nil
}

// Step runs one scheduler step at Now() and returns its simulated duration (the
// clock has moved by it) and the requests that produced their first token or
// finished in it. ran is false when there was nothing to run.
func (s *SimRank) Step() (d time.Duration, progressed []*SimRequest, ran bool) {
	if s.Idle() {
		return 0, nil, false
	}
	before := s.rk.simNow
	s.rk.mu.Lock()
	s.rk.step()
	s.rk.mu.Unlock()
	d = s.rk.simNow - before
	keep := s.live[:0]
	for _, q := range s.live {
		changed := false
		if !q.sawFirst && q.r.outputs > 0 {
			q.sawFirst, q.firstToken, changed = true, s.rk.simNow, true
		}
		q.s.mu.Lock()
		q.s.pending = q.s.pending[:0] // tokens are not read: drop them
		done, res, err := q.s.done, q.s.result, q.s.err
		q.s.mu.Unlock()
		if done {
			q.done, q.result, q.err, changed = true, res, err, true
		}
		if changed {
			progressed = append(progressed, q)
		}
		if !done {
			keep = append(keep, q)
		}
	}
	clear(s.live[len(keep):])
	s.live = keep
	return d, progressed, true
}

// CachedPrefix returns how many of req's leading full prompt blocks the rank
// caches now, on the GPU and (after them) on the CPU tier: the truth an oracle
// routes on. It changes nothing.
func (s *SimRank) CachedPrefix(req Request) (gpu, cpu int) {
	r := &request{in: req, tokens: req.Prompt, promptLen: len(req.Prompt)}
	if req.Model != "" && req.Model != s.e.cfg.Model {
		r.loraName, r.loraID = req.Model, s.e.loras[req.Model]
	}
	for i := 0; i < len(req.Prompt)/s.e.cfg.BlockSize; i++ {
		h := s.rk.blockHash(r, i)
		if _, ok := s.rk.cache.gpuByHash[h]; ok {
			gpu++
			continue
		}
		if _, ok := s.rk.cache.cpuByHash[h]; ok {
			cpu++
			continue
		}
		break
	}
	return gpu, cpu
}

// PendingPrefillTokens is the prompt work queued on the rank now: the prompt
// tokens still to compute of running requests, plus the whole prompts, less
// their currently cached prefix, of requests not yet admitted. With
// Timing.PrefillPerToken it estimates how long a new request waits for prefill.
func (s *SimRank) PendingPrefillTokens() int {
	n := 0
	for _, r := range s.rk.running {
		if r.state == statePrefill {
			n += r.promptLen - r.computed
		}
	}
	bs := s.e.cfg.BlockSize
	for _, list := range [][]*request{s.rk.waiting, s.rk.inbox} {
		for _, r := range list {
			g, c := s.CachedPrefix(r.in)
			n += max(r.promptLen-(g+c)*bs, 1)
		}
	}
	return n
}

// Load is the rank's queue and KV usage, as its /metrics would report them.
func (s *SimRank) Load() (waiting, running int, kvUsage float64) {
	return len(s.rk.waiting) + len(s.rk.inbox), len(s.rk.running), s.rk.cache.usage()
}

// Blocks lists what the rank caches, as Engine.CacheTruth does.
func (s *SimRank) Blocks() []CachedBlock { return s.rk.cache.contents(s.rk.idx) }

// String names the rank for logs.
func (s *SimRank) String() string { return fmt.Sprintf("simrank %d at %v", s.rk.idx, s.rk.simNow) }
