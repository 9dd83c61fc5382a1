package router

// ringPolicy routes a request key (session or prefix) on a consistent-hash ring of
// every target of the request's pool; keys of an excluded target move to the next
// owner clockwise and come back when it returns. Requests without a key go to the
// least-loaded candidate.
type ringPolicy struct {
	name  string
	rings *ringCache
	// key picks the request's key for this policy.
	key func(*RouteRequest) string
}

func (p *ringPolicy) Name() string { return p.name }

func (p *ringPolicy) Pick(req *RouteRequest, cands []Candidate) int {
	key := p.key(req)
	if key == "" || req.pool == nil {
		return leastLoaded{}.Pick(req, cands)
	}
	r := p.rings.get(req.pool.name, req.pool.version, req.pool.targets)
	idx := make(map[Target]int, len(cands))
	for i := range cands {
		idx[cands[i].Target()] = i
	}
	t, ok := r.lookup(key, func(t Target) bool { _, ok := idx[t]; return ok })
	if !ok {
		return req.intN(len(cands))
	}
	return idx[t]
}
