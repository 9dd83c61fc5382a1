package routebench

import (
	"container/heap"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
	"time"

	"github.com/kvindex/kvindex/bench/fakeengine"
	"github.com/kvindex/kvindex/bench/traces"
	"github.com/kvindex/kvindex/internal/ingest"
	"github.com/kvindex/kvindex/internal/ingest/wire"
	"github.com/kvindex/kvindex/internal/kvblock"
	"github.com/kvindex/kvindex/internal/radix"
	"github.com/kvindex/kvindex/internal/router"
	"golang.org/x/sys/unix"
)

// simModel is the model name every simulated engine serves.
const simModel = "fake/llama-3.1-8b"

// engineConfig is worker w's engine model (live and offline alike): finite GPU
// blocks, a CPU tier on every other worker, the default Timing.
func engineConfig(c *Config, w int) fakeengine.Config {
	ec := fakeengine.DefaultConfig()
	ec.Model = simModel
	ec.BlockSize = c.BlockSize
	ec.NumGPUBlocks = c.GPUBlocks
	if w%2 == 1 {
		ec.NumCPUBlocks = c.CPUBlocks
	}
	ec.BlockHashSeed = 0x5eed + uint64(w)
	ec.MaxModelLen = 1 << 20
	return ec
}

func workerID(w int) string { return "engine-" + strconv.Itoa(w) }

// simEvent is one entry of the virtual clock's queue.
type simEvent struct {
	at   time.Duration
	seq  uint64 // FIFO among equal times
	kind int
	w    int // worker (stepDone, apply)
	i    int // request (arrival)
	step *stepOutcome
	b    *encodedBatch
}

const (
	evApply = iota // before arrivals at the same instant: an event that has arrived is visible
	evStepDone
	evPush // the shared ledger's push, before arrivals at the same instant, as evApply
	evArrival
)

type stepOutcome struct {
	progressed []*fakeengine.SimRequest
	batches    []*encodedBatch
}

type encodedBatch struct {
	seq     int64
	payload []byte
}

type eventQueue []*simEvent

func (q eventQueue) Len() int { return len(q) }
func (q eventQueue) Less(i, j int) bool {
	if q[i].at != q[j].at {
		return q[i].at < q[j].at
	}
	if q[i].kind != q[j].kind {
		return q[i].kind < q[j].kind
	}
	return q[i].seq < q[j].seq
}
func (q eventQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *eventQueue) Push(x any)   { *q = append(*q, x.(*simEvent)) }
func (q *eventQueue) Pop() any {
	old := *q
	x := old[len(old)-1]
	*q = old[:len(old)-1]
	return x
}

// submission is one request handed to a worker, for the conservation checks.
type submission struct {
	At  time.Duration
	Req fakeengine.Request
}

// simRequest is the simulator's record of one trace request.
type simRequest struct {
	worker    int
	res       *router.Reservation
	q         *fakeengine.SimRequest
	firstByte bool
	outcome
}

// simulator runs one (trace, policy) on a virtual clock. Not safe for concurrent
// use.
type simulator struct {
	cfg  *Config
	spec policySpec
	tr   traces.Trace

	clock time.Duration
	queue eventQueue
	seq   uint64
	rng   *rand.Rand

	ranks    []*fakeengine.SimRank
	stepping []bool
	busy     []time.Duration
	sinkBuf  [][]*encodedBatch

	index    *radix.Index
	applier  *ingest.Applier
	builders []*ingest.OpBuilder
	decoder  *wire.Decoder
	ns       uint64

	policy  router.Policy
	workers []*router.Worker
	targets []router.Target
	byID    map[string]int
	// routers are the simulated routers (--routers); request i enters through
	// routers[i%len(routers)], as live mode sends requests to its routers in turn.
	routers []*simRouter
	// shared: the routers share load, decisions and session bindings through
	// the indexer's ledger (--ledger with more than one router), pushed every
	// cfg.LedgerPush on the virtual clock.
	shared       bool
	predictedTTL time.Duration
	// timing is the engines' cost model (the oracle's TTFT estimate).
	timing fakeengine.Timing

	reqs  []simRequest
	byReq map[*fakeengine.SimRequest]int
	// Submissions per worker, in order (tests replay them).
	submissions [][]submission
	done        []int // times each request finished
	onProgress  func()
}

