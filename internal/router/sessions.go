package router

import (
	"sync"
	"time"
)

// sessionMap remembers which worker each session last went to, for a TTL and
// within a bound on entries (expired entries go first, then arbitrary ones).
// Safe for concurrent use.
type sessionMap struct {
	ttl time.Duration
	max int

	mu sync.Mutex
	m  map[string]sessionEntry // guarded by mu
}

type sessionEntry struct {
	worker string
	exp    time.Time
}

func newSessionMap(ttl time.Duration, max int) *sessionMap {
	return &sessionMap{ttl: ttl, max: max, m: map[string]sessionEntry{}}
}

func (s *sessionMap) set(key, worker string, now time.Time) { s.setFor(key, worker, now, s.ttl) }

// setFor binds key for ttl rather than the map's TTL: another router's binding
// holds for as long as that router said.
func (s *sessionMap) setFor(key, worker string, now time.Time, ttl time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.m[key]; !ok && len(s.m) >= s.max {
		for k, e := range s.m {
			if !now.Before(e.exp) {
				delete(s.m, k)
			}
		}
		for k := range s.m {
			if len(s.m) < s.max {
				break
			}
			delete(s.m, k)
		}
	}
	s.m[key] = sessionEntry{worker: worker, exp: now.Add(ttl)}
}

func (s *sessionMap) get(key string, now time.Time) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.m[key]
	if !ok || !now.Before(e.exp) {
		return "", false
	}
	return e.worker, true
}
