package router

import (
	"sync"
	"time"
)

// overlay remembers which targets were recently sent which prompt blocks, with
// two horizons read from one store: the predicted overlay (short: the engine has
// not published the blocks yet) and the approximate index (long: used while the
// indexer is down). Keys are chained block keys mixed with the namespace, so a
// key stands for its whole prefix. It holds at most max marks; the oldest go
// first. Safe for concurrent use.
type overlay struct {
	short, long time.Duration
	max         int

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
	t     uint32 // interned target
	short int64  // end of the short horizon, unix nanoseconds
	long  int64  // end of the long horizon
}

type fifoEntry struct {
	key  uint64
	t    uint32
	long int64
}

func newOverlay(short, long time.Duration, maxMarks int) *overlay {
	return &overlay{short: short, long: max(long, short), max: maxMarks, m: map[uint64][]mark{},
		fifo: make([]fifoEntry, min(maxMarks, 1024)), ids: map[Target]uint32{}}
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

// Record notes that t was sent the prefix keys now.
func (o *overlay) Record(keys []uint64, t Target, now time.Time) { o.RecordFor(keys, t, now, o.short) }

// RecordFor is Record with a short horizon of its own: another router's
// decision is predicted for as long as that router said (its
// --router-predicted-ttl, counted from its arrival here). The long horizon stays
// this overlay's; the short one never outlasts it.
func (o *overlay) RecordFor(keys []uint64, t Target, now time.Time, short time.Duration) {
	shortEnd, long := now.Add(min(short, o.long)).UnixNano(), now.Add(o.long).UnixNano()
	o.mu.Lock()
	defer o.mu.Unlock()
	id := o.internLocked(t)
	for _, k := range keys {
		marks := o.m[k]
		found := false
		for i := range marks {
			if marks[i].t == id {
				// A shorter prediction (another router's TTL) does not cut a
				// longer one short.
				marks[i].short, marks[i].long, found = max(marks[i].short, shortEnd), long, true
				break
			}
		}
		if !found {
			o.m[k] = append(marks, mark{t: id, short: shortEnd, long: long})
		}
		o.pushLocked(fifoEntry{key: k, t: id, long: long})
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
		if marks[i].t == e.t && marks[i].long == e.long {
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

// expireLocked drops entries whose long horizon is over, oldest first.
func (o *overlay) expireLocked(now int64) {
	for o.n > 0 && o.fifo[o.head].long <= now {
		o.dropOldestLocked()
	}
}

// Match sets short[i] and long[i] to how many leading keys targets[i] holds
// within the short and the long horizon (long may be nil when not wanted).
//
// Its cost is one interned-id lookup per target plus, per key, one lookup per
// target routed that key: in a large fleet few targets hold a prompt's blocks,
// so the walk down the prompt does not scale with the fleet.
func (o *overlay) Match(keys []uint64, targets []Target, now time.Time, short, long []int) {
	clear(short)
	clear(long)
	ns := now.UnixNano()
	o.mu.Lock()
	defer o.mu.Unlock()
	o.expireLocked(ns)
	if len(keys) == 0 || len(o.m[keys[0]]) == 0 {
		return
	}
	pos := make(map[uint32]int, len(targets)) // interned target → its index in targets
	for i, t := range targets {
		if id, ok := o.ids[t]; ok {
			pos[id] = i
		}
	}
	// A target still matches at depth d when its count is d; each key's marks
	// (one per target routed it) advance those that do.
	for depth, k := range keys {
		advanced := false
		for _, m := range o.m[k] {
			i, ok := pos[m.t]
			if !ok {
				continue
			}
			if short[i] == depth && m.short > ns {
				short[i]++
				advanced = true
			}
			if long != nil && long[i] == depth && m.long > ns {
				long[i]++
				advanced = true
			}
		}
		if !advanced {
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