// epoch anchors the virtual clock for the router's time.Time APIs.
var epoch = time.Unix(1_700_000_000, 0)

func (s *simulator) now() time.Time { return epoch.Add(s.clock) }

func newSimulator(cfg *Config, spec policySpec, tr traces.Trace) (*simulator, error) {
	rcfg := router.DefaultConfig()
	rcfg.Policy = spec.routerPolicy
	if cfg.PrefillScale > 0 {
		rcfg.PrefillScale = cfg.PrefillScale
	}
	s := &simulator{cfg: cfg, spec: spec, tr: tr, rng: rand.New(rand.NewPCG(cfg.Seed, 0x726f757465)),
		index: radix.New(radix.Config{}), decoder: wire.NewDecoder(1 << 30),
		ns:   kvblock.Namespace{Model: simModel}.ID(),
		byID: map[string]int{}, byReq: map[*fakeengine.SimRequest]int{},
		reqs: make([]simRequest, len(tr.Requests)), done: make([]int, len(tr.Requests)),
		stepping: make([]bool, cfg.Workers), busy: make([]time.Duration, cfg.Workers),
		sinkBuf: make([][]*encodedBatch, cfg.Workers), submissions: make([][]submission, cfg.Workers),
		shared: cfg.Routers > 1 && cfg.Ledger && spec.routerPolicy != "", predictedTTL: rcfg.PredictedTTL,
	}
	s.applier = ingest.NewApplier(s.index)
	s.timing = engineConfig(cfg, 0).Timing
	if spec.routerPolicy != "" {
		s.policy = router.NewPolicy(rcfg)
	}
	approxTTL := rcfg.ApproxTTL
	if spec.name == PolicySGLang {
		approxTTL = 24 * time.Hour // SGLang's tree evicts by size (max_tree_size), never by age at these scales
	}
	for k := range max(cfg.Routers, 1) {
		s.routers = append(s.routers, newSimRouter(k, rcfg, approxTTL, cfg.Workers, s.now))
	}
	for w := range cfg.Workers {
		w := w
		rk, err := fakeengine.NewSimRank(engineConfig(cfg, w), 0, func(seq int64, ev []fakeengine.Event) {
			payload, err := fakeengine.EncodeBatch(fakeengine.Batch{TS: s.clock.Seconds(), Events: ev}, fakeengine.WireArray)
			if err != nil {
				panic(fmt.Sprintf("routebench: encode batch: %v", err)) // only on a programming error
			}
			s.sinkBuf[w] = append(s.sinkBuf[w], &encodedBatch{seq: seq, payload: payload})
		})
		if err != nil {
			return nil, err
		}
		s.ranks = append(s.ranks, rk)
		id := workerID(w)
		s.workers = append(s.workers, &router.Worker{ID: id, Model: simModel, Ranks: 1, BlockSize: cfg.BlockSize})
		s.targets = append(s.targets, router.Target{Worker: id})
		s.builders = append(s.builders, ingest.NewOpBuilder(simModel, cfg.BlockSize))
		s.byID[id] = w
	}
	return s, nil
}

func (s *simulator) push(e *simEvent) {
	s.seq++
	e.seq = s.seq
	heap.Push(&s.queue, e)
}

// threadCPUTime is the calling thread's CPU time (-1 if the clock is not there).
func threadCPUTime() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		return -1
	}
	return time.Duration(ts.Nano())
}

// run replays the trace to the end and returns the per-request outcomes.
func (s *simulator) run() ([]outcome, error) {
	// One OS thread for the whole run, so that the thread's CPU clock measures
	// the decisions (threadCPUTime).
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	for i := range s.tr.Requests {
		s.push(&simEvent{at: s.tr.Requests[i].Arrival, kind: evArrival, i: i})
	}
	if s.shared {
		s.push(&simEvent{at: s.cfg.LedgerPush, kind: evPush})
	}
	for s.queue.Len() > 0 {
		e := heap.Pop(&s.queue).(*simEvent)
		s.clock = e.at
		switch e.kind {
		case evArrival:
			if err := s.arrive(e.i); err != nil {
				return nil, err
			}
		case evStepDone:
			s.stepDone(e.w, e.step)
		case evApply:
			if err := s.apply(e.w, e.b); err != nil {
				return nil, err
			}
		case evPush:
			s.ledgerPush()
			if s.queue.Len() > 0 { // pushes tick while anything else is left to happen
				s.push(&simEvent{at: s.clock + s.cfg.LedgerPush, kind: evPush})
			}
		}
	}
	out := make([]outcome, len(s.reqs))
	for i := range s.reqs {
		out[i] = s.reqs[i].outcome
	}
	return out, nil
}

