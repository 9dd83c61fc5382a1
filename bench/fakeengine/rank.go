package fakeengine

import (
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// outputText is what every request "generates", starting at a prompt-dependent
// offset: plain ASCII, so each token decodes on its own.
const outputText = "the quick brown fox jumps over the lazy dog while a patient engine streams tokens one at a time. "

// rank is one data-parallel rank: a KV cache, a scheduler and an event stream. Its
// step loop holds mu for a whole step (simulated sleep included), so anything that
// reads or changes the cache under mu sees it between steps, consistent with the
// events enqueued so far.
type rank struct {
	idx   uint32
	label string
	cfg   *Config
	log   *slog.Logger
	m     *metrics
	pub   *publisher // nil when events are disabled
	// sink, when set (SimRank), receives each step's events instead of pub.
	sink   func(seq int64, events []Event)
	hasher blockHasher
	addr   string // the engine's HTTP host:port, named in kv_transfer_params
	stop   <-chan struct{}

	wake    chan struct{}
	inboxMu sync.Mutex
	inbox   []*request
	closed  bool // under inboxMu: no more submissions
	// active counts submitted requests not yet finished, for the least-loaded choice
	// and for the idle check of the step loop.
	active atomic.Int64

	mu       sync.Mutex
	cache    *kvCache
	waiting  []*request
	running  []*request
	reserved int
	simNow   time.Duration
	lastSeq  int64 // seq of the last batch enqueued; -1 before the first
}

func newRank(idx uint32, cfg *Config, seed uint64, addr string, log *slog.Logger, m *metrics, pub *publisher, stop <-chan struct{}) *rank {
	return &rank{
		idx:     idx,
		label:   strconv.Itoa(int(idx)),
		cfg:     cfg,
		log:     log.With("dp_rank", idx),
		m:       m,
		pub:     pub,
		hasher:  blockHasher{seed: seed},
		addr:    addr,
		stop:    stop,
		wake:    make(chan struct{}, 1),
		cache:   newKVCache(cfg.NumGPUBlocks, cfg.NumCPUBlocks, cfg.BlockSize),
		lastSeq: cfg.KVEventsFirstSeq - 1,
	}
}

func (rk *rank) kick() {
	select {
	case rk.wake <- struct{}{}:
	default:
	}
}

// submit queues r; false once the rank has shut down.
func (rk *rank) submit(r *request) bool {
	rk.inboxMu.Lock()
	if rk.closed {
		rk.inboxMu.Unlock()
		return false
	}
	rk.active.Add(1)
	rk.inbox = append(rk.inbox, r)
	rk.inboxMu.Unlock()
	rk.kick()
	return true
}

// loop runs steps while there is work, until stop is closed.
func (rk *rank) loop() {
	for {
		if rk.active.Load() == 0 {
			select {
			case <-rk.wake:
				continue
			case <-rk.stop:
				rk.shutdown()
				return
			}
		}
		select {
		case <-rk.stop:
			rk.shutdown()
			return
		default:
		}
		rk.mu.Lock()
		rk.step()
		rk.mu.Unlock()
	}
}

// stepWork is what one step computes.
type stepWork struct {
	prefill   []*request // requests that prefilled a chunk
	decode    []*request // requests that decoded one token
	transfer  []*request // decode-role requests whose prompt KV arrived this step
	prefillTk int
	cpuLoadTk int
	transTk   int
}

func (w *stepWork) duration(t Timing) time.Duration {
	return t.StepBase +
		time.Duration(w.prefillTk)*t.PrefillPerToken +
		time.Duration(len(w.decode)+len(w.transfer))*t.DecodePerSeq +
		time.Duration(w.cpuLoadTk)*t.CPULoadPerToken +
		time.Duration(w.transTk)*t.KVTransferPerToken
}

func (rk *rank) step() {
	rk.takeInbox()
	rk.dropAborted()
	var w stepWork
	rk.schedule(&w)
	if len(w.prefill)+len(w.decode)+len(w.transfer) == 0 {
		// Nothing could run: only possible when the head request can never fit,
		// which submit rules out; fail it rather than spin.
		if len(rk.waiting) > 0 && len(rk.running) == 0 {
			head := rk.waiting[0]
			rk.waiting = rk.waiting[1:]
			rk.end(head, fmt.Errorf("%w: request does not fit in the KV cache", ErrBadRequest))
		}
		rk.publishPending()
		rk.updateGauges() // aborted requests may have left
		return
	}
	d := w.duration(rk.cfg.Timing)
	if !rk.sleep(d) {
		return
	}
	rk.simNow += d
	finished := rk.complete(&w)
	// The step's batch is handed on before its finished requests are answered,
	// as vLLM's scheduler publishes a step's events before it returns the
	// step's outputs: whoever sees a request finish can Flush and find its
	// blocks announced.
	rk.publishPending()
	// The gauges too: a client that has its answer and scrapes /metrics must
	// not find its request still running (as in vLLM, whose scheduler counts a
	// request finished before its output goes back).
	rk.updateGauges()
	for _, r := range finished {
		rk.end(r, nil)
	}
}

// sleep waits d scaled by --time-scale; false when the engine is stopping.
func (rk *rank) sleep(d time.Duration) bool {
	wall := time.Duration(float64(d) * rk.cfg.TimeScale)
	if wall <= 0 {
		return true
	}
	t := time.NewTimer(wall)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-rk.stop:
		return false
	}
}

