package raftstore

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/ingest"
	"github.com/kvindex/kvindex/internal/radix"
)

// synthFleet plays the engines and ingest's side of the Sink/CursorSource
// contract. The engines publish batches at a steady rate whoever leads and keep
// them all (the replay buffer); the ingest side (run, one per leader session)
// resumes each stream at its replicated cursor + 1, submitting from that history,
// then follows the live stream, exactly as ingest's Manager does with replay.
type synthFleet struct {
	streams []*synthStream
	blocks  int // block events per batch

	mu      sync.Mutex
	history [][]ingest.StreamBatch // per stream, by seq
	more    chan struct{}          // closed and replaced when batches are published
}

func newSynthFleet(streams, blocks int) *synthFleet {
	f := &synthFleet{streams: testStreams(streams), blocks: blocks, more: make(chan struct{})}
	f.history = make([][]ingest.StreamBatch, streams)
	return f
}

// publish appends one batch to every stream.
func (f *synthFleet) publish() {
	f.mu.Lock()
	for i, s := range f.streams {
		f.history[i] = append(f.history[i], s.batch(f.blocks))
	}
	close(f.more)
	f.more = make(chan struct{})
	f.mu.Unlock()
}

// publishEvery publishes a round every interval until ctx ends.
func (f *synthFleet) publishEvery(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			f.publish()
		case <-ctx.Done():
			return
		}
	}
}

func (f *synthFleet) published() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, h := range f.history {
		n += len(h)
	}
	return n
}

// get returns batch seq of stream i, waiting for it to be published.
func (f *synthFleet) get(ctx context.Context, i int, seq uint64) (ingest.StreamBatch, bool) {
	for {
		f.mu.Lock()
		h, more := f.history[i], f.more
		f.mu.Unlock()
		if seq < uint64(len(h)) {
			return h[seq], true
		}
		select {
		case <-more:
		case <-ctx.Done():
			return ingest.StreamBatch{}, false
		}
	}
}

// run is the leader's ingest: one goroutine per stream, until ctx ends or Submit fails.
func (f *synthFleet) run(ctx context.Context, sink ingest.Sink, cursors ingest.CursorSource) {
	var wg sync.WaitGroup
	for i, s := range f.streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			next := uint64(0)
			if c, ok := cursors.Cursor(s.stream); ok {
				next = c.Seq + 1
			}
			for {
				b, ok := f.get(ctx, i, next)
				if !ok || sink.Submit(ctx, b) != nil {
					return
				}
				next++
			}
		}()
	}
	wg.Wait()
}

// reference applies every published batch once, in order, to a fresh index.
func (f *synthFleet) reference() *ingest.Applier {
	a := ingest.NewApplier(radix.New(radix.Config{}))
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, h := range f.history {
		for _, b := range h {
			a.Apply(b)
		}
	}
	return a
}

// lastSeqs returns the last published seq of every stream.
func (f *synthFleet) lastSeqs() map[ingest.Stream]uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[ingest.Stream]uint64{}
	for i, s := range f.streams {
		if len(f.history[i]) > 0 {
			out[s.stream] = uint64(len(f.history[i]) - 1)
		}
	}
	return out
}

// applyLog records, for one incarnation of one node, which seqs of each stream
// its FSM applied, in order (a BatchObserver).
type applyLog struct {
	mu         sync.Mutex
	applied    map[ingest.Stream][]uint64
	duplicates int // committed batches dropped as already applied (re-proposals)
}

func newApplyLog() *applyLog { return &applyLog{applied: map[ingest.Stream][]uint64{}} }

func (l *applyLog) observe(_ uint64, b *ingest.StreamBatch, o BatchOutcome, _ ingest.ApplyResult) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch o {
	case BatchApplied:
		l.applied[b.Stream] = append(l.applied[b.Stream], b.Seq)
	case BatchDuplicate:
		l.duplicates++
	}
}

// audit compares what this incarnation applied, from an empty state, with what was
// published, seqs 0 to last (per stream): lost = seqs never applied, dup = seqs
// applied more than once. With last nil (an incarnation killed midway, or streams
// whose first batches predate the test) it checks each stream from the lowest to
// the highest seq applied: any hole between is a loss.
func (l *applyLog) audit(last map[ingest.Stream]uint64) (lost, dup, applied int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	first := map[ingest.Stream]uint64{}
	if last == nil {
		last = map[ingest.Stream]uint64{}
		for s, seqs := range l.applied {
			first[s], last[s] = slices.Min(seqs), slices.Max(seqs)
		}
	}
	for s, top := range last {
		seen := make([]int, top+1)
		for _, q := range l.applied[s] {
			if q <= top {
				seen[q]++
			}
			applied++
		}
		seen = seen[first[s]:]
		for _, n := range seen {
			switch {
			case n == 0:
				lost++
			case n > 1:
				dup += n - 1
			}
		}
	}
	return lost, dup, applied
}

// lastApplied is the highest seq of s applied.
func (l *applyLog) lastApplied(s ingest.Stream) uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.applied[s]) == 0 {
		return 0
	}
	return slices.Max(l.applied[s])
}

// waitCaughtUp waits until every running node's cursor of every stream is at the
// last published seq.
func waitCaughtUp(t testing.TB, c *testCluster, last map[ingest.Stream]uint64, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var why string
	for time.Now().Before(deadline) {
		why = ""
		for _, tn := range c.live() {
			n := tn.get()
			for s, seq := range last {
				if cur, ok := n.Applier().Cursor(s); !ok || cur.Seq < seq {
					why = fmt.Sprintf("%s: stream %v at %v, want seq %d", tn.id, s, cur, seq)
					break
				}
			}
			if why != "" {
				break
			}
		}
		if why == "" {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("replicas did not catch up within %v: %s", timeout, why)
}

// ingestEverywhere runs fleet.run on every node while it leads (what cmd/indexer
// does with ingest's Manager), restarting with nodes that are restarted.
type ingestEverywhere struct {
	ctx    context.Context
	fleet  *synthFleet
	wg     sync.WaitGroup
	cancel map[*Node]context.CancelFunc
	mu     sync.Mutex
}

func (ie *ingestEverywhere) attach(n *Node) {
	ctx, cancel := context.WithCancel(ie.ctx)
	ie.mu.Lock()
	if ie.cancel == nil {
		ie.cancel = map[*Node]context.CancelFunc{}
	}
	ie.cancel[n] = cancel
	ie.mu.Unlock()
	ie.wg.Add(1)
	go func() {
		defer ie.wg.Done()
		n.RunWhileLeader(ctx, func(lctx context.Context) { ie.fleet.run(lctx, n, n.Applier()) })
	}()
}

func (ie *ingestEverywhere) stop() {
	ie.mu.Lock()
	for _, c := range ie.cancel {
		c()
	}
	ie.mu.Unlock()
	ie.wg.Wait()
}