// arrive routes request i and hands it to its worker.
func (s *simulator) arrive(i int) error {
	tr := &s.tr.Requests[i]
	r := &s.reqs[i]
	rt := s.routers[i%len(s.routers)]
	r.arrival = tr.Arrival
	r.promptTokens = len(tr.Prompt)
	r.outputTokens = tr.OutputTokens

	local, keys := router.PromptKeys(tr.Prompt, s.cfg.BlockSize, simModel, "", "")
	route := &router.RouteRequest{Model: simModel, BaseModel: simModel, PromptTokens: len(tr.Prompt),
		BlockSize: s.cfg.BlockSize, OutputTokens: tr.OutputTokens, Keys: keys, LocalKeys: local,
		SessionKey: "s:" + tr.Session, PrefixKey: "s:" + tr.Session, Rand: s.rng}
	if tr.Prefix != "" {
		route.PrefixKey = "k:" + tr.Prefix
	}
	route.SetPool(simModel+"\x00both", 1, s.targets)
	engReq := fakeengine.Request{Prompt: tr.Prompt, MaxTokens: tr.OutputTokens}

	start, startCPU := time.Now(), threadCPUTime()
	cands := s.candidates(rt, route, engReq)
	var pick int
	switch {
	case s.spec.name == PolicySGLang:
		pick = sglangPick(route, cands, rt.treeTokens, s.rng.IntN)
	case s.spec.name == PolicyLLMD:
		pick = llmdPick(route, cands, s.rng.IntN)
	case s.spec.oracle:
		pick = oraclePick(cands, s.rng.IntN)
	default:
		pick = s.policy.Pick(route, cands)
	}
	w := s.byID[cands[pick].Worker.ID]
	overlap := cands[pick].Overlap.Blocks()
	r.res = rt.ledger.Reserve(s.targets[w], router.Demand{Keys: keys, Cached: min(overlap, len(keys)), BlockSize: s.cfg.BlockSize,
		PromptTokens: len(tr.Prompt), OutputTokens: tr.OutputTokens, Prefill: true})
	if s.spec.predicted || s.spec.approximate || s.spec.name == PolicySGLang {
		rt.recent.Record(keys, s.targets[w], s.now())
	}
	rt.sessions[route.SessionKey] = w
	if s.shared {
		rt.outbox = append(rt.outbox, simDecision{keys: keys, w: w, session: route.SessionKey})
	}
	if s.spec.name == PolicySGLang {
		rt.treeTokens[w] += max(len(tr.Prompt)-overlap*s.cfg.BlockSize, 0)
	}
	r.decision = time.Since(start)
	r.decisionCPU = -1
	if startCPU >= 0 {
		r.decisionCPU = threadCPUTime() - startCPU
	}

	if s.cfg.Workers <= s.cfg.TruthLimit {
		r.truthKnown = true
		for v, rk := range s.ranks {
			g, c := rk.CachedPrefix(engReq)
			r.available = max(r.available, g+c)
			if v == w {
				r.captured = g + c
			}
		}
	}
	r.worker = w
	r.workerID = workerID(w)
	rk := s.ranks[w]
	rk.Advance(s.clock)
	q, err := rk.Submit(engReq)
	if err != nil {
		r.failed = true
		r.res.Release()
		s.finish(i)
		return nil
	}
	r.q = q
	s.byReq[q] = i
	s.submissions[w] = append(s.submissions[w], submission{At: s.clock, Req: engReq})
	if !s.stepping[w] {
		s.startStep(w)
	}
	return nil
}

