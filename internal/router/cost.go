package router

import "math"

// CostTerms are the inputs and result of the kv-aware cost for one candidate,
// shown by /debug/route and the debug log so every decision can be explained.
type CostTerms struct {
	PromptBlocks        float64 `json:"prompt_blocks"`
	ActivePrefillBlocks float64 `json:"active_prefill_blocks"`
	ActiveDecodeBlocks  float64 `json:"active_decode_blocks"`
	OverlapWeighted     float64 `json:"overlap_weighted"`
	Credit              float64 `json:"credit"`
	SessionBonus        float64 `json:"session_bonus"`
	Load                int     `json:"load"`
}

// kvAware is the default policy. With the dynamo cost, per candidate:
//
//	cost = prefill_scale · max(active_prefill_blocks + prompt_blocks − credit·overlap, 0)
//	     + active_decode_blocks − session_bonus
//
// where overlap = gpu + 0.75·cpu + 0.25·disk cached prefix blocks (the larger of
// the indexer's and the predicted overlay's); active_prefill_blocks are the
// uncached prompt blocks in flight before their first byte, less those this
// request shares (plus, when engine metrics are scraped, num_requests_waiting ×
// prompt_blocks); active_decode_blocks are the candidate's distinct in-flight KV
// blocks (or, when scraped, the engine's kv_cache_usage_perc × num_gpu_blocks if
// that is more) with this request's added (its prompt blocks not already in flight there,
// its partial tail and expected output). Counting shared blocks once is what lets
// the siblings of a burst co-locate: on the worker already prefilling their prefix
// they add only their own tail, elsewhere the whole prompt. And
//
//	credit = 0.5 ^ ((active_prefill_blocks − least active_prefill_blocks among candidates) / credit_half_life)
//
// so a cache-rich candidate that is already busier than the least-loaded one
// gets less and less credit for its cache: the hot-spot guard acts per
// candidate, and a busy worker keeps its affinity for everyone else's prefixes.
// session_bonus = session_weight · prompt_blocks for the worker the request's
// session last went to (a soft preference, not a pin).
//
// The lmetric cost is the tuning-free product uncached_prefill_blocks·(load+1),
// load being the requests in flight.
type kvAware struct {
	cfg Config
}

func (p *kvAware) Name() string { return PolicyKVAware }

func (p *kvAware) Pick(req *RouteRequest, cands []Candidate) int {
	scoreKVAware(&p.cfg, req, cands)
	if p.cfg.Temperature > 0 {
		return softmin(req, cands, p.cfg.Temperature)
	}
	if p.cfg.Cost == CostLMetric {
		// Equal products (every candidate fully cached, say): the less loaded wins.
		return argmin(req, cands, func(c *Candidate) float64 { return c.Cost + float64(c.Terms.Load)*1e-9 })
	}
	return argmin(req, cands, func(c *Candidate) float64 { return c.Cost })
}

// scoreKVAware fills every candidate's Cost and Terms.
func scoreKVAware(cfg *Config, req *RouteRequest, cands []Candidate) {
	bs := float64(req.BlockSize)
	prompt := req.PromptBlocks()
	// This request's own decode blocks: prompt and expected output, rounded up.
	own := math.Ceil(float64(req.PromptTokens+req.OutputTokens) / bs)
	minPrefill := math.Inf(1)
	for i := range cands {
		c := &cands[i]
		c.Terms = CostTerms{
			PromptBlocks:        prompt,
			ActivePrefillBlocks: max(float64(c.Load.PrefillTokens)/bs-float64(c.SharedPrefill), 0) + float64(c.Engine.Waiting)*prompt,
			ActiveDecodeBlocks:  float64(c.decodeBlocks()) + own - float64(c.SharedActive),
			OverlapWeighted:     c.Overlap.Weighted(),
			Load:                c.inFlight(),
		}
		minPrefill = min(minPrefill, c.Terms.ActivePrefillBlocks)
	}
	for i := range cands {
		c := &cands[i]
		t := &c.Terms
		if cfg.Cost == CostLMetric {
			t.Credit = 1
			c.Cost = max(prompt-t.OverlapWeighted, 0) * float64(t.Load+1)
			continue
		}
		t.Credit = math.Exp2(-(t.ActivePrefillBlocks - minPrefill) / cfg.CreditHalfLife)
		if c.SessionBound {
			t.SessionBonus = cfg.SessionWeight * prompt
		}
		c.Cost = cfg.PrefillScale*max(t.ActivePrefillBlocks+prompt-t.Credit*t.OverlapWeighted, 0) +
			t.ActiveDecodeBlocks - t.SessionBonus
	}
}
