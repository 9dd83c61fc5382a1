package server

import (
	"errors"
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
		feed.WorkerRemoved("w", uint64(i+1))
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
	feed.WorkerRemoved("w", 9) // filtered out: nothing queued
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
		{name: "from before the first kept", buffer: 3, after: 10, refused: true},
		{name: "from the oldest kept", buffer: 3, after: 11, want: []uint64{12, 13, 14, 15, 16}},
		{name: "from before changes nobody computed", buffer: 16, after: 3, refused: true,
			setup: func(f *ChangeFeed) { f.WorkerRemoved("w", 5) }}, // nobody watched at 5
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newTestFeed(t, c.buffer)
			if c.setup != nil {
				c.setup(f)
			}
			first := mustSubscribe(t, f, nil, "", 0, false)
			for i := uint64(10); i < 15; i++ {
				f.WorkerRemoved("w", i)
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
				f.WorkerRemoved("w", i)
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
	f.WorkerRemoved("w1", 3)
	f.WorkerRemoved("w2", 4)
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