func (rk *rank) takeInbox() {
	rk.inboxMu.Lock()
	in := rk.inbox
	rk.inbox = nil
	rk.inboxMu.Unlock()
	for _, r := range in {
		r.arrival = rk.simNow
		rk.waiting = append(rk.waiting, r)
	}
}

func (rk *rank) dropAborted() {
	keep := rk.waiting[:0]
	for _, r := range rk.waiting {
		if r.aborted.Load() {
			rk.end(r, ErrAborted)
			continue
		}
		keep = append(keep, r)
	}
	clear(rk.waiting[len(keep):])
	rk.waiting = keep
	rk.retainRunning(func(r *request) bool {
		if r.aborted.Load() {
			rk.release(r)
			rk.end(r, ErrAborted)
			return false
		}
		return true
	})
}

func (rk *rank) retainRunning(keep func(*request) bool) {
	out := rk.running[:0]
	for _, r := range rk.running {
		if keep(r) {
			out = append(out, r)
		}
	}
	clear(rk.running[len(out):])
	rk.running = out
}

// schedule fills w as vLLM's scheduler does: running decodes first (one token
// each), then continuing prefill chunks, then new requests in FIFO order while the
// token budget and the running-batch limit allow.
func (rk *rank) schedule(w *stepWork) {
	budget := rk.cfg.MaxNumBatchedTokens
	for _, r := range rk.running {
		if r.state == stateDecode {
			rk.compute(r, len(r.tokens))
			w.decode = append(w.decode, r)
			budget--
		}
	}
	for _, r := range rk.running {
		if r.state == statePrefill && budget > 0 {
			budget -= rk.prefillChunk(r, budget, w)
		}
	}
	for len(rk.waiting) > 0 && len(rk.running) < rk.cfg.MaxNumSeqs && budget > 0 {
		r := rk.waiting[0]
		if !rk.admit(r, w) {
			break // FCFS: the head waits until blocks free up
		}
		rk.waiting = rk.waiting[1:]
		rk.running = append(rk.running, r)
		switch r.state {
		case statePrefill:
			budget -= rk.prefillChunk(r, budget, w)
		case stateDecode:
			w.transfer = append(w.transfer, r)
			budget--
		}
	}
}

func (rk *rank) prefillChunk(r *request, budget int, w *stepWork) int {
	chunk := min(r.promptLen-r.computed, budget)
	rk.compute(r, r.computed+chunk)
	w.prefill = append(w.prefill, r)
	w.prefillTk += chunk
	return chunk
}

// admit matches r's prompt against the cache and, if every block r will ever need
// can be promised, takes its hits and moves it to running.
func (rk *rank) admit(r *request, w *stepWork) bool {
	bs := rk.cfg.BlockSize
	// vLLM never serves the whole prompt from cache: the last token is recomputed
	// to produce logits.
	maxHit := (r.promptLen - 1) / bs
	type hit struct {
		id  blockID
		cpu *blockMeta
	}
	var hits []hit
	freeHits := 0
	for i := 0; i < maxHit; i++ {
		h := rk.blockHash(r, i)
		if id, ok := rk.cache.gpuByHash[h]; ok {
			hits = append(hits, hit{id: id})
			if rk.cache.blocks[id].ref == 0 {
				freeHits++
			}
			continue
		}
		if e, ok := rk.cache.cpuByHash[h]; ok {
			hits = append(hits, hit{id: noBlock, cpu: e.Value.(*blockMeta)})
			continue
		}
		break
	}
	total := blocksFor(r.promptLen+r.maxTokens-1, bs)
	gpuHits := 0
	for _, h := range hits {
		if h.cpu == nil {
			gpuHits++
		}
	}
	newBlocks := total - gpuHits
	if rk.cache.numFree-freeHits-rk.reserved < newBlocks {
		return false
	}
	for _, h := range hits {
		if h.cpu == nil {
			rk.cache.acquire(h.id)
			r.blocks = append(r.blocks, h.id)
			continue
		}
		r.blocks = append(r.blocks, rk.cache.loadFromCPU(*h.cpu))
		w.cpuLoadTk += bs
		newBlocks--
	}
	r.cachedBlocks = len(hits)
	r.computed = len(hits) * bs
	r.cachedTokens = r.computed
	r.reservedLeft = newBlocks
	rk.reserved += newBlocks
	rk.m.prefixQueries.WithLabelValues(rk.cfg.Model, rk.label).Add(float64(r.promptLen))
	rk.m.prefixHits.WithLabelValues(rk.cfg.Model, rk.label).Add(float64(r.cachedTokens))
	rk.m.promptTokens.WithLabelValues(rk.cfg.Model, rk.label).Add(float64(r.promptLen))
	if r.in.KVTransfer != nil && r.in.KVTransfer.DoRemotePrefill {
		w.transTk += r.promptLen - r.computed
		r.cachedTokens = r.promptLen
		rk.compute(r, r.promptLen)
		r.transferred = true
		r.state = stateDecode
		return true
	}
	r.state = statePrefill
	return true
}

