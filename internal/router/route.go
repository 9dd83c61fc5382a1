package router

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// Exclusion reasons (the reason label of kvindex_router_excluded_total).
const (
	ExcludeBreaker = "breaker"
	ExcludeBusy    = "busy"    // --max-active-prefill-tokens / --max-active-decode-blocks
	ExcludeFull    = "full"    // --max-pending
	ExcludeRetried = "retried" // already tried by this request
	ExcludeQueued  = "queued"  // left to an earlier request waiting in another admission queue
)

// errBusy: every eligible candidate is excluded by a busy threshold or the pending
// limit; the request may wait in the admission queue.
var errBusy = errors.New("every eligible worker is busy")

// ErrNoWorkers: no worker could take the request (503).
var ErrNoWorkers = errors.New("no worker available")

// pool is the set of targets a decision draws from.
type pool struct {
	name    string
	version uint64
	workers []*Worker
}

func (p *pool) targets() []Target {
	var ts []Target
	for _, w := range p.workers {
		for r := range w.Ranks {
			ts = append(ts, Target{Worker: w.ID, Rank: r})
		}
	}
	return ts
}

// poolRef lets ring policies see the whole pool, not only the eligible candidates.
type poolRef struct {
	name    string
	version uint64
	targets func() []Target
}

// Decision is where one request goes and why.
type Decision struct {
	Policy string
	Source Source
	Reason string
	// Target serves the request (the decode leg under disaggregation).
	Target Target
	// Prefill is the prefill leg's target; nil when not disaggregated (including
	// conditional local prefill).
	Prefill *Target
	// LocalPrefill: prefill and decode workers exist but the decode worker prefills
	// this prompt itself (--pd-min-uncached-tokens).
	LocalPrefill bool
	// Candidates are every scored candidate of the serving (or decode) pool, and
	// PrefillCandidates the prefill pool's; Excluded lists who was filtered out.
	Candidates        []Candidate
	PrefillCandidates []Candidate
	Excluded          []Exclusion
	// Available is the best overlap (blocks) any eligible candidate had; Captured is
	// the chosen (prefill) target's.
	Available, Captured int
	Overlap             Overlap

	// Held load, released by the request's owner.
	res, prefillRes *Reservation
	// probe: this decision holds Target's half-open breaker probe (taken under
	// pickMu with the pick, so concurrent decisions cannot all probe); dispatch
	// must Record its outcome with it. prefillProbe is the same for Prefill.
	probe, prefillProbe bool
}

// Exclusion is one candidate filtered out before scoring.
type Exclusion struct {
	Target Target `json:"target"`
	Reason string `json:"reason"`
}

// pools splits the model's workers into the aggregated pool, or the prefill and
// decode pools when both exist.
func (r *Router) pools(route *RouteRequest) (agg, prefill, decode *pool) {
	v := r.fleet.View()
	var both, pre, dec []*Worker
	for _, w := range v.workers {
		if !route.eligible(w) {
			continue
		}
		switch w.Role {
		case RolePrefill:
			pre = append(pre, w)
		case RoleDecode:
			dec = append(dec, w)
		default:
			both = append(both, w)
		}
	}
	key := route.Model + "\x00"
	if len(pre) > 0 && len(dec) > 0 {
		return nil, &pool{name: key + "prefill", version: v.version, workers: pre}, &pool{name: key + "decode", version: v.version, workers: dec}
	}
	if len(both) == 0 { // only one half of a PD fleet: let it serve whole requests
		both = append(pre, dec...)
	}
	return &pool{name: key + "both", version: v.version, workers: both}, nil, nil
}

