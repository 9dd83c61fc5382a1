package server

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	kvindexv1 "github.com/kvindex/kvindex/api/proto/kvindex/v1"
)

// fanout hands the changes the apply goroutine publishes to the Watch
// subscriptions, on a goroutine of its own, and keeps the last buffer batches
// of them so that a Watch can resume after the applied index it last saw.
//
// Concurrency: recording and publish are called by the apply goroutine only and
// never wait for a subscriber: publish appends to a queue that the fan-out
// goroutine drains. When that goroutine is max(buffer, minFanoutQueue) batches
// behind, the queue is dropped and every subscription ends with ErrWatchLagging
// (its client resumes).
// A subscriber that is buffer batches behind is ended alone, the same way.
// subscribe, closeAll, close, flush and the Subscription methods may be called
// from anywhere. Lock order: qmu, then mu; nothing blocks while holding either.
// The fan-out goroutine starts with the first subscription and ends with close.
type fanout struct {
	buffer int
	// active counts open subscriptions: while it is 0 the apply goroutine
	// computes no changes. It is raised under qmu (see recording).
	active atomic.Int32

	qmu sync.Mutex
	// unrecorded is the highest log index whose changes were not computed
	// because nobody watched; no subscription can start before it.
	unrecorded uint64      // guarded by qmu
	queue      []published // guarded by qmu: published, not yet delivered
	spare      []published // guarded by qmu: the drained queue, for reuse
	hist       []published // guarded by qmu: ring of the last buffer batches published
	histHead   int         // guarded by qmu: index in hist of the oldest batch
	forgotten  uint64      // guarded by qmu: highest index dropped from hist
	stopped    bool        // guarded by qmu
	started    bool        // guarded by qmu: run was started (by the first subscribe)
	wake       chan struct{}
	stop       chan struct{}
	done       chan struct{}

	mu   sync.Mutex
	subs map[*Subscription]struct{} // guarded by mu
}

// minFanoutQueue is the least number of batches the fan-out goroutine may fall
// behind the apply goroutine before every subscription is ended.
const minFanoutQueue = 1024

// published is one batch of changes of one log entry, or a flush marker.
type published struct {
	index   uint64
	changes []*kvindexv1.IndexChange
	flushed chan struct{}
}

func newFanout(buffer int) *fanout {
	return &fanout{
		buffer: buffer,
		wake:   make(chan struct{}, 1),
		stop:   make(chan struct{}),
		done:   make(chan struct{}),
		subs:   map[*Subscription]struct{}{},
	}
}

// recording reports whether the changes of the entry at index must be
// computed (somebody watches); when not, no subscription starts before index.
// While nobody watches it takes qmu, as subscribe does to raise active, so a
// subscription either gets the entry's changes or starts after it.
func (f *fanout) recording(index uint64) bool {
	if f.active.Load() > 0 {
		return true
	}
	f.qmu.Lock()
	defer f.qmu.Unlock()
	if f.active.Load() > 0 {
		return true
	}
	f.unrecorded = index
	return false
}

// publish queues the changes of the entry at index for the subscriptions and
// keeps them for resumes. It never blocks on a subscriber.
func (f *fanout) publish(changes []*kvindexv1.IndexChange, index uint64) {
	if len(changes) == 0 {
		return
	}
	for _, c := range changes {
		c.AppliedIndex = index
	}
	p := published{index: index, changes: changes}
	f.qmu.Lock()
	if f.stopped {
		f.qmu.Unlock()
		return
	}
	if len(f.hist) < f.buffer {
		f.hist = append(f.hist, p)
	} else {
		f.forgotten = f.hist[f.histHead].index
		f.hist[f.histHead] = p
		f.histHead = (f.histHead + 1) % f.buffer
	}
	behind := len(f.queue) >= max(f.buffer, minFanoutQueue)
	if behind {
		clear(f.queue)
		f.queue = f.queue[:0]
	}
	f.queue = append(f.queue, p)
	f.qmu.Unlock()
	if behind {
		f.closeAll(ErrWatchLagging)
	}
	f.signal()
}

func (f *fanout) signal() {
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

// run delivers queued batches until close.
func (f *fanout) run() {
	defer close(f.done)
	for {
		select {
		case <-f.stop:
			return
		case <-f.wake:
		}
		f.qmu.Lock()
		batch := f.queue
		f.queue, f.spare = f.spare[:0], nil
		f.qmu.Unlock()
		for _, p := range batch {
			if p.flushed != nil {
				close(p.flushed)
				continue
			}
			f.deliver(p)
		}
		clear(batch)
		f.qmu.Lock()
		f.spare = batch[:0]
		f.qmu.Unlock()
	}
}

func (f *fanout) deliver(p published) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for s := range f.subs {
		if p.index <= s.skipThrough {
			continue // the subscription got it from the history
		}
		mine := s.filter(p.changes)
		if len(mine) == 0 {
			continue
		}
		select {
		case s.c <- mine:
		default:
			// The subscriber is buffer batches behind: end it rather than
			// queue without bound or drop changes silently.
			s.endLocked(ErrWatchLagging)
		}
	}
}

