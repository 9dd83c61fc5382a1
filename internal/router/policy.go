package router

import (
	"math"
	"math/rand/v2"
)

// Overlap is how many of a prompt's leading blocks a target caches, by tier, and
// where that figure came from.
type Overlap struct {
	GPU, CPU, Disk int
	Source         Source
}

// Blocks is the matched prefix on any tier.
func (o Overlap) Blocks() int { return o.GPU + o.CPU + o.Disk }

// Weighted is the overlap with lower tiers discounted: a CPU block costs a
// transfer, a disk block more (gpu + 0.75 cpu + 0.25 disk).
func (o Overlap) Weighted() float64 {
	return float64(o.GPU) + 0.75*float64(o.CPU) + 0.25*float64(o.Disk)
}

// Source says where an overlap figure (and so a decision) came from; the values
// are the source label of kvindex_router_decisions_total.
type Source string

const (
	SourceIndex       Source = "index"       // the indexer's answer
	SourcePredicted   Source = "predicted"   // recent decisions, before the engine's events arrived
	SourceApproximate Source = "approximate" // the router's own decisions while the indexer is down
	SourceLoadOnly    Source = "load-only"   // no overlap anywhere: load alone decided
	SourceDirect      Source = "direct"      // a header named the worker
	SourceSession     Source = "session"     // the session or cache-key ring
)

// EngineLoad is what the engine itself reports (--scrape-engine-metrics); zero
// when not scraped.
type EngineLoad struct {
	Waiting, Running int
	// KVUsage is vllm:kv_cache_usage_perc (the fraction of GPU KV blocks in use
	// by running requests; cached blocks nobody uses count as free) and GPUBlocks
	// the rank's capacity from vllm:cache_config_info's num_gpu_blocks label: both
	// are needed to turn the fraction into blocks (0 when the engine does not say).
	KVUsage   float64
	GPUBlocks int
}

// usedBlocks is how many GPU KV blocks the engine reports in use, or 0 when it
// does not report its capacity.
func (e EngineLoad) usedBlocks() int { return int(math.Ceil(e.KVUsage * float64(e.GPUBlocks))) }

// Candidate is one target a policy may pick, with everything policies score.
type Candidate struct {
	Worker  *Worker
	Rank    uint32
	Load    Load
	Engine  EngineLoad
	Overlap Overlap
	// SessionBound: the request's session last went to this worker.
	SessionBound bool
	// SharedActive and SharedPrefill count the request's prompt blocks already in
	// flight on the target, and those of them still being prefilled there: work
	// the request would share rather than add (siblings of a burst).
	SharedActive, SharedPrefill int
	// predicted is the prompt's leading blocks recent decisions (this router's or,
	// through the ledger, another's) sent to the target.
	predicted int

	// Filled by the policy that picks.
	Cost  float64
	Terms CostTerms
}

// Target is the candidate's worker and rank.
func (c *Candidate) Target() Target { return Target{Worker: c.Worker.ID, Rank: c.Rank} }

// inFlight is the candidate's request load: the router's own, or what the engine
// reports when that is larger (it also counts other routers' requests).
func (c *Candidate) inFlight() int { return max(c.Load.InFlight, c.Engine.Waiting+c.Engine.Running) }

// decodeBlocks is the candidate's KV blocks in use: the router's own count, or
// what the engine reports when that is larger (requests of other routers or sent
// around the router, and their real output lengths).
func (c *Candidate) decodeBlocks() int { return max(c.Load.DecodeBlocks, c.Engine.usedBlocks()) }

