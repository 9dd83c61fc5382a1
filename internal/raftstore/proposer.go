package raftstore

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"time"

	"github.com/hashicorp/raft"

	"github.com/kvindex/kvindex/internal/ingest"
)

// ErrSessionEnded: the leadership session a Submit belonged to ended (leadership
// lost, a proposal failed, shutdown). It comes wrapped in a NotLeaderError.
var ErrSessionEnded = errors.New("raftstore: leader session ended")

// A session is one uninterrupted stretch of leadership during which this node
// proposes stream batches: it opens after a Barrier (so the FSM, and the cursors
// ingest resumes from, hold everything committed before) and ends at the first
// sign the stretch is over: leadership lost, the term changed, or any proposal
// failed. Batches are proposed in Submit order, so what commits of a session is
// always a prefix of what was submitted; the batches after that prefix are not
// retried here. Ending the session instead cancels the leader context, and the
// producers (ingest) start again from the replicated cursors in the next session,
// on this node or another, re-reading the rest from the engines' replay buffers.
// That is why nothing is lost, and the cursors are why nothing is applied twice.
//
// Inside a session: Submit encodes each batch into the entry being filled (under
// mu); the flusher takes the entry when it is full or MaxBatchWait old and a
// proposal slot is free, and calls raft.Apply without waiting; the waiter collects
// the futures in order and frees their slots. MaxInFlight slots bound the pipeline,
// and a full entry with no free slot makes Submit wait: back-pressure.
type session struct {
	n    *Node
	term uint64
	ctx  context.Context // cancelled when the session ends; carries the session
	end  context.CancelCauseFunc

	mu       sync.Mutex
	enc      batchEncoder  // guarded by mu
	firstAt  time.Time     // when enc got its first batch; guarded by mu
	space    chan struct{} // closed when enc is taken; guarded by mu
	force    bool          // propose enc without waiting (Flush); guarded by mu
	sealed   uint64        // entries taken from enc and proposed; guarded by mu
	applied  uint64        // of those, entries applied here; guarded by mu
	progress chan struct{} // closed and replaced when applied grows; guarded by mu

	kick     chan struct{} // wakes the flusher: enc got its first batch or became full
	slots    chan struct{} // one token per proposal in flight
	inflight chan proposal
	flushed  chan struct{} // closed when the flusher has returned
	waited   chan struct{} // closed when the waiter has returned

	fnMu     sync.Mutex
	fnClosed bool           // guarded by fnMu: no more RunWhileLeader functions may join
	fns      sync.WaitGroup // RunWhileLeader functions running in this session
}

type proposal struct {
	future          raft.ApplyFuture
	at              time.Time
	batches, events int
	bytes           int
}

type sessionKey struct{}

func newSession(n *Node, term uint64) *session {
	ctx, end := context.WithCancelCause(context.Background())
	s := &session{
		n: n, term: term, end: end,
		space:    make(chan struct{}),
		progress: make(chan struct{}),
		kick:     make(chan struct{}, 1),
		slots:    make(chan struct{}, n.cfg.MaxInFlight),
		inflight: make(chan proposal, n.cfg.MaxInFlight),
		flushed:  make(chan struct{}),
		waited:   make(chan struct{}),
	}
	s.ctx = context.WithValue(ctx, sessionKey{}, s)
	go s.flusher()
	go s.waiter()
	return s
}

// sessionOf returns the session ctx was derived from (a RunWhileLeader context).
func sessionOf(ctx context.Context) *session {
	s, _ := ctx.Value(sessionKey{}).(*session)
	return s
}

// full reports whether the entry being filled must be proposed before it takes more.
func (s *session) full() bool {
	return s.enc.events >= s.n.cfg.MaxBatchEvents || len(s.enc.body)+len(s.enc.table) >= s.n.cfg.MaxBatchBytes
}

func (s *session) endedErr() error {
	return s.n.notLeader(fmt.Errorf("%w: %w", ErrSessionEnded, context.Cause(s.ctx)))
}

func (s *session) submit(ctx context.Context, b *ingest.StreamBatch) error {
	s.mu.Lock()
	for s.ctx.Err() == nil && s.enc.batches > 0 && s.full() {
		space := s.space
		s.mu.Unlock()
		select {
		case <-space:
		case <-ctx.Done():
			return ctx.Err()
		case <-s.ctx.Done():
		}
		s.mu.Lock()
	}
	if s.ctx.Err() != nil {
		s.mu.Unlock()
		return s.endedErr()
	}
	first := s.enc.batches == 0
	if err := s.enc.add(b); err != nil {
		s.mu.Unlock()
		return err
	}
	if first {
		s.firstAt = time.Now()
	}
	wake := first || s.full()
	s.mu.Unlock()
	if wake {
		select {
		case s.kick <- struct{}{}:
		default:
		}
	}
	return nil
}