// candidates lists the pool's targets with their load, filtered: exclusions are
// recorded with their reason. If only the breaker excluded anyone and nobody is
// left, the breaker-excluded ones come back (a probably-bad worker beats none). If
// busy thresholds, or workers held for earlier waiters (route.held), left nobody,
// errBusy.
func (r *Router) candidates(route *RouteRequest, p *pool, tried map[string]bool, excluded *[]Exclusion) ([]Candidate, error) {
	var broken []Candidate
	cands := make([]Candidate, 0, len(p.workers)) // one rank each, most often
	busy := false
	for _, w := range p.workers {
		for rank := range w.Ranks {
			t := Target{Worker: w.ID, Rank: rank}
			c := Candidate{Worker: w, Rank: rank, Load: r.loadOf(t), Engine: r.engineLoad(t)}
			reason := ""
			switch {
			case tried[w.ID]:
				reason = ExcludeRetried
			case !r.breakers.Allows(w.ID):
				reason = ExcludeBreaker
				broken = append(broken, c)
			default:
				reason = r.busyReason(c.Load)
				if reason == "" && route.held != nil && route.held(w) {
					reason = ExcludeQueued
				}
				busy = busy || reason != ""
			}
			if reason != "" {
				r.exclude(route, excluded, t, reason)
				continue
			}
			cands = append(cands, c)
		}
	}
	switch {
	case len(cands) > 0:
		return cands, nil
	case busy:
		return nil, errBusy
	case len(broken) > 0:
		return broken, nil
	}
	return nil, fmt.Errorf("%w for model %q (%d workers, all excluded)", ErrNoWorkers, p.name[:strings.IndexByte(p.name, 0)], len(p.workers))
}

// decide routes a prepared request once: pools, filters, overlaps, policy, and the
// reservations of the chosen targets (taken under pickMu together with the pick,
// so concurrent decisions see each other's load). tried lists workers this request
// already failed on.
func (r *Router) decide(ctx context.Context, p *prepared, tried map[string]bool, dryRun bool) (*Decision, error) {
	route := &p.route
	agg, prePool, decPool := r.pools(route)
	if agg != nil && len(agg.workers) == 0 {
		return nil, fmt.Errorf("%w: no worker serves the model `%s`", ErrUnknownModel, route.Model)
	}
	route.dryRun = dryRun
	d := &Decision{Policy: r.policy.Name()}
	if route.DirectWorker != "" {
		return r.decideDirect(p, d, tried, agg, prePool, decPool)
	}
	serve := agg
	if decPool != nil {
		serve = decPool
	}
	cands, err := r.candidates(route, serve, tried, &d.Excluded)
	if err != nil {
		return nil, err
	}
	var pre []Candidate
	if prePool != nil {
		if pre, err = r.candidates(route, prePool, tried, &d.Excluded); err != nil && !errors.Is(err, ErrNoWorkers) {
			return nil, err
		}
	}
	if p.endpoint != endpointOther && p.unkeyed == "" {
		r.askIndex(ctx, p, serve, prePool)
	}

	r.pickMu.Lock()
	defer r.pickMu.Unlock()
	if p.endpoint != endpointOther {
		r.overlaps(p, cands, pre)
	}
	r.markSession(route, cands)
	if cands, err = r.refreshLoads(route, cands, &d.Excluded); err != nil {
		return nil, err
	}
	route.pool = &poolRef{name: serve.name, version: serve.version, targets: serve.targets}
	i := r.policy.Pick(route, cands)
	d.Candidates, d.Target = cands, cands[i].Target()
	chosen := cands[i]
	if len(pre) > 0 {
		uncachedOnDecode := route.PromptTokens - chosen.Overlap.Blocks()*route.BlockSize
		if uncachedOnDecode < r.cfg.PDMinUncachedTokens {
			d.LocalPrefill = true
			d.Reason = fmt.Sprintf("decode worker prefills locally: %d uncached tokens < --pd-min-uncached-tokens", uncachedOnDecode)
		} else {
			if pre, err = r.refreshLoads(route, pre, &d.Excluded); err != nil {
				return nil, err
			}
			route.pool = &poolRef{name: prePool.name, version: prePool.version, targets: prePool.targets}
			j := r.policy.Pick(route, pre)
			t := pre[j].Target()
			d.Prefill, d.PrefillCandidates = &t, pre
			chosen = pre[j]
		}
	}
	d.Overlap = chosen.Overlap
	d.Captured = chosen.Overlap.Blocks()
	for _, list := range [][]Candidate{cands, d.PrefillCandidates} {
		for i := range list {
			d.Available = max(d.Available, list[i].Overlap.Blocks())
		}
	}
	d.Source = chosen.Overlap.Source
	if p.unkeyed != "" && d.Reason == "" {
		d.Reason = p.unkeyed
	}
	if (r.cfg.Policy == PolicySession && route.SessionKey != "") || (r.cfg.Policy == PolicyPrefixHash && route.PrefixKey != "") {
		d.Source = SourceSession // without a key, the least-loaded candidate was taken: the overlap's source stands
	}
	if !route.dryRun {
		r.reserve(d, route)
		r.beginProbes(d)
	}
	return d, nil
}