// RouteRequest is the part of a request policies look at.
type RouteRequest struct {
	Model     string // as requested (base model or LoRA adapter)
	BaseModel string
	LoRA      string
	CacheSalt string
	// PromptTokens and BlockSize give the prompt's length in blocks.
	PromptTokens int
	BlockSize    int
	OutputTokens int
	// Keys are the prompt's chained block keys (namespace mixed in), one per full block.
	Keys []uint64
	// LocalKeys are the per-block keys the indexer is asked with.
	LocalKeys []uint64
	// SessionKey and PrefixKey feed the session and prefix-hash policies; empty
	// when the request yields none.
	SessionKey, PrefixKey string
	KeySource             string
	// Direct names the worker (and prefill worker) from direct-mode headers.
	DirectWorker, DirectPrefill string
	// Rand is the source of the policies' random choices (ties, sampling); nil
	// means the process-wide one. The route bench's simulator sets a seeded one so
	// that a run repeats exactly. Not safe for concurrent use: one per request.
	Rand *rand.Rand

	// pool is the pool being picked from (ring policies hash over all of it).
	pool *poolRef
	// allow, when set, limits the workers the request may go to (the EPP's
	// subset hint).
	allow func(*Worker) bool
	// held, while the admission queue decides, reports the workers left to an
	// earlier request waiting in another queue (admission.go); nil otherwise.
	held func(*Worker) bool
	// dryRun: the pick is only shown (POST /debug/route); a policy with state
	// must leave it as it is, so that the dry run changes no later decision.
	dryRun bool
}

// eligible reports whether w is in the request's pools: it serves the requested
// model (base model or LoRA adapter) and the subset hint allows it.
func (r *RouteRequest) eligible(w *Worker) bool {
	if w.Model != r.BaseModel || r.allow != nil && !r.allow(w) {
		return false
	}
	_, ok := w.Serves(r.Model)
	return ok
}

// SetPool names the pool a pick draws from and lists all its targets, eligible or
// not: ring policies hash over the whole pool so that an excluded target's keys
// come back to it. version must change whenever the targets do.
func (r *RouteRequest) SetPool(name string, version uint64, targets []Target) {
	r.pool = &poolRef{name: name, version: version, targets: func() []Target { return targets }}
}

// PromptBlocks is the prompt's length in blocks (fractional: a partial last block
// still has to be prefilled).
func (r *RouteRequest) PromptBlocks() float64 {
	return float64(r.PromptTokens) / float64(r.BlockSize)
}

// intN is a random int in [0, n) from the request's source.
func (r *RouteRequest) intN(n int) int {
	if r.Rand != nil {
		return r.Rand.IntN(n)
	}
	return rand.IntN(n)
}

// float64 is a random float in [0, 1) from the request's source.
func (r *RouteRequest) float64() float64 {
	if r.Rand != nil {
		return r.Rand.Float64()
	}
	return rand.Float64()
}

// Policy picks one of the candidates. Pick is called with at least one candidate
// and may be called concurrently; it fills Cost/Terms of the candidates it scores
// and returns the index of its choice.
type Policy interface {
	Name() string
	Pick(req *RouteRequest, cands []Candidate) int
}

// argmin returns the index of the lowest cost, ties broken at random (reservoir
// sampling over the tied ones).
func argmin(req *RouteRequest, cands []Candidate, cost func(*Candidate) float64) int {
	best, ties := -1, 0
	bestCost := math.Inf(1)
	for i := range cands {
		c := cost(&cands[i])
		switch {
		case c < bestCost:
			best, bestCost, ties = i, c, 1
		case c == bestCost:
			ties++
			if req.intN(ties) == 0 {
				best = i
			}
		}
	}
	if best < 0 { // all NaN or +Inf
		return req.intN(len(cands))
	}
	return best
}

// softmin samples a candidate with probability proportional to
// exp(-(cost-min)/(temperature·(max-min))): costs are normalized by their spread so
// that the temperature means the same at any scale.
func softmin(req *RouteRequest, cands []Candidate, temperature float64) int {
	lo, hi := math.Inf(1), math.Inf(-1)
	for i := range cands {
		lo, hi = min(lo, cands[i].Cost), max(hi, cands[i].Cost)
	}
	spread := hi - lo
	if spread <= 0 || math.IsInf(spread, 0) || math.IsNaN(spread) {
		return req.intN(len(cands))
	}
	weights := make([]float64, len(cands))
	sum := 0.0
	for i := range cands {
		weights[i] = math.Exp(-(cands[i].Cost - lo) / (temperature * spread))
		sum += weights[i]
	}
	x := req.float64() * sum
	for i, w := range weights {
		if x < w {
			return i
		}
		x -= w
	}
	return len(cands) - 1
}
