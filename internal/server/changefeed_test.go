package server

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	kvindexv1 "github.com/kvindex/kvindex/api/proto/kvindex/v1"
	"github.com/kvindex/kvindex/internal/workerspec"
)

// received drains what a subscription has been given so far (after a flush),
// as the applied indexes of its batches.
func received(t *testing.T, f *ChangeFeed, s *Subscription) []uint64 {
	t.Helper()
	f.fan.flush()
	var got []uint64
	for {
		select {
		case b, ok := <-s.C():
			if !ok {
				return got
			}
			got = append(got, b[0].AppliedIndex)
		default:
			return got
		}
	}
}

// removeWorkerEntry applies a log entry at index that removed worker, as the
// apply path reports it to the feed.
func removeWorkerEntry(f *ChangeFeed, worker string, index uint64) {
	f.WorkerRemoved(worker, index)
	f.EntryApplied(index)
}

func newTestFeed(t *testing.T, buffer int) *ChangeFeed {
	f := NewChangeFeed(buffer)
	t.Cleanup(func() { f.Close(nil) })
	return f
}

func mustSubscribe(t *testing.T, f *ChangeFeed, workers []string, model string, after uint64, resume bool) *Subscription {
	t.Helper()
	s, err := f.Subscribe(workers, model, after, resume)
	if err != nil {
		t.Fatalf("Subscribe(after %d, resume %v): %v", after, resume, err)
	}
	return s
}

// TestWatchThatFallsBehindIsEnded: a subscriber buffer batches behind is ended
// with ErrWatchLagging; the others go on.
func TestWatchThatFallsBehindIsEnded(t *testing.T) {
	feed := newTestFeed(t, 2)
	slow := mustSubscribe(t, feed, nil, "", 0, false)
	for i := range 3 {
		removeWorkerEntry(feed, "w", uint64(i+1))
	}
	feed.fan.flush()
	n := 0
	for range slow.C() {
		n++
	}
	if n != 2 || !errors.Is(slow.Err(), ErrWatchLagging) {
		t.Errorf("received %d batches, err %v; want 2 and ErrWatchLagging", n, slow.Err())
	}
	if feed.fan.active.Load() != 0 {
		t.Error("the lagging subscription is still active")
	}
	other := mustSubscribe(t, feed, []string{"x"}, "", 0, false)
	removeWorkerEntry(feed, "w", 9) // filtered out: nothing queued
	if got := received(t, feed, other); len(got) != 0 {
		t.Errorf("a watcher of x got %v", got)
	}
	other.Close()
	if _, open := <-other.C(); open || other.Err() != nil {
		t.Errorf("Close: err %v", other.Err())
	}
}