// subscribe starts a subscription (see ChangeFeed.Subscribe).
func (f *fanout) subscribe(workers []string, model string, after uint64, resume bool) (*Subscription, error) {
	s := &Subscription{c: make(chan []*kvindexv1.IndexChange, f.buffer), model: model, fan: f}
	if len(workers) > 0 {
		s.workers = slices.Clone(workers)
		slices.Sort(s.workers)
	}
	f.qmu.Lock()
	defer f.qmu.Unlock()
	f.active.Add(1) // under qmu: see recording
	if f.stopped {
		f.active.Add(-1)
		return nil, fmt.Errorf("%w: the change feed is closed", ErrUnavailable)
	}
	if !f.started {
		f.started = true
		go f.run()
	}
	if resume {
		if from := max(f.unrecorded, f.forgotten); from > after {
			f.active.Add(-1)
			return nil, fmt.Errorf("%w: this member does not have every change after applied index %d (it has those after %d); start over with a Dump", ErrWatchResumeUnavailable, after, from)
		}
	}
	s.from = f.unrecorded
	for i := range f.hist {
		p := f.hist[(f.histHead+i)%len(f.hist)]
		s.skipThrough = p.index // queued or delivered already: never again
		s.from = max(s.from, p.index)
		if !resume || p.index <= after {
			continue
		}
		if mine := s.filter(p.changes); len(mine) > 0 {
			s.c <- mine // fits: the history holds at most cap(s.c) batches
		}
	}
	if resume {
		s.from = after
	}
	// Nothing at or before From is delivered: not a resumed change again (a
	// member that lags the one the client left applies those entries after
	// the resume), nor the part of an entry that was being applied when
	// recording started.
	s.skipThrough = max(s.skipThrough, s.from)
	f.mu.Lock()
	f.subs[s] = struct{}{}
	f.mu.Unlock()
	return s, nil
}

// closeAll ends every subscription with err.
func (f *fanout) closeAll(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for s := range f.subs {
		s.endLocked(err)
	}
}

// close ends every subscription with err and stops the fan-out goroutine.
func (f *fanout) close(err error) {
	f.qmu.Lock()
	already, started := f.stopped, f.started
	f.stopped = true
	f.qmu.Unlock()
	if !already {
		close(f.stop)
	}
	if started {
		<-f.done
	}
	f.closeAll(err)
}

// flush waits until every batch published before it has been delivered (or
// the fan-out is closed).
func (f *fanout) flush() {
	ch := make(chan struct{})
	f.qmu.Lock()
	if f.stopped || !f.started {
		f.qmu.Unlock()
		return
	}
	f.queue = append(f.queue, published{flushed: ch})
	f.qmu.Unlock()
	f.signal()
	select {
	case <-ch:
	case <-f.done:
	}
}

// Subscription is one Watch: batches of changes in applied order on C until it
// is closed, by Close or because it fell behind (Err is then ErrWatchLagging).
type Subscription struct {
	c       chan []*kvindexv1.IndexChange
	workers []string // sorted; nil for all
	model   string
	fan     *fanout
	// skipThrough: batches up to this index came from the history, were
	// published before the subscription started, or are at or before from;
	// set before it is added to fan.subs and read under fan.mu.
	skipThrough uint64
	// from: the subscription has every change applied after this index (see From).
	from   uint64
	closed bool // guarded by fan.mu
	err    atomic.Pointer[error]
}

// From is the applied index the subscription starts after: it delivers every
// change applied after it (and, when resuming, nothing at or before the resume
// index), so a client that loses the stream resumes after the last
// applied_index it received, or after From when it received none.
func (s *Subscription) From() uint64 { return s.from }

// C delivers batches of changes; it is closed when the subscription ends.
func (s *Subscription) C() <-chan []*kvindexv1.IndexChange { return s.c }

// Err is why the subscription ended: nil after Close, ErrWatchLagging when the
// subscriber fell behind.
func (s *Subscription) Err() error {
	if p := s.err.Load(); p != nil {
		return *p
	}
	return nil
}

// Close ends the subscription.
func (s *Subscription) Close() {
	s.fan.mu.Lock()
	defer s.fan.mu.Unlock()
	s.endLocked(nil)
}

// endLocked ends s; the caller holds fan.mu.
func (s *Subscription) endLocked(err error) {
	if s.closed {
		return
	}
	s.closed = true
	if err != nil {
		s.err.Store(&err)
	}
	delete(s.fan.subs, s)
	s.fan.active.Add(-1)
	close(s.c)
}

// filter returns the changes of a batch that s wants.
func (s *Subscription) filter(changes []*kvindexv1.IndexChange) []*kvindexv1.IndexChange {
	var mine []*kvindexv1.IndexChange
	for _, c := range changes {
		if s.workers != nil {
			if _, found := slices.BinarySearch(s.workers, c.Worker); !found {
				continue
			}
		}
		if s.model == "" || s.model == c.Model {
			mine = append(mine, c)
		}
	}
	return mine
}
