package routebench

import (
	"fmt"
	"slices"
	"strings"

	"github.com/kvindex/kvindex/internal/router"
)

// Bench-only policy names; the others are router.Policies.
const (
	PolicyKVAwareNoOverlay = "kv-aware-no-overlay" // kv-aware with the indexer, predicted overlay off
	PolicyDynamoApprox     = "dynamo-approx"       // kv-aware without events: the router's own decisions only
	PolicySGLang           = "sglang-cache-aware"  // SGLang router's cache_aware policy
	PolicyLLMD             = "llm-d-weighted"      // llm-d: weighted prefix/queue/KV-utilization scorers, max-score picker
	PolicyOracle           = "oracle"              // least estimated TTFT from the engines' true caches and queues
)

// SGLang router cache_aware defaults (sglang router_args.py, current releases):
// route to the shortest queue when max−min load > 64 and max > 1.5·min, else to
// the best prefix match when it covers > 30 % of the prompt, else to the worker
// with the smallest approximate tree.
const (
	sglangCacheThreshold      = 0.3
	sglangBalanceAbsThreshold = 64
	sglangBalanceRelThreshold = 1.5
)

// llm-d inference scheduler default scorer weights (prefix-cache 3, queue 2,
// kv-cache-utilization 2) with the max-score picker.
const (
	llmdPrefixWeight = 3
	llmdQueueWeight  = 2
	llmdKVWeight     = 2
)

// policySpec says how a policy name is run.
type policySpec struct {
	name string
	// routerPolicy is the router policy whose Pick decides ("" for sglang and
	// llm-d, which pick themselves).
	routerPolicy string
	index        bool // consult the event-fed index
	predicted    bool // use the predicted overlay
	approximate  bool // no index: the approximate index of own decisions
	oracle       bool
	// liveArgs are the router flags that run this policy in live mode; nil when
	// live mode cannot run it (the router has no such policy).
	liveArgs []string
	// liveNoIndexer runs the live router without --indexer.
	liveNoIndexer bool
}

// AllPolicies lists every policy name in report order.
func AllPolicies() []string {
	return []string{router.PolicyRoundRobin, router.PolicyRandom, router.PolicyPowerOfTwo, router.PolicyLeastLoaded,
		router.PolicySession, router.PolicyPrefixHash, PolicySGLang, PolicyLLMD, PolicyDynamoApprox,
		PolicyKVAwareNoOverlay, router.PolicyKVAware, PolicyOracle}
}

// specFor returns the spec of a policy name.
func specFor(name string) (policySpec, error) {
	switch name {
	case router.PolicyKVAware:
		return policySpec{name: name, routerPolicy: name, index: true, predicted: true,
			liveArgs: []string{"--router-policy", name}}, nil
	case PolicyKVAwareNoOverlay:
		// The router cannot switch the overlay off; a 1 ns horizon is the same.
		return policySpec{name: name, routerPolicy: router.PolicyKVAware, index: true,
			liveArgs: []string{"--router-policy", router.PolicyKVAware, "--router-predicted-ttl", "1ns"}}, nil
	case PolicyDynamoApprox:
		return policySpec{name: name, routerPolicy: router.PolicyKVAware, predicted: true, approximate: true,
			liveArgs: []string{"--router-policy", router.PolicyKVAware}, liveNoIndexer: true}, nil
	case PolicySGLang:
		return policySpec{name: name}, nil
	case PolicyLLMD:
		return policySpec{name: name, index: true}, nil
	case PolicyOracle:
		return policySpec{name: name, oracle: true}, nil
	}
	if slices.Contains(router.Policies, name) {
		return policySpec{name: name, routerPolicy: name, liveArgs: []string{"--router-policy", name}}, nil
	}
	return policySpec{}, fmt.Errorf("%w: unknown policy %q (known: %s)", ErrInvalidConfig, name, strings.Join(AllPolicies(), ", "))
}

// sglangPick is SGLang's cache_aware decision over candidates whose Overlap holds
// the approximate tree's match (own decisions) and Load.InFlight the router's
// running requests; treeTokens is each candidate's approximate tree size.
func sglangPick(req *router.RouteRequest, cands []router.Candidate, treeTokens []int, tie func(int) int) int {
	minL, maxL := cands[0].Load.InFlight, cands[0].Load.InFlight
	for _, c := range cands {
		minL, maxL = min(minL, c.Load.InFlight), max(maxL, c.Load.InFlight)
	}
	if maxL-minL > sglangBalanceAbsThreshold && float64(maxL) > sglangBalanceRelThreshold*float64(minL) {
		return pickBest(cands, tie, func(c *router.Candidate, _ int) float64 { return -float64(c.Load.InFlight) })
	}
	best := 0
	for _, c := range cands {
		best = max(best, c.Overlap.Blocks())
	}
	if req.PromptTokens > 0 && float64(best*req.BlockSize)/float64(req.PromptTokens) > sglangCacheThreshold {
		return pickBest(cands, tie, func(c *router.Candidate, _ int) float64 { return float64(c.Overlap.Blocks()) })
	}
	return pickBest(cands, tie, func(_ *router.Candidate, i int) float64 { return -float64(treeTokens[i]) })
}

// llmdPick is llm-d's weighted sum of normalized scorers with the max-score
// picker: prefix = matched/prompt blocks, queue = (max−q)/(max−min) over the
// engines' waiting queues (1 when all equal), kv = 1 − KV-cache usage.
func llmdPick(req *router.RouteRequest, cands []router.Candidate, tie func(int) int) int {
	minQ, maxQ := cands[0].Engine.Waiting, cands[0].Engine.Waiting
	for _, c := range cands {
		minQ, maxQ = min(minQ, c.Engine.Waiting), max(maxQ, c.Engine.Waiting)
	}
	blocks := len(req.Keys)
	return pickBest(cands, tie, func(c *router.Candidate, _ int) float64 {
		prefix := 0.0
		if blocks > 0 {
			prefix = float64(c.Overlap.Blocks()) / float64(blocks)
		}
		queue := 1.0
		if maxQ > minQ {
			queue = float64(maxQ-c.Engine.Waiting) / float64(maxQ-minQ)
		}
		c.Cost = -(llmdPrefixWeight*prefix + llmdQueueWeight*queue + llmdKVWeight*(1-c.Engine.KVUsage))
		return -c.Cost
	})
}

// oraclePick takes the candidate with the least estimated TTFT (its Cost, filled
// from the engine's true state by the simulator), ties to fewer requests in
// flight, then at random.
func oraclePick(cands []router.Candidate, tie func(int) int) int {
	return pickBest(cands, tie, func(c *router.Candidate, _ int) float64 {
		return -(c.Cost + 1e-9*float64(c.Engine.Waiting+c.Engine.Running))
	})
}

// pickBest returns the index of the highest score, ties broken by tie(n) (a
// uniform draw in [0, n)).
func pickBest(cands []router.Candidate, tie func(int) int, score func(*router.Candidate, int) float64) int {
	best, ties := -1, 0
	var bestScore float64
	for i := range cands {
		s := score(&cands[i], i)
		switch {
		case best < 0 || s > bestScore:
			best, bestScore, ties = i, s, 1
		case s == bestScore:
			ties++
			if tie(ties) == 0 {
				best = i
			}
		}
	}
	return best
}
