package router

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

var (
	ovA = Target{Worker: "a"}
	ovB = Target{Worker: "b"}
	ovC = Target{Worker: "c"}
	ovD = Target{Worker: "a", Rank: 1}
)

func match(o *overlay, keys []uint64, now time.Time, targets ...Target) []int {
	out := make([]int, len(targets))
	o.Match(keys, targets, now, out, nil)
	return out
}

// A target's match is the run of leading keys it holds: a later key it holds
// after a gap does not count.
func TestOverlayMatchCountsLeadingBlocksPerTarget(t *testing.T) {
	now := newFakeClock().Now()
	o := newOverlay(5*time.Second, 5*time.Second, 1000)
	o.Record([]uint64{1, 2, 3}, ovA, now)
	o.Record([]uint64{1, 2}, ovB, now)
	o.Record([]uint64{2, 3, 4}, ovC, now) // not the prompt's first block
	o.Record([]uint64{1}, ovD, now)       // another rank of worker a
	got := match(o, []uint64{1, 2, 3, 4}, now, ovA, ovB, ovC, ovD)
	if fmt.Sprint(got) != "[3 2 0 1]" {
		t.Fatalf("matches = %v, want [3 2 0 1]", got)
	}
	if got := match(o, []uint64{9, 1, 2}, now, ovA, ovB); fmt.Sprint(got) != "[0 0]" {
		t.Fatalf("a prompt whose first block nobody holds matched %v", got)
	}
	// The output is reset: stale values in out do not leak into a new match.
	out := []int{7, 7}
	o.Match([]uint64{5}, []Target{ovA, ovB}, now, out, nil)
	if fmt.Sprint(out) != "[0 0]" {
		t.Fatalf("out = %v after matching an unknown key, want zeros", out)
	}
}

func TestOverlayMarksExpireAfterTheTTL(t *testing.T) {
	clk := newFakeClock()
	o := newOverlay(5*time.Second, 5*time.Second, 1000)
	o.Record([]uint64{1, 2}, ovA, clk.Now())
	clk.Advance(2 * time.Second)
	o.Record([]uint64{1}, ovB, clk.Now())
	clk.Advance(3*time.Second - time.Nanosecond)
	if got := match(o, []uint64{1, 2}, clk.Now(), ovA, ovB); fmt.Sprint(got) != "[2 1]" {
		t.Fatalf("just before a's TTL: %v, want [2 1]", got)
	}
	clk.Advance(time.Nanosecond)
	if got := match(o, []uint64{1, 2}, clk.Now(), ovA, ovB); fmt.Sprint(got) != "[0 1]" {
		t.Fatalf("at a's TTL: %v, want [0 1]", got)
	}
	if n := o.Len(); n != 1 {
		t.Fatalf("Len = %d after a's marks expired, want 1", n)
	}
	clk.Advance(2 * time.Second)
	if got := match(o, []uint64{1}, clk.Now(), ovB); got[0] != 0 || o.Len() != 0 {
		t.Fatalf("after every TTL: match %v, Len %d, want 0 and 0", got, o.Len())
	}
}

func TestOverlayBoundDropsTheOldestMarksFirst(t *testing.T) {
	clk := newFakeClock()
	o := newOverlay(time.Hour, time.Hour, 4)
	o.Record([]uint64{1, 2}, ovA, clk.Now())
	clk.Advance(time.Second)
	o.Record([]uint64{3, 4}, ovB, clk.Now())
	clk.Advance(time.Second)
	o.Record([]uint64{5}, ovC, clk.Now()) // drops (1, a)
	if n := o.Len(); n != 4 {
		t.Fatalf("Len = %d, want the bound 4", n)
	}
	now := clk.Now()
	if got := match(o, []uint64{1, 2}, now, ovA); got[0] != 0 {
		t.Fatalf("the oldest mark (1, a) survived the bound: match %v", got)
	}
	if got := match(o, []uint64{3, 4}, now, ovB); got[0] != 2 {
		t.Fatalf("(3, 4) on b: match %v, want 2", got)
	}
	if got := match(o, []uint64{5}, now, ovC); got[0] != 1 {
		t.Fatalf("the newest mark (5, c): match %v, want 1", got)
	}
	// Keep adding: the bound holds and the newest always survive.
	for k := uint64(10); k < 1000; k++ {
		clk.Advance(time.Millisecond)
		o.Record([]uint64{k}, ovA, clk.Now())
	}
	if n := o.Len(); n != 4 {
		t.Fatalf("Len = %d after many records, want 4", n)
	}
	now = clk.Now()
	for k := uint64(996); k < 1000; k++ {
		if got := match(o, []uint64{k}, now, ovA); got[0] != 1 {
			t.Fatalf("recent key %d lost", k)
		}
	}
	if got := match(o, []uint64{995}, now, ovA); got[0] != 0 {
		t.Fatal("key 995 is beyond the bound but still matches")
	}
}