// compute makes the KV of r's first upTo tokens resident: allocates blocks (from
// r's reservation) and caches every newly full block.
func (rk *rank) compute(r *request, upTo int) {
	bs := rk.cfg.BlockSize
	for len(r.blocks) < blocksFor(upTo, bs) {
		r.blocks = append(r.blocks, rk.cache.allocate())
		r.reservedLeft--
		rk.reserved--
	}
	for i := r.cachedBlocks; i < upTo/bs; i++ {
		rk.cache.cacheBlock(r.blocks[i], rk.blockMeta(r, i))
	}
	r.cachedBlocks = max(r.cachedBlocks, upTo/bs)
	r.computed = upTo
}

func blocksFor(tokens, bs int) int { return (tokens + bs - 1) / bs }

// blockHash returns the engine hash of r's full block i, computing the chain up to
// it on first use.
func (rk *rank) blockHash(r *request, i int) uint64 {
	bs := rk.cfg.BlockSize
	for len(r.hashes) <= i {
		j := len(r.hashes)
		var parent uint64
		if j > 0 {
			parent = r.hashes[j-1]
		}
		r.hashes = append(r.hashes, rk.hasher.hash(parent, j > 0, r.tokens[j*bs:(j+1)*bs], rk.extraKeys(r, j)))
	}
	return r.hashes[i]
}

// extraKeys are vLLM's per-block extra hash inputs: the LoRA name on every block,
// the cache salt on the first.
func (rk *rank) extraKeys(r *request, i int) []string {
	var keys []string
	if r.loraName != "" {
		keys = append(keys, r.loraName)
	}
	if i == 0 && r.in.CacheSalt != "" {
		keys = append(keys, r.in.CacheSalt)
	}
	return keys
}

func (rk *rank) blockMeta(r *request, i int) blockMeta {
	bs := rk.cfg.BlockSize
	m := blockMeta{
		hash:     rk.blockHash(r, i),
		tokens:   r.tokens[i*bs : (i+1)*bs : (i+1)*bs],
		extra:    rk.extraKeys(r, i),
		loraName: r.loraName,
		loraID:   r.loraID,
	}
	if i > 0 {
		m.parent, m.hasParent = r.hashes[i-1], true
	}
	return m
}

// complete applies the end of a step: first tokens of finished prefills and
// transfers, one token per decode, and finished requests leave the batch and
// free their blocks; it returns them, for step to answer.
func (rk *rank) complete(w *stepWork) (finished []*request) {
	for _, r := range w.prefill {
		if r.computed == r.promptLen {
			rk.emitToken(r)
		}
	}
	for _, r := range w.transfer {
		rk.emitToken(r)
	}
	for _, r := range w.decode {
		rk.emitToken(r)
	}
	rk.retainRunning(func(r *request) bool {
		if r.state != stateDone {
			return true
		}
		rk.release(r)
		finished = append(finished, r)
		return false
	})
	return finished
}

func (rk *rank) emitToken(r *request) {
	if r.outputs == 0 {
		r.firstToken = rk.simNow
		r.state = stateDecode
	}
	tok := uint32(outputText[(r.outputStart+r.outputs)%len(outputText)])
	r.tokens = append(r.tokens, tok)
	r.outputs++
	r.stream.push(tok)
	rk.m.genTokens.WithLabelValues(rk.cfg.Model, rk.label).Inc()
	if r.outputs >= r.maxTokens {
		r.state = stateDone
	}
}