// flush proposes the entry being filled at once and waits until it and every
// entry before it are applied here.
func (s *session) flush(ctx context.Context) error {
	s.mu.Lock()
	target := s.sealed
	if s.enc.batches > 0 {
		target++
		s.force = true
	}
	s.mu.Unlock()
	select {
	case s.kick <- struct{}{}:
	default:
	}
	for {
		s.mu.Lock()
		done, progress := s.applied >= target, s.progress
		s.mu.Unlock()
		if done {
			return nil
		}
		select {
		case <-progress:
		case <-ctx.Done():
			return ctx.Err()
		case <-s.ctx.Done():
			return s.endedErr()
		}
	}
}

func (s *session) flusher() {
	defer close(s.flushed)
	defer close(s.inflight)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		select {
		case s.slots <- struct{}{}:
		case <-s.ctx.Done():
			return
		}
		for {
			s.mu.Lock()
			n, full, force, due := s.enc.batches, s.full(), s.force, s.firstAt.Add(s.n.cfg.MaxBatchWait)
			s.mu.Unlock()
			wait := time.Until(due)
			if n > 0 && (full || force || wait <= 0) {
				break
			}
			var fire <-chan time.Time
			if n > 0 {
				timer.Reset(wait)
				fire = timer.C
			}
			select {
			case <-s.kick:
			case <-fire:
			case <-s.ctx.Done():
				return
			}
			timer.Stop()
		}
		s.mu.Lock()
		data := s.enc.finish(nil)
		p := proposal{at: time.Now(), batches: s.enc.batches, events: s.enc.events, bytes: len(data)}
		s.enc.reset()
		s.force = false
		s.sealed++
		close(s.space)
		s.space = make(chan struct{})
		s.mu.Unlock()
		// raft keeps data (log cache, replication), so it is never reused.
		p.future = s.n.raft.Apply(data, 0)
		answerOnStop(p.future, s.n.raftStopped)
		s.n.metrics.inflight.Inc()
		s.inflight <- p
	}
}

func (s *session) waiter() {
	defer close(s.waited)
	m := s.n.metrics
	for p := range s.inflight {
		err := p.future.Error()
		if err == nil {
			if r, ok := p.future.Response().(ApplyResult); ok && r.Err != nil {
				err = r.Err
			}
		}
		<-s.slots
		m.inflight.Dec()
		if err != nil {
			m.proposalFailures.Inc()
			s.end(fmt.Errorf("proposal of %d batches failed: %w", p.batches, err))
			continue
		}
		// Counted before Flush is woken, so that the metrics scraped after
		// a Flush include the entries it waited for.
		m.commitSeconds.Observe(time.Since(p.at).Seconds())
		m.proposedEntries.Inc()
		m.proposedBatches.Add(float64(p.batches))
		m.proposedEvents.Add(float64(p.events))
		m.proposedBytes.Add(float64(p.bytes))
		s.mu.Lock()
		s.applied++
		close(s.progress)
		s.progress = make(chan struct{})
		s.mu.Unlock()
	}
}

// join registers a RunWhileLeader function; false once the session is closing.
func (s *session) join() bool {
	s.fnMu.Lock()
	defer s.fnMu.Unlock()
	if s.fnClosed || s.ctx.Err() != nil {
		return false
	}
	s.fns.Add(1)
	return true
}

// close ends the session with cause and waits until nothing of it runs: the
// RunWhileLeader functions have returned and every proposal has been decided
// (or abandoned because raft stopped: answerOnStop), so the next session starts
// after all of this one's commits and no goroutine of it outlives the node.
func (s *session) close(cause error) {
	s.end(cause)
	s.fnMu.Lock()
	s.fnClosed = true
	s.fnMu.Unlock()
	s.fns.Wait()
	<-s.flushed
	<-s.waited
}

// answerOnStop makes f.Error return raft.ErrRaftShutdown once stopped is
// closed. hashicorp/raft answers the future of every entry it applies, and of
// every committed entry it can no longer queue for the FSM when it shuts down,
// but not of the entries already queued for the FSM when it stops: whoever
// waits on one of those would wait forever (the session's waiter did, past the
// node's end). raft's futures have a ShutdownCh for exactly this, which raft
// fills in for some other calls but not for Apply or VerifyLeader; this fills it
// in. It must run before anyone calls f.Error.
func answerOnStop(f raft.Future, stopped chan struct{}) {
	v := reflect.ValueOf(f)
	if v.Kind() != reflect.Pointer || v.IsNil() {
		return
	}
	ch := v.Elem().FieldByName("ShutdownCh")
	if ch.IsValid() && ch.CanSet() && ch.Type() == reflect.TypeOf(stopped) {
		ch.Set(reflect.ValueOf(stopped))
	}
}
