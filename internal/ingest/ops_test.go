package ingest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvindex/kvindex/internal/ingest/wire"
	"github.com/kvindex/kvindex/internal/kvblock"
	"github.com/kvindex/kvindex/internal/logbuf"
	"github.com/kvindex/kvindex/internal/radix"
)

func TestOpsFromEvents(t *testing.T) {
	b := newOpBuilder("llama", 2)
	events := []wire.Event{
		{Kind: wire.BlockStored, BlockHashes: []uint64{1, 2}, TokenIDs: []uint32{1, 2, 3, 4}, BlockSize: 2, Medium: wire.MediumGPU},
		{Kind: wire.BlockStored, BlockHashes: []uint64{3}, Parent: 2, HasParent: true, TokenIDs: []uint32{5, 6}, BlockSize: 2,
			LoRAName: "sql", CacheSalt: "t1", Medium: wire.MediumCPUPinned},
		{Kind: wire.BlockStored, BlockHashes: []uint64{4}, TokenIDs: []uint32{5, 6, 7}, BlockSize: 2},    // token count
		{Kind: wire.BlockStored, BlockHashes: []uint64{5}, TokenIDs: []uint32{1, 2, 3, 4}, BlockSize: 4}, // block size
		{Kind: wire.BlockStored, BlockHashes: []uint64{6, 7}, TokenIDs: []uint32{1, 2, 3}, BlockSize: 2}, // token count
		{Kind: wire.BlockRemoved, BlockHashes: []uint64{1}, Medium: wire.MediumStorage},
		{Kind: wire.BlockRemoved},
		{Kind: wire.AllBlocksCleared},
	}
	ops, st := b.build(events)
	want := []Op{
		{Kind: OpStored, Namespace: kvblock.Namespace{Model: "llama"}.ID(), Hashes: []uint64{1, 2},
			Keys: kvblock.AppendLocalHashes(nil, []uint32{1, 2, 3, 4}, 2, ""), Tier: radix.TierGPU},
		{Kind: OpStored, Namespace: kvblock.Namespace{Model: "llama", LoRA: "sql", CacheSalt: "t1"}.ID(), Parent: 2, HasParent: true,
			Hashes: []uint64{3}, Keys: kvblock.AppendLocalHashes(nil, []uint32{5, 6}, 2, "sql"), Tier: radix.TierCPU},
		{Kind: OpRemoved, Hashes: []uint64{1}, Tier: radix.TierDisk},
		{Kind: OpCleared},
	}
	if len(ops) != len(want) {
		t.Fatalf("got %d ops %+v, want %d", len(ops), ops, len(want))
	}
	for i := range want {
		g, w := ops[i], want[i]
		if g.Kind != w.Kind || g.Namespace != w.Namespace || g.Parent != w.Parent || g.HasParent != w.HasParent ||
			!slices.Equal(g.Hashes, w.Hashes) || !slices.Equal(g.Keys, w.Keys) || g.Tier != w.Tier {
			t.Errorf("op %d = %+v, want %+v", i, g, w)
		}
	}
	wantStats := opStats{stored: 2, removed: 1, cleared: 1, storedBlocks: 3, removedBlocks: 1, refusedTokens: 2, refusedBlockLen: 1}
	if st != wantStats {
		t.Errorf("stats = %+v, want %+v", st, wantStats)
	}
	// Keys of one batch share one allocation but never overlap.
	ops[0].Keys = append(ops[0].Keys, 99)
	if ops[1].Keys[0] == 99 {
		t.Error("appending to one op's keys overwrote the next op's")
	}

	free := newOpBuilder("llama", 0) // block size from the events
	if ops, st := free.build(events[3:4]); len(ops) != 1 || st.refusedBlockLen != 0 {
		t.Errorf("block size 0 should accept the event's: %+v %+v", ops, st)
	}
	noModel := newOpBuilder("", 0)
	if ops, st := noModel.build(events[:1]); len(ops) != 0 || st.refusedNoModel != 1 {
		t.Errorf("no model: %+v %+v", ops, st)
	}
}