func (rk *rank) release(r *request) {
	rk.cache.release(r.blocks)
	rk.reserved -= r.reservedLeft
	r.reservedLeft = 0
}

// end reports r's outcome to its stream.
func (rk *rank) end(r *request, err error) {
	r.state = stateDone
	rk.active.Add(-1)
	if err != nil {
		r.stream.finish(Result{}, err)
		return
	}
	res := Result{
		PromptTokens: r.promptLen,
		CachedTokens: r.cachedTokens,
		FinishReason: "length",
		DPRank:       rk.idx,
		SimTTFT:      r.firstToken - r.arrival,
		SimE2E:       rk.simNow - r.arrival,
	}
	if r.in.KVTransfer != nil && r.in.KVTransfer.DoRemoteDecode {
		ids := make([]int32, 0, len(r.blocks))
		for _, id := range r.blocks {
			ids = append(ids, int32(id))
		}
		host, port, _ := net.SplitHostPort(rk.addr)
		portNum, _ := strconv.Atoi(port)
		res.KVTransfer = &KVTransferParams{DoRemotePrefill: true, RemoteBlockIDs: ids,
			RemoteEngineID: "fakeengine@" + rk.addr, RemoteHost: host, RemotePort: portNum, TPSize: 1}
	}
	rk.m.ttft.WithLabelValues(rk.cfg.Model, rk.label).Observe(res.SimTTFT.Seconds())
	rk.m.e2e.WithLabelValues(rk.cfg.Model, rk.label).Observe(res.SimE2E.Seconds())
	rk.m.success.WithLabelValues(rk.cfg.Model, rk.label, res.FinishReason).Inc()
	r.stream.finish(res, nil)
}

// publishPending hands the events of this step to the publisher as one batch.
func (rk *rank) publishPending() {
	ev := rk.cache.takeEvents()
	if len(ev) == 0 {
		return
	}
	if rk.sink != nil { // a SimRank: the caller takes the batch
		rk.lastSeq++
		rk.sink(rk.lastSeq, ev)
		return
	}
	if rk.pub == nil {
		return
	}
	rk.lastSeq++
	rk.pub.enqueue(rk.lastSeq, Batch{TS: float64(time.Now().UnixNano()) / 1e9, Events: ev, DPRank: rk.idx})
}

func (rk *rank) updateGauges() {
	rk.m.running.WithLabelValues(rk.cfg.Model, rk.label).Set(float64(len(rk.running)))
	rk.m.waiting.WithLabelValues(rk.cfg.Model, rk.label).Set(float64(len(rk.waiting)))
	rk.m.kvUsage.WithLabelValues(rk.cfg.Model, rk.label).Set(rk.cache.usage())
}

func (rk *rank) shutdown() {
	rk.mu.Lock()
	defer rk.mu.Unlock()
	rk.inboxMu.Lock()
	rk.closed = true
	rk.inboxMu.Unlock()
	rk.abortAll(ErrEngineClosed)
}

// abortAll ends every request (engine stop or simulated restart); callers hold mu.
func (rk *rank) abortAll(err error) {
	rk.takeInbox()
	for _, r := range rk.running {
		rk.release(r)
		rk.end(r, err)
	}
	for _, r := range rk.waiting {
		rk.end(r, err)
	}
	rk.running, rk.waiting = nil, nil
}

// restart simulates an engine process restart: requests fail, the cache empties
// without any event, and the event stream starts again at seq 0.
func (rk *rank) restart() {
	rk.mu.Lock()
	defer rk.mu.Unlock()
	rk.abortAll(ErrEngineRestarted)
	rk.cache = newKVCache(rk.cfg.NumGPUBlocks, rk.cfg.NumCPUBlocks, rk.cfg.BlockSize)
	rk.reserved = 0
	rk.lastSeq = rk.cfg.KVEventsFirstSeq - 1
	if rk.pub != nil {
		rk.pub.enqueueReset()
	}
	rk.updateGauges()
}

// idle reports whether no request is queued or running; callers hold mu.
func (rk *rank) idle() bool {
	return rk.active.Load() == 0
}

// resetPrefixCache clears both tiers and announces AllBlocksCleared; callers hold mu
// and have checked idle.
func (rk *rank) resetPrefixCache() {
	rk.cache.clear()
	rk.cache.events = append(rk.cache.events, Event{Kind: AllBlocksCleared})
	rk.publishPending()
	rk.updateGauges()
}

// truth returns the cached blocks and the seq they are consistent with.
func (rk *rank) truth() RankTruth {
	rk.mu.Lock()
	defer rk.mu.Unlock()
	return RankTruth{DPRank: rk.idx, LastSeq: rk.lastSeq, Blocks: rk.cache.contents(rk.idx)}
}
