package router

import (
	"fmt"
	"testing"
)

const ringKeys = 10000

func ringTargets(n int) []Target {
	ts := make([]Target, n)
	for i := range ts {
		ts[i] = Target{Worker: fmt.Sprintf("worker-%d", i)}
	}
	return ts
}

func all(Target) bool { return true }

// owners maps every test key to its owner on r.
func owners(t *testing.T, r *ring, ok func(Target) bool) []Target {
	t.Helper()
	out := make([]Target, ringKeys)
	for i := range out {
		o, found := r.lookup(fmt.Sprintf("session-%d", i), ok)
		if !found {
			t.Fatalf("key %d has no owner", i)
		}
		out[i] = o
	}
	return out
}

// With 160 virtual nodes every target owns its share of keys within ±25%.
func TestRingSpreadsKeysEvenly(t *testing.T) {
	for _, n := range []int{2, 3, 5, 8} {
		t.Run(fmt.Sprintf("targets=%d", n), func(t *testing.T) {
			per := map[Target]int{}
			for _, o := range owners(t, newRing(ringTargets(n), 160), all) {
				per[o]++
			}
			if len(per) != n {
				t.Fatalf("keys went to %d targets, want %d", len(per), n)
			}
			fair := float64(ringKeys) / float64(n)
			for tg, c := range per {
				if float64(c) < 0.75*fair || float64(c) > 1.25*fair {
					t.Errorf("%s owns %d keys, want %.0f ±25%%", tg.Worker, c, fair)
				}
			}
		})
	}
}

// A target joining N moves at most 2/N of the keys (about 1/(N+1) expected), and
// every moved key moves to the new target.
func TestRingJoinMovesFewKeysAndOnlyToTheNewTarget(t *testing.T) {
	for _, n := range []int{2, 4, 7} {
		t.Run(fmt.Sprintf("targets=%d", n), func(t *testing.T) {
			ts := ringTargets(n + 1)
			before := owners(t, newRing(ts[:n], 160), all)
			after := owners(t, newRing(ts, 160), all)
			moved := 0
			for i := range before {
				if before[i] != after[i] {
					moved++
					if after[i] != ts[n] {
						t.Fatalf("key %d moved from %s to %s, not to the new target", i, before[i].Worker, after[i].Worker)
					}
				}
			}
			if limit := 2 * ringKeys / n; moved > limit {
				t.Fatalf("%d of %d keys moved when 1 target joined %d, want at most %d", moved, ringKeys, n, limit)
			}
			if moved == 0 {
				t.Fatal("no key moved to the new target")
			}
		})
	}
}

// Removing a target moves exactly its keys; the others stay put.
func TestRingLeaveMovesOnlyTheRemovedTargetsKeys(t *testing.T) {
	ts := ringTargets(5)
	before := owners(t, newRing(ts, 160), all)
	gone := ts[2]
	after := owners(t, newRing(append(append([]Target{}, ts[:2]...), ts[3:]...), 160), all)
	for i := range before {
		switch {
		case before[i] == gone && after[i] == gone:
			t.Fatalf("key %d still maps to the removed target", i)
		case before[i] != gone && after[i] != before[i]:
			t.Fatalf("key %d moved from %s to %s though its owner stayed", i, before[i].Worker, after[i].Worker)
		}
	}
}

// Excluding a target at lookup sends its keys to their next owner (the owner a
// ring without it would give) and leaves every other key put.
func TestRingLookupWithExclusionSkipsToTheNextOwner(t *testing.T) {
	ts := ringTargets(4)
	full := newRing(ts, 160)
	without := newRing([]Target{ts[0], ts[2], ts[3]}, 160)
	base := owners(t, full, all)
	excl := owners(t, full, func(t Target) bool { return t != ts[1] })
	ref := owners(t, without, all)
	movedKeys := 0
	for i := range base {
		if excl[i] == ts[1] {
			t.Fatalf("key %d went to the excluded target", i)
		}
		if base[i] != ts[1] && excl[i] != base[i] {
			t.Fatalf("key %d moved from %s to %s though its owner was not excluded", i, base[i].Worker, excl[i].Worker)
		}
		if excl[i] != ref[i] {
			t.Fatalf("key %d: excluded lookup gives %s, a ring without the target gives %s", i, excl[i].Worker, ref[i].Worker)
		}
		if base[i] == ts[1] {
			movedKeys++
		}
	}
	if movedKeys == 0 {
		t.Fatal("the excluded target owned no key: the test proves nothing")
	}
	if _, ok := full.lookup("k", func(Target) bool { return false }); ok {
		t.Fatal("a lookup excluding every target found an owner")
	}
	if _, ok := newRing(nil, 160).lookup("k", all); ok {
		t.Fatal("an empty ring found an owner")
	}
}

// Data-parallel ranks of one worker are distinct targets on the ring.
func TestRingTreatsRanksAsTargets(t *testing.T) {
	ts := []Target{{Worker: "a", Rank: 0}, {Worker: "a", Rank: 1}, {Worker: "b", Rank: 0}}
	per := map[Target]int{}
	for _, o := range owners(t, newRing(ts, 160), all) {
		per[o]++
	}
	for _, tg := range ts {
		if per[tg] < ringKeys/6 {
			t.Errorf("%v owns %d keys, want about a third", tg, per[tg])
		}
	}
}

// The ring cache rebuilds only when the fleet version changes.
func TestRingCacheRebuildsOnANewFleetVersion(t *testing.T) {
	c := newRingCache(16)
	builds := 0
	targets := func() []Target { builds++; return ringTargets(3) }
	r1 := c.get("pool", 1, targets)
	r2 := c.get("pool", 1, targets)
	r3 := c.get("pool", 2, targets)
	if r1 != r2 || r3 == r1 || builds != 2 {
		t.Fatalf("same version rebuilt or new version reused (builds=%d, want 2)", builds)
	}
	if len(r1.points) != 3*16 {
		t.Fatalf("ring has %d points, want %d", len(r1.points), 3*16)
	}
}
