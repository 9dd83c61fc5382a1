package ledgerq

import (
	"fmt"
	"math"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	kvindexv1 "github.com/kvindex/kvindex/api/proto/kvindex/v1"
)

var t0 = time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)

func prediction(worker string, keys int, ttl time.Duration) *kvindexv1.PredictedPrefix {
	return &kvindexv1.PredictedPrefix{Worker: worker, Keys: make([]uint64, keys), TtlMs: uint32(ttl / time.Millisecond)}
}

// Take hands on what is left of each TTL and drops what ran out.
func TestTakeCutsEachTTLByItsWait(t *testing.T) {
	var q Queue
	q.AddPredicted(t0, prediction("a", 2, 10*time.Second))
	q.AddSessions(t0, &kvindexv1.SessionBinding{Key: "s1", Worker: "a", TtlMs: 30000})
	q.AddPredicted(t0.Add(4*time.Second), prediction("b", 1, 2*time.Second))
	q.AddSessions(t0.Add(4*time.Second), &kvindexv1.SessionBinding{Key: "s2", Worker: "b", TtlMs: 30000})
	pred, sess, _ := q.Take(t0.Add(7 * time.Second)) // a: 3 s of 10 left; b's 2 s ran out
	if len(pred) != 1 || pred[0].Worker != "a" || pred[0].TtlMs != 3000 {
		t.Errorf("predictions %v, want only a's with 3000 ms left", pred)
	}
	if len(sess) != 2 || sess[0].TtlMs != 23000 || sess[1].TtlMs != 27000 {
		t.Errorf("bindings %v, want s1 with 23000 ms and s2 with 27000 ms left", sess)
	}
	if pred, sess, _ := q.Take(t0.Add(7 * time.Second)); len(pred)+len(sess) != 0 || q.Keys() != 0 {
		t.Errorf("the queue still held %v %v (%d keys) after it was taken", pred, sess, q.Keys())
	}
}

// One message may sit in the queues of many routers (the leader's fan-out):
// taking it from one, later, must not change what another hands on.
func TestTakeLeavesSharedMessagesAlone(t *testing.T) {
	shared := prediction("a", 1, 10*time.Second)
	binding := &kvindexv1.SessionBinding{Key: "s", Worker: "a", TtlMs: 10000}
	var early, late Queue
	for _, q := range []*Queue{&early, &late} {
		q.AddPredicted(t0, shared)
		q.AddSessions(t0, binding)
	}
	late.Take(t0.Add(6 * time.Second))
	pred, sess, _ := early.Take(t0.Add(time.Second))
	if len(pred) != 1 || pred[0].TtlMs != 9000 || len(sess) != 1 || sess[0].TtlMs != 9000 {
		t.Errorf("after another queue took them at 6 s, this one hands on %v %v, want 9000 ms left", pred, sess)
	}
	if shared.TtlMs != 10000 || binding.TtlMs != 10000 {
		t.Errorf("the queued messages were modified: %v %v", shared, binding)
	}
}

// fill sets every field of m that is not a list of messages (those are the
// caller's to fill), so that a test comparing a copy with m covers fields
// added after it was written; a field of a kind it does not know fails t.
func fill(t *testing.T, m proto.Message) {
	t.Helper()
	r := m.ProtoReflect()
	fields := r.Descriptor().Fields()
	for i := range fields.Len() {
		f := fields.Get(i)
		switch {
		case f.IsList() && f.Kind() == protoreflect.MessageKind:
		case f.IsList() && f.Kind() == protoreflect.Uint64Kind:
			l := r.Mutable(f).List()
			l.Append(protoreflect.ValueOfUint64(7))
			l.Append(protoreflect.ValueOfUint64(9))
		case f.IsList() || f.IsMap():
			t.Fatalf("%s.%s: a list or map of a kind this test does not fill; teach it, and the copy to carry it",
				r.Descriptor().Name(), f.Name())
		case f.Name() == "ttl_ms":
			r.Set(f, protoreflect.ValueOfUint32(5000))
		case f.Kind() == protoreflect.StringKind:
			r.Set(f, protoreflect.ValueOfString(string(f.Name())))
		case f.Kind() == protoreflect.Uint32Kind:
			r.Set(f, protoreflect.ValueOfUint32(3))
		case f.Kind() == protoreflect.Uint64Kind:
			r.Set(f, protoreflect.ValueOfUint64(5))
		case f.Kind() == protoreflect.BoolKind:
			r.Set(f, protoreflect.ValueOfBool(true))
		default:
			t.Fatalf("%s.%s (%v): a field of a kind this test does not fill; teach it, and the copy to carry it",
				r.Descriptor().Name(), f.Name(), f.Kind())
		}
	}
}

// Take's copies carry every field of the message, not only those known when
// it was written: each field the messages have is set here and compared.
func TestTakeCopiesEveryField(t *testing.T) {
	p, s := &kvindexv1.PredictedPrefix{}, &kvindexv1.SessionBinding{}
	fill(t, p)
	fill(t, s)
	var q Queue
	q.AddPredicted(t0, p)
	q.AddSessions(t0, s)
	pred, sess, _ := q.Take(t0)
	if len(pred) != 1 || !proto.Equal(pred[0], p) {
		t.Errorf("prediction copied as %v, want %v", pred, p)
	}
	if len(sess) != 1 || !proto.Equal(sess[0], s) {
		t.Errorf("binding copied as %v, want %v", sess, s)
	}
}