func TestLocalSinkAppliesInOrderWithBackPressure(t *testing.T) {
	reg := prometheus.NewRegistry()
	a := NewApplier(radix.New(radix.Config{}))
	sink, err := NewLocalSink(a, 2, slog.New(slog.DiscardHandler), reg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewLocalSink(a, 2, nil, reg); err == nil {
		t.Error("a second sink registered the same metrics")
	}
	s := Stream{Worker: "w"}
	op := func(h uint64) []Op {
		return []Op{{Kind: OpStored, Namespace: 1, Hashes: []uint64{h}, Keys: []uint64{h}, Tier: radix.TierGPU}}
	}
	ctx := context.Background()
	// Nothing applies before Run: the queue (2) fills and the third Submit waits.
	for seq := range uint64(2) {
		if err := sink.Submit(ctx, StreamBatch{Stream: s, Seq: seq, Ops: op(seq + 1)}); err != nil {
			t.Fatal(err)
		}
	}
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	err = sink.Submit(short, StreamBatch{Stream: s, Seq: 2, Ops: op(3)})
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Submit on a full queue = %v, want to wait until its context ends", err)
	}
	if got := gatherSum(t, reg, "kvindex_ingest_queue_full_total", nil); got != 1 {
		t.Errorf("queue full = %v, want 1", got)
	}
	if got := gatherSum(t, reg, "kvindex_ingest_queue_depth", nil); got != 2 {
		t.Errorf("queue depth = %v, want 2", got)
	}

	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- sink.Run(runCtx) }()
	if err := sink.Submit(ctx, StreamBatch{Stream: s, Seq: 2, Ops: op(3), TS: float64(time.Now().UnixNano()) / 1e9}); err != nil {
		t.Fatal(err)
	}
	if err := sink.RemoveWorker(ctx, "w"); err != nil {
		t.Fatal(err)
	}
	if err := sink.Submit(ctx, StreamBatch{Stream: s, Seq: 0, Epoch: 0, Ops: op(9)}); err != nil {
		t.Fatal(err)
	}
	if err := sink.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	// In order: seqs 0..2, then the removal (cursor forgotten), then seq 0 anew.
	if c, ok := a.Cursor(s); !ok || c.Seq != 0 {
		t.Errorf("cursor = %+v %v, want seq 0 after the removal", c, ok)
	}
	if st := a.Index().Stats(); st.Residencies != 1 {
		t.Errorf("residencies = %d, want 1 (only the batch after the removal)", st.Residencies)
	}
	if got := gatherSum(t, reg, "kvindex_ingest_event_lag_seconds", nil); got != 1 {
		t.Errorf("event lag samples = %v, want 1 (one batch had a timestamp)", got)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := sink.Submit(ctx, StreamBatch{Stream: s, Seq: 5}); !errors.Is(err, ErrSinkStopped) {
		t.Errorf("Submit after Run = %v, want ErrSinkStopped", err)
	}
	if err := sink.Run(ctx); err == nil {
		t.Error("second Run accepted")
	}
}

func TestRateLimitedLogLogsOncePerIntervalAndCountsTheRest(t *testing.T) {
	var buf logbuf.Buffer
	l := newRateLimitedLog(slog.New(slog.NewTextHandler(&buf, nil)), time.Minute)
	now := time.Unix(1000, 0)
	l.now = func() time.Time { return now }
	for range 5 {
		l.Warn("a", "bad a")
	}
	l.Warn("b", "bad b")
	now = now.Add(time.Minute)
	l.Warn("a", "bad a")
	out := buf.String()
	if n := strings.Count(out, "bad a"); n != 2 {
		t.Errorf("%d lines for kind a, want 2:\n%s", n, out)
	}
	if !strings.Contains(out, "suppressed_since_last_log=4") {
		t.Errorf("the second line does not report the 4 suppressed:\n%s", out)
	}
	if n := strings.Count(out, "bad b"); n != 1 {
		t.Errorf("%d lines for kind b, want 1", n)
	}
}

