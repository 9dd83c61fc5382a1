package router

import (
	"cmp"
	"slices"
	"strconv"
	"sync"

	"github.com/zeebo/xxh3"
)

// ring is a consistent-hash ring with virtual nodes: each target owns vnodes
// points; a key goes to the first point at or after its hash. Adding or removing
// one of N targets moves only the keys of its points, about 1/N of all keys.
type ring struct {
	points []ringPoint // sorted by hash
}

type ringPoint struct {
	hash uint64
	t    Target
}

func newRing(targets []Target, vnodes int) *ring {
	r := &ring{points: make([]ringPoint, 0, len(targets)*vnodes)}
	for _, t := range targets {
		base := t.Worker + "#" + strconv.FormatUint(uint64(t.Rank), 10) + "#"
		for v := range vnodes {
			r.points = append(r.points, ringPoint{hash: xxh3.HashString(base + strconv.Itoa(v)), t: t})
		}
	}
	slices.SortFunc(r.points, func(a, b ringPoint) int { return cmp.Compare(a.hash, b.hash) })
	return r
}

// lookup returns the owner of key among the targets ok accepts: the first point
// clockwise from the key's hash whose target is acceptable, so an excluded target's
// keys go to their next owner while every other key stays put.
func (r *ring) lookup(key string, ok func(Target) bool) (Target, bool) {
	if len(r.points) == 0 {
		return Target{}, false
	}
	h := xxh3.HashString(key)
	start, _ := slices.BinarySearchFunc(r.points, h, func(p ringPoint, h uint64) int { return cmp.Compare(p.hash, h) })
	for i := range r.points {
		p := r.points[(start+i)%len(r.points)]
		if ok(p.t) {
			return p.t, true
		}
	}
	return Target{}, false
}

// ringCache keeps the ring of the last target set it was asked for per pool
// (model and role), rebuilt when the fleet changes.
type ringCache struct {
	vnodes int
	mu     sync.Mutex
	rings  map[string]cachedRing // guarded by mu
}

type cachedRing struct {
	version uint64
	r       *ring
}

func newRingCache(vnodes int) *ringCache {
	return &ringCache{vnodes: vnodes, rings: map[string]cachedRing{}}
}

// get returns the ring over targets for pool at fleet version v.
func (c *ringCache) get(pool string, v uint64, targets func() []Target) *ring {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cr, ok := c.rings[pool]; ok && cr.version == v {
		return cr.r
	}
	r := newRing(targets(), c.vnodes)
	c.rings[pool] = cachedRing{version: v, r: r}
	return r
}