// beginProbes takes the half-open probes of the decision's targets (under pickMu).
func (r *Router) beginProbes(d *Decision) {
	d.probe = r.breakers.Begin(d.Target.Worker)
	if d.Prefill != nil {
		d.prefillProbe = r.breakers.Begin(d.Prefill.Worker)
	}
}

// exclude records that t was filtered out for reason, and counts it unless the
// decision is a dry run (which shows its exclusions but changes no metric).
func (r *Router) exclude(route *RouteRequest, excluded *[]Exclusion, t Target, reason string) {
	*excluded = append(*excluded, Exclusion{Target: t, Reason: reason})
	if !route.dryRun {
		r.metrics.excluded.WithLabelValues(reason).Inc()
	}
}

// busyReason says why a target with this load takes no more requests now
// (--max-pending, busy thresholds), or "".
func (r *Router) busyReason(l Load) string {
	switch {
	case r.cfg.MaxPending > 0 && l.InFlight >= r.cfg.MaxPending:
		return ExcludeFull
	case r.cfg.MaxActivePrefillTokens > 0 && l.PrefillTokens >= r.cfg.MaxActivePrefillTokens,
		r.cfg.MaxActiveDecodeBlocks > 0 && l.DecodeBlocks >= r.cfg.MaxActiveDecodeBlocks:
		return ExcludeBusy
	}
	return ""
}

// refreshLoads re-reads the load of every candidate and what the request shares
// with it, and drops those that became busy since they were listed, and those
// whose half-open probe another decision took meanwhile (unless no candidate is
// allowed by its breaker: the all-open fallback); called under pickMu so that the
// pick sees every reservation and probe taken before it. errBusy when none is left.
func (r *Router) refreshLoads(route *RouteRequest, cands []Candidate, excluded *[]Exclusion) ([]Candidate, error) {
	allowed := make([]bool, len(cands))
	anyAllowed := false
	for i := range cands {
		allowed[i] = r.breakers.Allows(cands[i].Worker.ID)
		anyAllowed = anyAllowed || allowed[i]
	}
	kept := cands[:0]
	for i, c := range cands {
		t := c.Target()
		if anyAllowed && !allowed[i] {
			r.exclude(route, excluded, t, ExcludeBreaker)
			continue
		}
		c.Load = r.loadOf(t)
		if reason := r.busyReason(c.Load); reason != "" {
			r.exclude(route, excluded, t, reason)
			continue
		}
		c.SharedActive, c.SharedPrefill = r.ledger.Shared(t, route.Keys)
		c.ShareRemote(r.shared.remoteLoad(t), c.predicted, func() int { return r.shared.sharedByOthers(route.Keys, t) }, route.BlockSize)
		kept = append(kept, c)
	}
	if len(kept) == 0 {
		return nil, errBusy
	}
	return kept, nil
}

// demand is what route asks of a target on which overlap blocks are cached.
func demand(route *RouteRequest, overlap int, prefill bool, output int) Demand {
	return Demand{Keys: route.Keys, Cached: overlap, BlockSize: route.BlockSize, PromptTokens: route.PromptTokens,
		OutputTokens: output, Prefill: prefill}
}

// reserve takes the decision's load: the serving target holds the request's
// blocks until the end and its uncached prefill (unless a prefill worker does it)
// until the first byte; the prefill target holds its prefill until its answer.
func (r *Router) reserve(d *Decision, route *RouteRequest) {
	d.res = r.ledger.Reserve(d.Target, demand(route, d.candidate(d.Target).Overlap.Blocks(), d.Prefill == nil, route.OutputTokens))
	if d.Prefill != nil {
		d.prefillRes = r.ledger.Reserve(*d.Prefill, demand(route, d.Overlap.Blocks(), true, 1))
	}
	now := r.now()
	if len(route.Keys) > 0 {
		r.recent.Record(route.Keys, d.Target, now)
		if d.Prefill != nil {
			r.recent.Record(route.Keys, *d.Prefill, now)
		}
	}
	if route.SessionKey != "" {
		r.sessions.set(route.SessionKey, d.Target.Worker, now)
	}
	r.shared.queue(route.Keys, d.Target, route.SessionKey, r.cfg.PredictedTTL, r.cfg.SessionTTL)
	if d.Prefill != nil {
		r.shared.queue(route.Keys, *d.Prefill, "", r.cfg.PredictedTTL, r.cfg.SessionTTL)
	}
}