// TestRateLimitedLogForgetsKindsOfPastIntervals: kinds name workers, so with
// worker churn the table must not keep every kind ever seen, and a kind seen
// again after it was forgotten logs at once, as a new one does.
func TestRateLimitedLogForgetsKindsOfPastIntervals(t *testing.T) {
	var buf logbuf.Buffer
	l := newRateLimitedLog(slog.New(slog.NewTextHandler(&buf, nil)), time.Minute)
	now := time.Unix(1000, 0)
	l.now = func() time.Time { return now }
	const churn = 10_000
	for i := range churn {
		if i%100 == 0 {
			now = now.Add(time.Minute) // a new interval every 100 workers
		}
		l.Warn(fmt.Sprintf("bad_seq/worker-%d", i), "bad seq")
	}
	if n := len(l.kinds); n > 1000 {
		t.Errorf("%d kinds kept after %d distinct ones, 100 per interval: the table grows with churn", n, churn)
	}
	if n := strings.Count(buf.String(), "bad seq"); n != churn {
		t.Errorf("%d lines for %d first occurrences, want one each", n, churn)
	}
	// Within one interval nothing is forgotten: a repeat is still suppressed.
	l.Warn(fmt.Sprintf("bad_seq/worker-%d", churn-1), "bad seq")
	if n := strings.Count(buf.String(), "bad seq"); n != churn {
		t.Errorf("a repeat within the interval was logged (%d lines)", n)
	}
}

// TestPlaceholdersAndOtherGroupsAreSkippedAndCounted: vLLM's offloading connector
// emits placeholder BlockStored events (no tokens, block_size 0); hybrid models
// publish every KV-cache group. Only full-attention groups reach the index, and
// nothing of this is a refusal that would be logged.
func TestPlaceholdersAndOtherGroupsAreSkippedAndCounted(t *testing.T) {
	stored := func(h uint64, group int64, hasGroup bool, kind string) wire.Event {
		return wire.Event{Kind: wire.BlockStored, BlockHashes: []uint64{h}, TokenIDs: []uint32{1, 2}, BlockSize: 2,
			GroupIdx: group, HasGroupIdx: hasGroup, KVCacheSpecKind: kind}
	}
	removed := func(h uint64, group int64, hasGroup bool) wire.Event {
		return wire.Event{Kind: wire.BlockRemoved, BlockHashes: []uint64{h}, GroupIdx: group, HasGroupIdx: hasGroup}
	}
	cases := []struct {
		name       string
		events     []wire.Event
		wantHashes []uint64 // hashes of the ops, in order
		want       opStats
	}{
		{"placeholder", []wire.Event{{Kind: wire.BlockStored, BlockHashes: []uint64{9}}}, nil, opStats{placeholders: 1}},
		{"no group info is indexed", []wire.Event{stored(1, 0, false, ""), removed(1, 0, false)}, []uint64{1, 1},
			opStats{stored: 1, storedBlocks: 1, removed: 1, removedBlocks: 1}},
		{"full attention in group 1, sliding window in group 0",
			[]wire.Event{stored(1, 0, true, "sliding_window"), stored(2, 1, true, "full_attention"), removed(3, 0, true), removed(4, 1, true)},
			[]uint64{2, 4}, opStats{stored: 1, storedBlocks: 1, removed: 1, removedBlocks: 1, otherGroups: 2}},
		{"mla and sink attention are full", []wire.Event{stored(1, 0, true, "mla_attention"), stored(2, 0, false, "sink_full_attention")},
			[]uint64{1, 2}, opStats{stored: 2, storedBlocks: 2}},
		{"mamba without a group", []wire.Event{stored(1, 0, false, "mamba")}, nil, opStats{otherGroups: 1}},
		{"unknown groups: only group 0", []wire.Event{stored(1, 0, true, ""), stored(2, 1, true, ""), removed(3, 1, true)},
			[]uint64{1}, opStats{stored: 1, storedBlocks: 1, otherGroups: 2}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ops, st := newOpBuilder("m", 2).build(c.events)
			var got []uint64
			for _, op := range ops {
				got = append(got, op.Hashes...)
			}
			if !slices.Equal(got, c.wantHashes) {
				t.Errorf("indexed hashes %v, want %v", got, c.wantHashes)
			}
			if st != c.want {
				t.Errorf("stats = %+v, want %+v", st, c.want)
			}
		})
	}
}