// The bounds: the newest LedgerMaxQueued of each kind, at most
// LedgerMaxQueuedKeys predicted keys, in order.
func TestAddKeepsTheNewestWithinTheBounds(t *testing.T) {
	for _, c := range []struct {
		name      string
		n, keys   int // predictions added one at a time, keys each
		wantCount int
	}{
		{"few keys: the count bound", kvindexv1.LedgerMaxQueued + 100, 4, kvindexv1.LedgerMaxQueued},
		{"long prompts: the key bound", 40, kvindexv1.LedgerMaxPredictionKeys, kvindexv1.LedgerMaxQueuedKeys / kvindexv1.LedgerMaxPredictionKeys},
		{"under both", 10, 100, 10},
	} {
		t.Run(c.name, func(t *testing.T) {
			var q Queue
			for i := range c.n {
				q.AddPredicted(t0, prediction(fmt.Sprint(i), c.keys, time.Minute))
				q.AddSessions(t0, &kvindexv1.SessionBinding{Key: fmt.Sprint(i), TtlMs: 60000})
				if q.Keys() > kvindexv1.LedgerMaxQueuedKeys {
					t.Fatalf("%d keys held after %d predictions, bound %d", q.Keys(), i+1, kvindexv1.LedgerMaxQueuedKeys)
				}
			}
			pred, sess := takeAll(t, &q, t0)
			if len(pred) != c.wantCount {
				t.Fatalf("%d predictions kept, want %d", len(pred), c.wantCount)
			}
			for i, p := range pred {
				if want := fmt.Sprint(c.n - c.wantCount + i); p.Worker != want {
					t.Fatalf("kept prediction %d is #%s, want #%s (the newest, in order)", i, p.Worker, want)
				}
			}
			if want := min(c.n, kvindexv1.LedgerMaxQueued); len(sess) != want || sess[len(sess)-1].Key != fmt.Sprint(c.n-1) {
				t.Errorf("%d bindings kept, want the newest %d", len(sess), want)
			}
		})
	}
}

// Edges of the TTL cut: exactly run out, a millisecond left, a clock that
// stepped back.
func TestTakeAtTheEdges(t *testing.T) {
	p := prediction("a", 1, 10*time.Second)
	for _, c := range []struct {
		name    string
		waited  time.Duration
		wantTTL uint32 // 0: dropped
	}{
		{"ran out exactly", 10 * time.Second, 0},
		{"a millisecond left", 10*time.Second - time.Millisecond, 1},
		{"under a millisecond left", 10*time.Second - time.Microsecond, 0},
		{"the clock stepped back", -time.Hour, 10000},
	} {
		t.Run(c.name, func(t *testing.T) {
			var q Queue
			q.AddPredicted(t0, p)
			pred, _, _ := q.Take(t0.Add(c.waited))
			switch {
			case c.wantTTL == 0 && len(pred) != 0:
				t.Fatalf("handed on %v, want it dropped", pred)
			case c.wantTTL == 0:
			case len(pred) != 1 || pred[0].TtlMs != c.wantTTL:
				t.Fatalf("handed on %v, want TTL %d ms", pred, c.wantTTL)
			}
		})
	}
}

// More than the bound in one Add keeps the newest.
func TestAddOfMoreThanTheBoundAtOnce(t *testing.T) {
	var batch []*kvindexv1.PredictedPrefix
	for i := range kvindexv1.LedgerMaxQueued + 10 {
		batch = append(batch, prediction(fmt.Sprint(i), 1, time.Minute))
	}
	var q Queue
	q.AddPredicted(t0, batch...)
	pred, _ := takeAll(t, &q, t0)
	if len(pred) != kvindexv1.LedgerMaxQueued || pred[0].Worker != "10" {
		t.Fatalf("kept %d from #%s, want the newest %d from #10", len(pred), pred[0].Worker, kvindexv1.LedgerMaxQueued)
	}
}

func TestTTLMs(t *testing.T) {
	for _, c := range []struct {
		d    time.Duration
		want uint32
	}{
		{0, 0},
		{-time.Second, 0},
		{time.Microsecond, 1}, // positive: still shared
		{5 * time.Second, 5000},
		{100 * 24 * time.Hour, math.MaxUint32}, // past what the field carries
	} {
		if got := TTLMs(c.d); got != c.want {
			t.Errorf("TTLMs(%v) = %d, want %d", c.d, got, c.want)
		}
	}
}

// takeAll takes message after message until the queue is empty.
func takeAll(t *testing.T, q *Queue, now time.Time) ([]*kvindexv1.PredictedPrefix, []*kvindexv1.SessionBinding) {
	t.Helper()
	var pred []*kvindexv1.PredictedPrefix
	var sess []*kvindexv1.SessionBinding
	for more := true; more; {
		var p []*kvindexv1.PredictedPrefix
		var s []*kvindexv1.SessionBinding
		p, s, more = q.Take(now)
		if more && len(p)+len(s) == 0 {
			t.Fatal("Take took nothing and says more is left")
		}
		pred, sess = append(pred, p...), append(sess, s...)
	}
	return pred, sess
}