// candidate returns the candidate for t (zero if absent).
func (d *Decision) candidate(t Target) Candidate {
	for _, list := range [][]Candidate{d.Candidates, d.PrefillCandidates} {
		for i := range list {
			if list[i].Worker.ID == t.Worker && list[i].Rank == t.Rank {
				return list[i]
			}
		}
	}
	return Candidate{}
}

// release returns every reservation of the decision (idempotent).
func (d *Decision) release() {
	if d.res != nil {
		d.res.Release()
	}
	if d.prefillRes != nil {
		d.prefillRes.Release()
	}
}

// markSession flags the candidates on the worker the request's session last went
// to (kv-aware's soft session bonus). Called under pickMu, like overlaps.
func (r *Router) markSession(route *RouteRequest, cands []Candidate) {
	if route.SessionKey == "" || r.cfg.Policy != PolicyKVAware {
		return
	}
	w, ok := r.sessions.get(route.SessionKey, r.now())
	if !ok {
		return
	}
	for i := range cands {
		cands[i].SessionBound = cands[i].Worker.ID == w
	}
}

// decideDirect dispatches to the workers the direct-mode headers name. Once the
// named worker failed this request (tried), there is nobody to retry on: the
// header's sender chose that worker, and sending it the request again would only
// repeat the failure.
func (r *Router) decideDirect(p *prepared, d *Decision, tried map[string]bool, pools ...*pool) (*Decision, error) {
	route := &p.route
	find := func(id string) (*Worker, error) {
		for _, pl := range pools {
			if pl == nil {
				continue
			}
			for _, w := range pl.workers {
				if w.ID == id {
					return w, nil
				}
			}
		}
		return nil, fmt.Errorf("%w: %q does not serve the model `%s`", ErrUnknownWorker, id, route.Model)
	}
	w, err := find(route.DirectWorker)
	if err != nil {
		return nil, err
	}
	if tried[w.ID] {
		return nil, fmt.Errorf("%w: %q, which the x-worker-instance-id header names, already failed this request", ErrNoWorkers, w.ID)
	}
	d.Source, d.Reason = SourceDirect, "x-worker-instance-id header"
	d.Target = r.leastLoadedRank(w)
	d.Candidates = []Candidate{{Worker: w, Rank: d.Target.Rank, Load: r.loadOf(d.Target)}}
	if route.DirectPrefill != "" {
		pw, err := find(route.DirectPrefill)
		if err != nil {
			return nil, err
		}
		t := r.leastLoadedRank(pw)
		d.Prefill = &t
		d.PrefillCandidates = []Candidate{{Worker: pw, Rank: t.Rank, Load: r.loadOf(t)}}
	}
	if !route.dryRun {
		r.pickMu.Lock()
		defer r.pickMu.Unlock()
		r.reserve(d, route)
		r.beginProbes(d)
	}
	return d, nil
}

// leastLoadedRank is w's dp rank with the fewest requests in flight.
func (r *Router) leastLoadedRank(w *Worker) Target {
	best := Target{Worker: w.ID}
	bestLoad := -1
	for rank := range w.Ranks {
		t := Target{Worker: w.ID, Rank: rank}
		if l := r.loadOf(t).InFlight; bestLoad < 0 || l < bestLoad {
			best, bestLoad = t, l
		}
	}
	return best
}

// pickPrefill chooses another prefill target after a failed prefill leg, and
// reserves its load and takes its half-open probe (if it is half-open).
func (r *Router) pickPrefill(ctx context.Context, p *prepared, tried map[string]bool) (Target, *Reservation, bool, error) {
	_, prePool, _ := r.pools(&p.route)
	if prePool == nil {
		return Target{}, nil, false, ErrNoWorkers
	}
	var excluded []Exclusion
	cands, err := r.candidates(&p.route, prePool, tried, &excluded)
	if err != nil {
		return Target{}, nil, false, err
	}
	r.askIndex(ctx, p, prePool)
	r.pickMu.Lock()
	defer r.pickMu.Unlock()
	r.overlaps(p, cands)
	if cands, err = r.refreshLoads(&p.route, cands, &excluded); err != nil {
		return Target{}, nil, false, err
	}
	p.route.pool = &poolRef{name: prePool.name, version: prePool.version, targets: prePool.targets}
	c := cands[r.policy.Pick(&p.route, cands)]
	t := c.Target()
	return t, r.ledger.Reserve(t, demand(&p.route, c.Overlap.Blocks(), true, 1)), r.breakers.Begin(t.Worker), nil
}