// candidates lists every worker with its load, shared blocks and overlap as the
// policy sees them through router rt.
func (s *simulator) candidates(rt *simRouter, route *router.RouteRequest, engReq fakeengine.Request) []router.Candidate {
	n := len(s.workers)
	var indexed []router.Overlap
	if s.spec.index {
		indexed = make([]router.Overlap, n)
		for _, m := range s.index.Match(s.ns, route.LocalKeys, nil, nil) {
			if w, ok := s.byID[m.Worker.Worker]; ok {
				indexed[w] = router.Overlap{GPU: m.PerTier[radix.TierGPU], CPU: m.PerTier[radix.TierCPU],
					Disk: m.PerTier[radix.TierCPU+1], Source: router.SourceIndex}
			}
		}
	}
	predicted := make([]int, n)
	var approx []int
	if s.spec.approximate || s.spec.name == PolicySGLang {
		approx = make([]int, n)
	}
	if s.spec.predicted || approx != nil {
		rt.recent.Match(route.Keys, s.targets, s.now(), predicted, approx)
	}
	if !s.spec.predicted {
		clear(predicted)
	}
	lastWorker, hasSession := rt.sessions[route.SessionKey]
	cands := make([]router.Candidate, n)
	for w := range n {
		c := &cands[w]
		c.Worker = s.workers[w]
		t := s.targets[w]
		c.Load = rt.ledger.Load(t)
		if c.Load.InFlight > 0 {
			c.SharedActive, c.SharedPrefill = rt.ledger.Shared(t, route.Keys)
		}
		if remote := rt.remote[t]; remote != (router.Load{}) {
			// The router's own load plus the others' as of the last push, and the
			// prefix shared with theirs, as the router's refreshLoads counts them.
			c.Load = router.AddLoad(c.Load, remote)
			c.ShareRemote(remote, predicted[w], func() int { return rt.others.Shared(route.Keys, t, s.now()) }, route.BlockSize)
		}
		c.SessionBound = hasSession && lastWorker == w && s.spec.routerPolicy == router.PolicyKVAware
		switch {
		case s.spec.oracle:
			// The engine's own timing model on its true state: the prefill queued
			// ahead, this prompt's uncached part, CPU-tier loads, and the decode
			// batch the first step shares.
			rk := s.ranks[w]
			g, cpu := rk.CachedPrefix(engReq)
			c.Overlap = router.Overlap{GPU: g, CPU: cpu, Source: router.SourceIndex}
			tm := s.timing
			uncached := max(len(engReq.Prompt)-(g+cpu)*s.cfg.BlockSize, 1)
			_, running, _ := rk.Load()
			c.Cost = float64(time.Duration(rk.PendingPrefillTokens()+uncached)*tm.PrefillPerToken +
				time.Duration(cpu*s.cfg.BlockSize)*tm.CPULoadPerToken + time.Duration(running)*tm.DecodePerSeq)
		case s.spec.name == PolicySGLang:
			c.Overlap = router.Overlap{GPU: approx[w], Source: router.SourceApproximate}
		default:
			var ix router.Overlap
			if indexed != nil {
				ix = indexed[w]
			}
			a := 0
			if approx != nil {
				a = approx[w]
			}
			c.Overlap = router.ChooseOverlap(ix, s.spec.index, predicted[w], a)
		}
		if s.spec.oracle || s.spec.name == PolicyLLMD {
			waiting, running, usage := s.ranks[w].Load()
			c.Engine = router.EngineLoad{Waiting: waiting, Running: running, KVUsage: usage}
		}
	}
	return cands
}

// startStep runs worker w's next step now and schedules its end.
func (s *simulator) startStep(w int) {
	d, progressed, ran := s.ranks[w].Step()
	if !ran {
		s.stepping[w] = false
		return
	}
	s.stepping[w] = true
	s.busy[w] += d
	out := &stepOutcome{progressed: progressed, batches: s.sinkBuf[w]}
	s.sinkBuf[w] = nil
	s.push(&simEvent{at: s.clock + d, kind: evStepDone, w: w, step: out})
}

// stepDone delivers a step's outcome at its end: events go (after the delay) to
// the index, first tokens release prefill load, finished requests release the rest.
func (s *simulator) stepDone(w int, out *stepOutcome) {
	for _, b := range out.batches {
		if s.cfg.EventDelay == 0 {
			if err := s.apply(w, b); err != nil {
				panic(err) // the engine produced a batch ingest refuses: a bug to see at once
			}
			continue
		}
		s.push(&simEvent{at: s.clock + s.cfg.EventDelay, kind: evApply, w: w, b: b})
	}
	for _, q := range out.progressed {
		i := s.requestOf(q)
		r := &s.reqs[i]
		if ft, ok := q.FirstToken(); ok && !r.firstByte {
			r.firstByte = true
			r.ttft = ft - r.arrival
			r.res.FirstByte()
		}
		if res, err, done := q.Done(); done {
			r.res.Release()
			r.e2e = s.clock - r.arrival
			r.cachedTokens = res.CachedTokens
			r.failed = err != nil
			s.finish(i)
		}
	}
	s.startStep(w)
}