// A mark renewed by a later Record survives when its first fifo entry is dropped
// (by the bound or by its old expiry).
func TestOverlayRenewedMarkSurvivesItsOldEntry(t *testing.T) {
	clk := newFakeClock()
	o := newOverlay(5*time.Second, 5*time.Second, 3)
	o.Record([]uint64{1}, ovA, clk.Now()) // entry 1 (old expiry)
	clk.Advance(time.Second)
	o.Record([]uint64{2}, ovA, clk.Now())
	clk.Advance(time.Second)
	o.Record([]uint64{1}, ovA, clk.Now()) // renews (1, a)
	clk.Advance(time.Second)
	o.Record([]uint64{3}, ovA, clk.Now()) // the bound drops entry 1
	if got := match(o, []uint64{1}, clk.Now(), ovA); got[0] != 1 {
		t.Fatal("the renewed mark (1, a) was dropped with its old entry")
	}
	if got := match(o, []uint64{2}, clk.Now(), ovA); got[0] != 1 {
		t.Fatal("(2, a) was dropped though it is not the oldest entry")
	}

	// Expiry: renewed at +2s, the mark lives until +7s, past its first expiry (+5s).
	clk2 := newFakeClock()
	o2 := newOverlay(5*time.Second, 5*time.Second, 100)
	o2.Record([]uint64{1}, ovA, clk2.Now())
	clk2.Advance(2 * time.Second)
	o2.Record([]uint64{1}, ovA, clk2.Now())
	clk2.Advance(4 * time.Second) // +6s
	if got := match(o2, []uint64{1}, clk2.Now(), ovA); got[0] != 1 {
		t.Fatal("a renewed mark expired at its first expiry")
	}
	clk2.Advance(time.Second) // +7s
	if got := match(o2, []uint64{1}, clk2.Now(), ovA); got[0] != 0 {
		t.Fatal("a renewed mark outlived its renewed expiry")
	}
}

// One store, two horizons: a mark counts in the short horizon (the predicted
// overlay) for its first seconds and in the long one (the approximate index)
// until the long TTL; only the long TTL removes it.
func TestOverlayShortAndLongHorizons(t *testing.T) {
	clk := newFakeClock()
	o := newOverlay(time.Second, 10*time.Second, 1000)
	o.Record([]uint64{1, 2, 3}, ovA, clk.Now())
	o.Record([]uint64{1}, ovB, clk.Now())
	both := func() (string, string) {
		short, long := make([]int, 2), make([]int, 2)
		o.Match([]uint64{1, 2, 3}, []Target{ovA, ovB}, clk.Now(), short, long)
		return fmt.Sprint(short), fmt.Sprint(long)
	}
	if s, l := both(); s != "[3 1]" || l != "[3 1]" {
		t.Fatalf("at once: short %s long %s, want [3 1] and [3 1]", s, l)
	}
	clk.Advance(time.Second)
	if s, l := both(); s != "[0 0]" || l != "[3 1]" {
		t.Fatalf("after the short TTL: short %s long %s, want [0 0] and [3 1]", s, l)
	}
	if o.Len() != 4 {
		t.Fatalf("Len = %d after the short TTL, want 4 (the long horizon keeps them)", o.Len())
	}
	o.Record([]uint64{1, 2}, ovB, clk.Now()) // renews (1, b) in both horizons
	clk.Advance(9 * time.Second)
	if s, l := both(); s != "[0 0]" || l != "[0 2]" {
		t.Fatalf("after a's long TTL: short %s long %s, want [0 0] and [0 2]", s, l)
	}
	clk.Advance(time.Second)
	if s, l := both(); s != "[0 0]" || l != "[0 0]" || o.Len() != 0 {
		t.Fatalf("after every long TTL: short %s long %s Len %d, want zeros", s, l, o.Len())
	}
}

