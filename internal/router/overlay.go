package router

import (
	"sync"
	"time"
)

// overlay remembers, for a while, which targets were sent which prompt blocks:
// the predicted overlay (seconds: the engine has not published the blocks yet) and
// the approximate index (minutes: used while the indexer is down) are two of them.
// Keys are chained block keys mixed with the namespace, so a key stands for its
// whole prefix. It holds at most max marks; the oldest go first. Safe for
// concurrent use.
type overlay struct {
	ttl time.Duration
	max int

	mu   sync.Mutex
	m    map[uint64][]mark // guarded by mu
	fifo []fifoEntry       // ring buffer of marks in insertion order; guarded by mu
	head int               // oldest entry in fifo; guarded by mu
	n    int               // entries in fifo; guarded by mu
	// Targets are interned, so marks hold no pointers (nothing for the GC to scan
	// in a million entries). The table only grows, by the targets ever routed to.
	ids     map[Target]uint32 // guarded by mu
	targets []Target          // guarded by mu
}

type mark struct {
	t   uint32 // interned target
	exp int64  // unix nanoseconds
}

type fifoEntry struct {
	key uint64
	t   uint32
	exp int64
}

func (o *overlay) internLocked(t Target) uint32 {
	id, ok := o.ids[t]
	if !ok {
		id = uint32(len(o.targets))
		o.ids[t] = id
		o.targets = append(o.targets, t)
	}
	return id
}

func newOverlay(ttl time.Duration, max int) *overlay {
	return &overlay{ttl: ttl, max: max, m: map[uint64][]mark{}, fifo: make([]fifoEntry, min(max, 1024)), ids: map[Target]uint32{}}
}

// Record notes that t was sent the prefix keys, from now for the TTL.
func (o *overlay) Record(keys []uint64, t Target, now time.Time) {
	exp := now.Add(o.ttl).UnixNano()
	o.mu.Lock()
	defer o.mu.Unlock()
	id := o.internLocked(t)
	for _, k := range keys {
		marks := o.m[k]
		found := false
		for i := range marks {
			if marks[i].t == id {
				marks[i].exp, found = exp, true
				break
			}
		}
		if !found {
			o.m[k] = append(marks, mark{t: id, exp: exp})
		}
		o.pushLocked(fifoEntry{key: k, t: id, exp: exp})
	}
}

func (o *overlay) pushLocked(e fifoEntry) {
	if o.n == o.max {
		o.dropOldestLocked()
	}
	if o.n == len(o.fifo) { // grow the ring up to max
		grown := make([]fifoEntry, min(2*len(o.fifo), o.max))
		n := copy(grown, o.fifo[o.head:])
		copy(grown[n:], o.fifo[:o.head])
		o.fifo, o.head = grown, 0
	}
	o.fifo[(o.head+o.n)%len(o.fifo)] = e
	o.n++
}

// dropOldestLocked removes the oldest entry's mark unless a later Record renewed it.
func (o *overlay) dropOldestLocked() {
	e := o.fifo[o.head]
	o.head = (o.head + 1) % len(o.fifo)
	o.n--
	marks := o.m[e.key]
	for i := range marks {
		if marks[i].t == e.t && marks[i].exp == e.exp {
			marks[i] = marks[len(marks)-1]
			marks = marks[:len(marks)-1]
			break
		}
	}
	if len(marks) == 0 {
		delete(o.m, e.key)
	} else {
		o.m[e.key] = marks
	}
}

// expireLocked drops entries whose time is up, oldest first.
func (o *overlay) expireLocked(now int64) {
	for o.n > 0 && o.fifo[o.head].exp <= now {
		o.dropOldestLocked()
	}
}

// Match sets out[i] to how many leading keys targets[i] holds (unexpired).
func (o *overlay) Match(keys []uint64, targets []Target, now time.Time, out []int) {
	clear(out)
	ns := now.UnixNano()
	o.mu.Lock()
	defer o.mu.Unlock()
	o.expireLocked(ns)
	ids := make([]int64, len(targets)) // interned id per target, -1 when never routed to
	for i, t := range targets {
		ids[i] = -1
		if id, ok := o.ids[t]; ok {
			ids[i] = int64(id)
		}
	}
	for depth, k := range keys {
		marks := o.m[k]
		if len(marks) == 0 {
			return
		}
		advanced := 0
		for i, id := range ids {
			if out[i] != depth || id < 0 {
				continue // dropped out earlier, or never held anything
			}
			for _, m := range marks {
				if int64(m.t) == id && m.exp > ns {
					out[i]++
					advanced++
					break
				}
			}
		}
		if advanced == 0 {
			return
		}
	}
}

// Len returns the number of marks held (for tests and metrics).
func (o *overlay) Len() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.n
}