// A full queue is far more than a message may carry: Take hands it on in
// messages of at most LedgerMaxMessageBytes of each kind, oldest first, losing
// nothing, and the key count follows what is left.
func TestTakeHandsOnAFullQueueAMessageAtATime(t *testing.T) {
	var q Queue
	n := kvindexv1.LedgerMaxQueuedKeys / kvindexv1.LedgerMaxPredictionKeys
	for i := range n {
		p := prediction(fmt.Sprint(i), kvindexv1.LedgerMaxPredictionKeys, time.Minute)
		for k := range p.Keys {
			p.Keys[k] = math.MaxUint64 - uint64(k) // 10 bytes each on the wire, as real keys
		}
		q.AddPredicted(t0, p)
	}
	for i := range kvindexv1.LedgerMaxQueued {
		q.AddSessions(t0, &kvindexv1.SessionBinding{Key: fmt.Sprintf("%0255d", i), Worker: "w", TtlMs: 60000})
	}
	var pred []*kvindexv1.PredictedPrefix
	var sess []*kvindexv1.SessionBinding
	messages := 0
	for more := true; more; messages++ {
		var p []*kvindexv1.PredictedPrefix
		var s []*kvindexv1.SessionBinding
		p, s, more = q.Take(t0)
		// Each message in a report adds its tag and length (4 bytes) to its size.
		if size := proto.Size(&kvindexv1.ReportRequest{Predicted: p}); size > kvindexv1.LedgerMaxMessageBytes+4*len(p) {
			t.Fatalf("message %d carries %d bytes of predictions, over %d", messages, size, kvindexv1.LedgerMaxMessageBytes)
		}
		if size := proto.Size(&kvindexv1.ReportRequest{Sessions: s}); size > kvindexv1.LedgerMaxMessageBytes+4*len(s) {
			t.Fatalf("message %d carries %d bytes of bindings, over %d", messages, size, kvindexv1.LedgerMaxMessageBytes)
		}
		pred, sess = append(pred, p...), append(sess, s...)
		if want := (n - len(pred)) * kvindexv1.LedgerMaxPredictionKeys; q.Keys() != want {
			t.Fatalf("%d keys counted after message %d, want %d", q.Keys(), messages, want)
		}
		if messages > n+kvindexv1.LedgerMaxQueued {
			t.Fatal("Take never empties the queue")
		}
	}
	if messages < 2 {
		t.Fatalf("a full queue went in %d message", messages)
	}
	if len(pred) != n || len(sess) != kvindexv1.LedgerMaxQueued {
		t.Fatalf("%d predictions and %d bindings handed on, want %d and %d", len(pred), len(sess), n, kvindexv1.LedgerMaxQueued)
	}
	for i, p := range pred {
		if p.Worker != fmt.Sprint(i) {
			t.Fatalf("prediction %d handed on is #%s, want arrival order", i, p.Worker)
		}
	}
}

// Fields this build does not know are neither held nor handed on (the bounds
// count keys and messages, and unknown fields could be any size), and the
// caller's messages keep them.
func TestAddDropsUnknownFields(t *testing.T) {
	// Field 99, a megabyte: what a newer (or hostile) router could send that
	// this build does not know.
	blob := protowire.AppendBytes(protowire.AppendTag(nil, 99, protowire.BytesType), make([]byte, 1<<20))
	p := prediction("a", 2, 10*time.Second)
	s := &kvindexv1.SessionBinding{Key: "s", Worker: "a", TtlMs: 10000}
	p.ProtoReflect().SetUnknown(blob)
	s.ProtoReflect().SetUnknown(blob)
	var q Queue
	q.AddPredicted(t0, p)
	q.AddSessions(t0, s)
	for _, e := range q.predicted {
		if n := len(e.msg.ProtoReflect().GetUnknown()); n != 0 {
			t.Errorf("a queued prediction holds %d bytes of unknown fields", n)
		}
	}
	for _, e := range q.sessions {
		if n := len(e.msg.ProtoReflect().GetUnknown()); n != 0 {
			t.Errorf("a queued binding holds %d bytes of unknown fields", n)
		}
	}
	pred, sess, _ := q.Take(t0)
	if len(pred) != 1 || len(pred[0].Keys) != 2 || len(pred[0].ProtoReflect().GetUnknown()) != 0 ||
		len(sess) != 1 || sess[0].Key != "s" || len(sess[0].ProtoReflect().GetUnknown()) != 0 {
		t.Errorf("handed on %d predictions and %d bindings with unknown fields, want one of each with its known fields alone", len(pred), len(sess))
	}
	if len(p.ProtoReflect().GetUnknown()) != len(blob) || len(s.ProtoReflect().GetUnknown()) != len(blob) {
		t.Errorf("the caller's messages were modified")
	}
}