// Another router's decision is predicted for the TTL it came with (0: not at
// all; at most the long horizon), keeps this overlay's long horizon, and never
// cuts a longer prediction of the same target short.
func TestOverlayRecordForTakesTheSendersTTL(t *testing.T) {
	clk := newFakeClock()
	o := newOverlay(2*time.Second, 10*time.Second, 1000)
	o.RecordFor([]uint64{1, 2}, ovA, clk.Now(), 500*time.Millisecond)
	o.RecordFor([]uint64{1, 2}, ovB, clk.Now(), time.Minute) // beyond the long horizon
	o.Record([]uint64{1, 2}, ovC, clk.Now())
	o.RecordFor([]uint64{1, 2}, ovC, clk.Now(), 0) // does not cut c's own 2 s short
	o.RecordFor([]uint64{1, 2}, ovD, clk.Now(), 0)
	all := func() (string, string) {
		short, long := make([]int, 4), make([]int, 4)
		o.Match([]uint64{1, 2}, []Target{ovA, ovB, ovC, ovD}, clk.Now(), short, long)
		return fmt.Sprint(short), fmt.Sprint(long)
	}
	var at time.Duration
	for _, step := range []struct {
		advance     time.Duration
		short, long string
	}{
		{0, "[2 2 2 0]", "[2 2 2 2]"},
		{500 * time.Millisecond, "[0 2 2 0]", "[2 2 2 2]"},
		{1500 * time.Millisecond, "[0 2 0 0]", "[2 2 2 2]"},
		{8*time.Second - time.Nanosecond, "[0 2 0 0]", "[2 2 2 2]"},
		{time.Nanosecond, "[0 0 0 0]", "[0 0 0 0]"},
	} {
		clk.Advance(step.advance)
		at += step.advance
		if s, l := all(); s != step.short || l != step.long {
			t.Fatalf("at +%v: short %s long %s, want %s and %s", at, s, l, step.short, step.long)
		}
	}
}

// TestOverlayMatchEqualsTheDefinition: on random histories (many targets, keys
// shared by more targets than the lookup switches to a table for, records at
// different times so both horizons cut), Match gives every target the length of
// the run of leading keys it holds within each horizon, computed from the marks
// directly.
func TestOverlayMatchEqualsTheDefinition(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	clock := newFakeClock()
	o := newOverlay(2*time.Second, 6*time.Second, 1<<20)
	var targets []Target
	for i := range 60 {
		targets = append(targets, Target{Worker: fmt.Sprintf("w%02d", i%30), Rank: uint32(i / 30)})
	}
	prompt := make([]uint64, 40)
	for i := range prompt {
		prompt[i] = uint64(1000 + i)
	}
	for range 400 {
		n := 1 + rng.IntN(len(prompt))
		keys := slices.Clone(prompt[:n])
		if rng.IntN(4) == 0 {
			keys[rng.IntN(n)] = rng.Uint64() // a prompt that diverges somewhere
		}
		o.Record(keys, targets[rng.IntN(len(targets))], clock.Now())
		clock.Advance(time.Duration(rng.IntN(40)) * time.Millisecond)
	}
	now := clock.Now()
	want := func(tg Target, horizon func(mark) int64) int {
		id, ok := o.ids[tg]
		if !ok {
			return 0
		}
		n := 0
		for _, k := range prompt {
			held := false
			for _, m := range o.m[k] {
				held = held || (m.t == id && horizon(m) > now.UnixNano())
			}
			if !held {
				break
			}
			n++
		}
		return n
	}
	short, long := make([]int, len(targets)), make([]int, len(targets))
	o.Match(prompt, targets, now, short, long)
	nonzero := 0
	for i, tg := range targets {
		ws, wl := want(tg, func(m mark) int64 { return m.short }), want(tg, func(m mark) int64 { return m.long })
		if short[i] != ws || long[i] != wl {
			t.Errorf("%v: short %d long %d, want %d and %d", tg, short[i], long[i], ws, wl)
		}
		if wl > 0 {
			nonzero++
		}
	}
	if nonzero < 10 || short[0] == long[0] && slices.Equal(short, long) {
		t.Fatalf("the history does not exercise the match (%d targets matched, short = long: %v)", nonzero, slices.Equal(short, long))
	}
}
