package router

import (
	"context"
	"sync/atomic"
	"time"

	kvindexv1 "github.com/kvindex/kvindex/api/proto/kvindex/v1"
	kvindex "github.com/kvindex/kvindex/clients/go"
)

// indexSource asks the indexer how much of a prompt each worker caches. A query
// that fails or misses its deadline marks the indexer down for retryAfter, during
// which the router routes on its approximate index without waiting on the
// indexer; the first query after that window finds out whether it is back.
type indexSource struct {
	client     *kvindex.Client
	timeout    time.Duration
	retryAfter time.Duration
	now        func() time.Time

	downUntil atomic.Int64 // unix nanoseconds; 0 while up
	// onResult is a metrics hook: whether a query was answered, and how long it took.
	onResult func(ok bool, took time.Duration)
}

// up reports whether the indexer is believed to answer.
func (s *indexSource) up() bool {
	return s != nil && s.now().UnixNano() >= s.downUntil.Load()
}

// query returns per-target overlaps of the request's prompt on the given workers;
// ok is false when the indexer is down or did not answer in time.
func (s *indexSource) query(ctx context.Context, req *RouteRequest, workers []string) (map[Target]Overlap, bool) {
	if !s.up() {
		return nil, false
	}
	if len(req.LocalKeys) == 0 {
		return map[Target]Overlap{}, true // nothing to match: no full block
	}
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	start := s.now()
	resp, err := s.client.QueryByHash(ctx, &kvindexv1.QueryByHashRequest{
		Model: req.BaseModel, LoraName: req.LoRA, CacheSalt: req.CacheSalt,
		BlockHashes: req.LocalKeys, HashKind: kvindexv1.BlockHashKind_BLOCK_HASH_KIND_LOCAL,
		Workers: workers, MatchedOnly: true,
	})
	took := s.now().Sub(start)
	if s.onResult != nil {
		s.onResult(err == nil, took)
	}
	if err != nil {
		if parent.Err() != nil {
			return nil, false // our caller gave up; says nothing about the indexer
		}
		s.downUntil.Store(s.now().Add(s.retryAfter).UnixNano())
		return nil, false
	}
	s.downUntil.Store(0)
	out := make(map[Target]Overlap, len(resp.Scores))
	for _, ws := range resp.Scores {
		for _, r := range ws.DpRanks {
			if r.MatchedBlocks > 0 {
				out[Target{Worker: ws.Worker, Rank: r.DpRank}] = Overlap{
					GPU: int(r.GpuMatchedBlocks), CPU: int(r.CpuMatchedBlocks), Disk: int(r.DiskMatchedBlocks), Source: SourceIndex,
				}
			}
		}
	}
	return out, true
}

// askIndex asks the indexer, once per request, for the overlaps of every
// worker of the pools (nil ones skipped): all of them, not only the candidates
// of this attempt, so that a worker that was busy when the request came and
// is free when it retries from the admission queue has its overlap too. It is
// a network call: never under pickMu.
func (r *Router) askIndex(ctx context.Context, p *prepared, pools ...*pool) {
	if p.indexAsked || r.index == nil {
		return
	}
	p.indexAsked = true
	var workers []string
	seen := map[string]bool{}
	for _, pl := range pools {
		if pl == nil {
			continue
		}
		for _, w := range pl.workers {
			if !seen[w.ID] {
				seen[w.ID] = true
				workers = append(workers, w.ID)
			}
		}
	}
	p.indexed, p.indexOK = r.index.query(ctx, &p.route, workers)
}

// overlaps fills the Overlap of every candidate of the groups: the indexer's
// figure (askIndex; while it is down, the approximate index of the router's own
// decisions), raised to the predicted overlay's when that is longer, so siblings
// of a burst co-locate before the engine has published their blocks. It reads
// the router's own decisions, so it runs under pickMu with the pick: the
// decision a sibling made a moment before is already recorded (read before the
// lock, every sibling of a cold burst could find the overlay empty).
func (r *Router) overlaps(p *prepared, groups ...[]Candidate) {
	req := &p.route
	now := r.now()
	for _, cands := range groups {
		targets := make([]Target, len(cands))
		for i := range cands {
			targets[i] = cands[i].Target()
		}
		predicted := make([]int, len(cands))
		var approx []int
		if !p.indexOK {
			approx = make([]int, len(cands))
		}
		r.recent.Match(req.Keys, targets, now, predicted, approx)
		for i := range cands {
			a := 0
			if approx != nil {
				a = approx[i]
			}
			cands[i].Overlap = ChooseOverlap(p.indexed[targets[i]], p.indexOK, predicted[i], a)
			cands[i].predicted = predicted[i]
		}
	}
}