// requestOf finds the trace request of a worker's SimRequest.
func (s *simulator) requestOf(q *fakeengine.SimRequest) int {
	i, ok := s.byReq[q]
	if !ok {
		panic("routebench: a step reported a request nobody submitted")
	}
	return i
}

func (s *simulator) finish(i int) {
	s.done[i]++
	if s.onProgress != nil {
		s.onProgress()
	}
}

// apply feeds one engine batch to the index as ingest would: the wire payload
// decoded, turned into Ops with the worker's block size, applied once per seq.
func (s *simulator) apply(w int, b *encodedBatch) error {
	eb, _, err := s.decoder.Decode(b.payload)
	if err != nil {
		return fmt.Errorf("routebench: decode %s batch %d: %w", workerID(w), b.seq, err)
	}
	ops := s.builders[w].Build(eb.Events)
	res := s.applier.Apply(ingest.StreamBatch{Stream: ingest.Stream{Worker: workerID(w)}, Seq: uint64(b.seq), Ops: ops})
	if res.FirstErr != nil {
		return fmt.Errorf("routebench: apply %s batch %d: %w", workerID(w), b.seq, res.FirstErr)
	}
	return nil
}

// simRouter is one simulated router's own state: its reservations, its recent
// decisions (predicted overlay, approximate index), its session bindings, and
// with the shared ledger what the last push brought of the other routers.
type simRouter struct {
	id       string
	ledger   *router.Ledger
	recent   *router.RecentDecisions
	sessions map[string]int // each session's last worker (kv-aware's session bonus)
	// treeTokens is SGLang's approximate tree size per worker (one tree per router).
	treeTokens []int

	// remote is the other routers' load per target as of the last push; nil
	// without the shared ledger or before the first push.
	remote map[router.Target]router.Load
	// others holds the other routers' decisions per deciding router (counted
	// by ShareRemote).
	others *router.OtherRouters
	// outbox is the decisions and bindings made since the last push.
	outbox []simDecision
}

// simDecision is one decision reported to the ledger: the prompt's keys sent to
// worker w, and the session bound to it.
type simDecision struct {
	keys    []uint64
	w       int
	session string
}

func newSimRouter(k int, rcfg router.Config, approxTTL time.Duration, workers int, now func() time.Time) *simRouter {
	return &simRouter{id: "routebench-" + strconv.Itoa(k), ledger: router.NewLedger(rcfg.ReservationTTL, now),
		recent:   router.NewRecentDecisions(rcfg.PredictedTTL, approxTTL, rcfg.OverlayMaxBlocks),
		sessions: map[string]int{}, treeTokens: make([]int, workers),
		others: router.NewOtherRouters(rcfg.ApproxTTL, rcfg.OverlayMaxBlocks)}
}

// ledgerPush is one push of the indexer's ledger to every router at once: each
// router's load as of now (the ledger's per-router report), summed over the
// other routers, becomes that router's remote view; the decisions and session
// bindings each router made since the last push reach the others, with the
// deciding router's predicted TTL, as the router's ledger client applies them.
// The router's report interval is not modelled: a push sees the loads of its
// own instant, so the simulated view is fresher than the real one by up to
// one report interval (--ledger-interval, 10 ms by default).
func (s *simulator) ledgerPush() {
	loads := make([]map[router.Target]router.Load, len(s.routers))
	for k, rt := range s.routers {
		loads[k] = rt.ledger.Loads()
	}
	now := s.now()
	for j, rt := range s.routers {
		remote := map[router.Target]router.Load{}
		for k, other := range s.routers {
			if k == j {
				continue
			}
			for t, l := range loads[k] {
				remote[t] = router.AddLoad(remote[t], l)
			}
			for _, d := range other.outbox {
				t := s.targets[d.w]
				rt.recent.Record(d.keys, t, now) // for --router-predicted-ttl, the same in every simulated router
				rt.others.Record(other.id, d.keys, t, now, s.predictedTTL)
				if d.session != "" {
					rt.sessions[d.session] = d.w
				}
			}
		}
		rt.remote = remote
	}
	for _, rt := range s.routers {
		rt.outbox = nil
	}
}
