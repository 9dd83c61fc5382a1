package router

import (
	"sync"
	"sync/atomic"
)

// roundRobin cycles through the candidates (ordered by worker and rank), with
// one counter per pool (model and role): a shared counter would let interleaved
// models, or the decode and prefill picks of one request, skip workers.
type roundRobin struct{ next sync.Map } // pool name -> *atomic.Uint64

func (*roundRobin) Name() string { return PolicyRoundRobin }

func (p *roundRobin) Pick(req *RouteRequest, cands []Candidate) int {
	pool := ""
	if req != nil && req.pool != nil {
		pool = req.pool.name
	}
	c, ok := p.next.Load(pool)
	if !ok {
		c, _ = p.next.LoadOrStore(pool, new(atomic.Uint64))
	}
	n := c.(*atomic.Uint64)
	if req != nil && req.dryRun { // show the next pick without taking it
		return int(n.Load() % uint64(len(cands)))
	}
	return int((n.Add(1) - 1) % uint64(len(cands)))
}

// random picks uniformly.
type random struct{}

func (random) Name() string { return PolicyRandom }

func (random) Pick(req *RouteRequest, cands []Candidate) int { return req.intN(len(cands)) }

// powerOfTwo samples two candidates and takes the one with fewer requests in flight.
type powerOfTwo struct{}

func (powerOfTwo) Name() string { return PolicyPowerOfTwo }

func (powerOfTwo) Pick(req *RouteRequest, cands []Candidate) int {
	if len(cands) == 1 {
		return 0
	}
	a := req.intN(len(cands))
	b := req.intN(len(cands) - 1)
	if b >= a {
		b++
	}
	la, lb := cands[a].inFlight(), cands[b].inFlight()
	cands[a].Cost, cands[b].Cost = float64(la), float64(lb)
	if lb < la {
		return b
	}
	return a
}

// leastLoaded takes the candidate with the fewest requests in flight, ties at
// random. The ledger's reservation is taken in the same critical section as the
// pick (route.go), so every request of a burst sees its predecessors' load
// before any of them has finished: the burst spreads (seeds/002's reservations).
type leastLoaded struct{}

func (leastLoaded) Name() string { return PolicyLeastLoaded }

func (leastLoaded) Pick(req *RouteRequest, cands []Candidate) int {
	for i := range cands {
		cands[i].Cost = float64(cands[i].inFlight())
	}
	return argmin(req, cands, func(c *Candidate) float64 { return c.Cost })
}