// TestWatchResumesAfterAnAppliedIndex: a resumed subscription gets every change
// after the index it names, then live ones, each once; one that names changes
// this feed did not compute or no longer keeps is refused with
// ErrWatchResumeUnavailable.
func TestWatchResumesAfterAnAppliedIndex(t *testing.T) {
	cases := []struct {
		name    string
		buffer  int
		setup   func(f *ChangeFeed) // publishes under a subscription at indexes 10..14
		after   uint64
		want    []uint64 // after two more live changes at 15, 16
		refused bool
	}{
		{name: "from the middle", buffer: 16, after: 12, want: []uint64{13, 14, 15, 16}},
		{name: "from the last one", buffer: 16, after: 14, want: []uint64{15, 16}},
		// The client saw 15 on another member; this one applies it after the
		// resume and must not deliver it again.
		{name: "from ahead of this member", buffer: 16, after: 15, want: []uint64{16}},
		{name: "from before the first kept", buffer: 3, after: 10, refused: true},
		{name: "from the oldest kept", buffer: 3, after: 11, want: []uint64{12, 13, 14, 15, 16}},
		{name: "from before changes nobody computed", buffer: 16, after: 3, refused: true,
			setup: func(f *ChangeFeed) { removeWorkerEntry(f, "w", 5) }}, // nobody watched at 5
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newTestFeed(t, c.buffer)
			if c.setup != nil {
				c.setup(f)
			}
			first := mustSubscribe(t, f, nil, "", 0, false)
			for i := uint64(10); i < 15; i++ {
				removeWorkerEntry(f, "w", i)
				_ = received(t, f, first) // keep up: a lagging watcher would end
			}
			s, err := f.Subscribe(nil, "", c.after, true)
			if c.refused {
				if !errors.Is(err, ErrWatchResumeUnavailable) {
					t.Fatalf("Subscribe after %d: err %v, want ErrWatchResumeUnavailable", c.after, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := received(t, f, s)
			for _, i := range []uint64{15, 16} {
				removeWorkerEntry(f, "w", i)
				got = append(got, received(t, f, s)...)
			}
			if !slices.Equal(got, c.want) {
				t.Errorf("resumed after %d: got indexes %v, want %v", c.after, got, c.want)
			}
		})
	}
}

// TestWatchModelOfANewWorker: the model of a worker registered just before
// its changes comes from the registry as applied, not from a later refresh.
func TestWatchModelOfANewWorker(t *testing.T) {
	f := newTestFeed(t, 16)
	s := mustSubscribe(t, f, nil, "llama", 0, false)
	f.WorkersChanged([]workerspec.Spec{{ID: "w1", Model: "llama"}, {ID: "w2", Model: "qwen"}})
	removeWorkerEntry(f, "w1", 3)
	removeWorkerEntry(f, "w2", 4)
	f.fan.flush()
	select {
	case b := <-s.C():
		if len(b) != 1 || b[0].Worker != "w1" || b[0].Model != "llama" || b[0].Kind != kvindexv1.ChangeKind_CHANGE_KIND_WORKER_REMOVED {
			t.Errorf("got %v, want w1's removal, model llama", b)
		}
	default:
		t.Fatal("the watcher of model llama got nothing")
	}
	if got := received(t, f, s); len(got) != 0 {
		t.Errorf("the watcher of model llama also got %v", got)
	}
}

// TestWatchGetsAnEntryWhole: the changes of one log entry (here a removal and
// a death, as an entry of many batches has many) reach a watcher in one batch,
// and only once the entry is applied, so a Watch message never ends inside an
// entry and a client resuming after the entry's index misses none of it. The
// part of an entry that was being applied when a subscription started is not
// delivered: the subscription starts after that entry.
func TestWatchGetsAnEntryWhole(t *testing.T) {
	f := newTestFeed(t, 16)
	s := mustSubscribe(t, f, nil, "", 0, false)
	f.WorkerRemoved("a", 7)
	f.WorkerDead("b", []uint32{0, 1}, 7)
	if got := received(t, f, s); len(got) != 0 {
		t.Fatalf("changes of entry 7 delivered before it was applied: %v", got)
	}
	f.EntryApplied(7)
	f.fan.flush()
	select {
	case b := <-s.C():
		var got []string
		for _, c := range b {
			got = append(got, fmt.Sprintf("%s/%d %s @%d", c.Worker, c.DpRank, c.Kind, c.AppliedIndex))
		}
		want := []string{"a/0 CHANGE_KIND_WORKER_REMOVED @7", "b/0 CHANGE_KIND_CLEARED @7", "b/1 CHANGE_KIND_CLEARED @7"}
		if !slices.Equal(got, want) {
			t.Errorf("entry 7 delivered as %q, want one batch %q", got, want)
		}
	default:
		t.Fatal("entry 7 was not delivered once applied")
	}
	resumed := mustSubscribe(t, f, nil, "", 7, true)
	removeWorkerEntry(f, "c", 8)
	if got := received(t, f, resumed); !slices.Equal(got, []uint64{8}) {
		t.Errorf("resumed after 7: got %v, want [8]", got)
	}

	// Recording starts inside entry 9: its first part was not computed.
	g := newTestFeed(t, 16)
	g.WorkerRemoved("x", 9) // nobody watches
	late := mustSubscribe(t, g, nil, "", 0, false)
	if late.From() != 9 {
		t.Fatalf("a subscription started inside entry 9 starts after %d, want 9", late.From())
	}
	g.WorkerRemoved("y", 9)
	g.EntryApplied(9)
	removeWorkerEntry(g, "z", 10)
	if got := received(t, g, late); !slices.Equal(got, []uint64{10}) {
		t.Errorf("a subscription from 9 got %v, want [10] (nothing of entry 9)", got)
	}
}
