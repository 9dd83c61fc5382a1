// Package ledgerq is how the shared ledger's messages (LoadService.Report,
// docs/router.md) are sized, the same way on both sides: the router and the
// leader.
//
// Queue holds decisions on their way to other routers: a router's outbox while
// its stream to the leader is down, and the leader's queue for each router
// between two pushes. Both sides bound it the same way (kvindexv1.LedgerMax*:
// the newest LedgerMaxQueued predictions and as many session bindings, at most
// LedgerMaxQueuedKeys predicted keys) and both hand on what is left of each
// message's TTL, so a decision that waited (a stream down, an election, a
// router reconnecting within its lease) is not taken as fresh, and an expired
// one is not sent at all. Both take it a message's worth at a time
// (LedgerMaxMessageBytes), as a full queue is more than one message carries.
//
// SplitReport and SplitPush cut a report or push whose loads are more than
// LedgerMaxMessageBytes into several messages (parts.go), and Parts gathers
// them again on the receiving side, which applies them together.
//
// A Queue or Parts is not safe for concurrent use: its owner's mutex or
// goroutine guards it.
package ledgerq

import (
	"math"
	"time"

	"google.golang.org/protobuf/proto"

	kvindexv1 "github.com/kvindex/kvindex/api/proto/kvindex/v1"
)

// Queue holds messages in arrival order. The zero value is empty and ready.
type Queue struct {
	predicted []item[*kvindexv1.PredictedPrefix]
	keys      int // keys held in predicted
	sessions  []item[*kvindexv1.SessionBinding]
}

type item[T any] struct {
	msg T
	at  time.Time
}

// AddPredicted queues predictions that arrived at now, then drops the oldest
// beyond the bounds. Callers keep each prediction within
// LedgerMaxPredictionKeys, fewer than LedgerMaxQueuedKeys, so the newest always
// stays (one over it would be dropped too). Messages are not modified, here or
// by Take, so one message may sit in many queues.
//
// The fields this build does not know are not queued (a copy is, without
// them): the bounds count messages and keys, and a message's unknown fields
// could otherwise hold any number of bytes each. So a newer router's field does
// not pass through an older leader during a rolling upgrade.
func (q *Queue) AddPredicted(now time.Time, predicted ...*kvindexv1.PredictedPrefix) {
	for _, p := range predicted {
		if len(p.ProtoReflect().GetUnknown()) > 0 {
			p = predictionWith(p, p.TtlMs)
		}
		q.predicted = append(q.predicted, item[*kvindexv1.PredictedPrefix]{p, now})
		q.keys += len(p.Keys)
	}
	drop := 0
	for drop < len(q.predicted) && (len(q.predicted)-drop > kvindexv1.LedgerMaxQueued || q.keys > kvindexv1.LedgerMaxQueuedKeys) {
		q.keys -= len(q.predicted[drop].msg.Keys)
		drop++
	}
	// Moving the start, not the entries: while a stream is down every decision
	// drops one, and append copies what is kept only when the array's end is
	// reached.
	clear(q.predicted[:drop])
	q.predicted = q.predicted[drop:]
}

// AddSessions queues session bindings that arrived at now, keeping the newest
// LedgerMaxQueued, without their unknown fields as AddPredicted.
func (q *Queue) AddSessions(now time.Time, sessions ...*kvindexv1.SessionBinding) {
	for _, s := range sessions {
		if len(s.ProtoReflect().GetUnknown()) > 0 {
			s = bindingWith(s, s.TtlMs)
		}
		q.sessions = append(q.sessions, item[*kvindexv1.SessionBinding]{s, now})
	}
	if over := len(q.sessions) - kvindexv1.LedgerMaxQueued; over > 0 {
		clear(q.sessions[:over])
		q.sessions = q.sessions[over:]
	}
}

// Keys is the number of predicted keys held.
func (q *Queue) Keys() int { return q.keys }

// Reset empties the queue.
func (q *Queue) Reset() { *q = Queue{} }

// Take removes from the queue the oldest messages that one report or push
// carries, at most kvindexv1.LedgerMaxMessageBytes of predictions and as much
// of bindings on the wire (at least one of each, which the bounds on a message
// keep under it), and returns, in arrival order, copies of those whose TTL has
// not run out by now, each TTL cut to what is left of it; more says whether
// messages are left for the next one.
func (q *Queue) Take(now time.Time) (predicted []*kvindexv1.PredictedPrefix, sessions []*kvindexv1.SessionBinding, more bool) {
	predicted, n := take(q.predicted, now, predictionWith)
	for _, e := range q.predicted[:n] {
		q.keys -= len(e.msg.Keys)
	}
	clear(q.predicted[:n])
	q.predicted = q.predicted[n:]
	sessions, n = take(q.sessions, now, bindingWith)
	clear(q.sessions[:n])
	q.sessions = q.sessions[n:]
	if len(q.predicted)+len(q.sessions) == 0 {
		q.Reset() // lets go of the arrays
		return predicted, sessions, false
	}
	return predicted, sessions, true
}

// take copies (by cut, with the TTL left) the oldest of items that fit
// LedgerMaxMessageBytes, skipping those that ran out, and returns the copies and
// how many items they used up.
func take[T interface {
	proto.Message
	GetTtlMs() uint32
}](items []item[T], now time.Time, cut func(T, uint32) T) ([]T, int) {
	var out []T
	size, n := 0, 0
	for ; n < len(items); n++ {
		e := items[n]
		ttl, ok := left(e.msg.GetTtlMs(), now.Sub(e.at))
		if !ok {
			continue
		}
		c := cut(e.msg, ttl)
		s := proto.Size(c)
		if len(out) > 0 && size+s > kvindexv1.LedgerMaxMessageBytes {
			break
		}
		size += s
		out = append(out, c)
	}
	return out, n
}

// predictionWith is a copy of p's known fields with TTL ttl.
func predictionWith(p *kvindexv1.PredictedPrefix, ttl uint32) *kvindexv1.PredictedPrefix {
	return &kvindexv1.PredictedPrefix{Worker: p.Worker, DpRank: p.DpRank, Keys: p.Keys, TtlMs: ttl, RouterId: p.RouterId}
}

// bindingWith is a copy of s's known fields with TTL ttl.
func bindingWith(s *kvindexv1.SessionBinding, ttl uint32) *kvindexv1.SessionBinding {
	return &kvindexv1.SessionBinding{Key: s.Key, Worker: s.Worker, TtlMs: ttl}
}

// left is what remains of ttlMs after waited (a clock stepping back counts as
// no wait), false when under a millisecond.
func left(ttlMs uint32, waited time.Duration) (uint32, bool) {
	rest := time.Duration(ttlMs)*time.Millisecond - max(waited, 0)
	return uint32(rest / time.Millisecond), rest >= time.Millisecond
}

// TTLMs is d in the messages' milliseconds, at most what they can carry (~49
// days) and at least 1 ms for a positive d, which would otherwise not be shared.
func TTLMs(d time.Duration) uint32 {
	if d <= 0 {
		return 0
	}
	return uint32(min(max(d/time.Millisecond, 1), math.MaxUint32))
}
