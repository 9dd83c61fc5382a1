package router

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/bench/fakeengine"
)

// ledgerRig is a Ledger on a fake clock whose metric hooks keep running sums.
type ledgerRig struct {
	l       *Ledger
	clk     *fakeClock
	gauges  map[string]Load // sums of the onDelta hook per worker
	expired int
}

func newLedgerRig(ttl time.Duration) *ledgerRig {
	g := &ledgerRig{clk: newFakeClock(), gauges: map[string]Load{}}
	g.l = newLedger(ttl, g.clk.Now)
	g.l.onDelta = func(w string, in, pre, dec int) {
		l := g.gauges[w]
		l.InFlight += in
		l.PrefillTokens += pre
		l.DecodeBlocks += dec
		g.gauges[w] = l
	}
	g.l.onExpire = func() { g.expired++ }
	return g
}

func (g *ledgerRig) want(t *testing.T, tg Target, want Load, what string) {
	t.Helper()
	if got := g.l.Load(tg); got != want {
		t.Fatalf("%s: load %+v, want %+v", what, got, want)
	}
	if got := g.gauges[tg.Worker]; got != want {
		t.Fatalf("%s: metric hooks sum to %+v, want %+v", what, got, want)
	}
}

// Two requests sharing prompt blocks on one target: shared blocks are counted
// once in decode blocks and once in prefill; FirstByte releases only the prefill;
// Release is idempotent and returns the target to zero.
func TestLedgerReserveFirstByteReleaseArithmetic(t *testing.T) {
	g := newLedgerRig(time.Hour)
	tg := Target{Worker: "w"}
	// Keys 1-4 (block size 4), 18 prompt tokens (tail 2), block 1 cached,
	// 5 output tokens: prefill = 3 blocks·4 + 2 = 14 tokens; decode = 4 blocks +
	// ceil((2+5)/4) = 2 → 6.
	r1 := g.l.Reserve(tg, Demand{Keys: []uint64{1, 2, 3, 4}, Cached: 1, BlockSize: 4, PromptTokens: 18, OutputTokens: 5, Prefill: true})
	g.want(t, tg, Load{InFlight: 1, PrefillTokens: 14, DecodeBlocks: 6}, "after r1")
	if a, p := g.l.Shared(tg, []uint64{1, 2, 3, 4, 9}); a != 4 || p != 3 {
		t.Fatalf("Shared after r1 = (%d active, %d prefilling), want (4, 3)", a, p)
	}
	// Keys 1,2,3,5, nothing cached, 16 tokens (no tail), 4 output tokens: new
	// prefill blocks 1 and 5 (2, 3 already prefilling) → +8; new decode blocks 5
	// and ceil(4/4) = 1 → +2.
	r2 := g.l.Reserve(tg, Demand{Keys: []uint64{1, 2, 3, 5}, BlockSize: 4, PromptTokens: 16, OutputTokens: 4, Prefill: true})
	g.want(t, tg, Load{InFlight: 2, PrefillTokens: 22, DecodeBlocks: 8}, "after r2")

	// r1's first byte: its blocks 2, 3 stay prefilling for r2; block 4 and the
	// tail go: 22 - 4 - 2 = 16.
	r1.FirstByte()
	g.want(t, tg, Load{InFlight: 2, PrefillTokens: 16, DecodeBlocks: 8}, "after r1's first byte")
	r1.FirstByte()
	g.want(t, tg, Load{InFlight: 2, PrefillTokens: 16, DecodeBlocks: 8}, "after a second first byte")
	if a, p := g.l.Shared(tg, []uint64{1, 2, 3, 4, 5}); a != 5 || p != 4 {
		t.Fatalf("Shared after r1's first byte = (%d, %d), want (5, 4)", a, p)
	}

	// r1 ends: blocks 1-3 are still r2's, block 4 and r1's 2 extra blocks go.
	r1.Release()
	g.want(t, tg, Load{InFlight: 1, PrefillTokens: 16, DecodeBlocks: 5}, "after r1's release")
	r1.Release()
	r1.FirstByte()
	g.want(t, tg, Load{InFlight: 1, PrefillTokens: 16, DecodeBlocks: 5}, "after releasing r1 again")

	// r2 ends without a first byte (an error before any response): everything goes.
	r2.Release()
	g.want(t, tg, Load{}, "after r2's release")
	if n := len(g.l.Loads()); n != 0 {
		t.Fatalf("Loads has %d targets after every release, want 0", n)
	}
	if a, p := g.l.Shared(tg, []uint64{1, 2, 3, 4, 5}); a != 0 || p != 0 {
		t.Fatalf("Shared after every release = (%d, %d), want (0, 0)", a, p)
	}
}

// A decode leg (prefill done by another worker) holds no prefill tokens; loads of
// different targets (and ranks) are independent.
func TestLedgerDecodeLegAndTargetsAreIndependent(t *testing.T) {
	g := newLedgerRig(time.Hour)
	a0, a1, b := Target{Worker: "a"}, Target{Worker: "a", Rank: 1}, Target{Worker: "b"}
	rd := g.l.Reserve(a0, Demand{Keys: []uint64{1, 2}, BlockSize: 4, PromptTokens: 9, OutputTokens: 8, Prefill: false})
	if got := g.l.Load(a0); got != (Load{InFlight: 1, PrefillTokens: 0, DecodeBlocks: 2 + 3}) {
		t.Fatalf("decode leg load %+v, want {1 0 5}", got)
	}
	rp := g.l.Reserve(b, Demand{Keys: []uint64{1, 2}, BlockSize: 4, PromptTokens: 8, OutputTokens: 1, Prefill: true})
	if got := g.l.Load(b); got != (Load{InFlight: 1, PrefillTokens: 8, DecodeBlocks: 3}) {
		t.Fatalf("prefill leg load %+v, want {1 8 3}", got)
	}
	if got := g.l.Load(a1); got != (Load{}) {
		t.Fatalf("rank 1 of a has load %+v from rank 0's reservation", got)
	}
	if loads := g.l.Loads(); len(loads) != 2 || loads[a0].InFlight != 1 || loads[b].InFlight != 1 {
		t.Fatalf("Loads = %+v", loads)
	}
	rp.Release()
	if got := g.l.Load(a0); got.InFlight != 1 {
		t.Fatalf("releasing b's reservation changed a's load to %+v", got)
	}
	rd.Release()
	if len(g.l.Loads()) != 0 {
		t.Fatal("load left after every release")
	}
}

func TestLedgerSweepDropsReservationsOlderThanTheTTL(t *testing.T) {
	g := newLedgerRig(10 * time.Second)
	tg := Target{Worker: "w"}
	d := Demand{Keys: []uint64{1}, BlockSize: 4, PromptTokens: 4, OutputTokens: 4, Prefill: true}
	old := g.l.Reserve(tg, d)
	g.clk.Advance(6 * time.Second)
	young := g.l.Reserve(tg, Demand{Keys: []uint64{2}, BlockSize: 4, PromptTokens: 4, OutputTokens: 4, Prefill: true})
	g.clk.Advance(4 * time.Second) // old is exactly 10s old: not older than the TTL
	if n := g.l.Sweep(); n != 0 {
		t.Fatalf("Sweep at the TTL dropped %d, want 0", n)
	}
	g.clk.Advance(time.Second)
	if n := g.l.Sweep(); n != 1 || g.expired != 1 {
		t.Fatalf("Sweep dropped %d (expire hook %d), want 1", n, g.expired)
	}
	g.want(t, tg, Load{InFlight: 1, PrefillTokens: 4, DecodeBlocks: 2}, "after the sweep")
	old.Release() // the owner's late release must not take the young one's load
	g.want(t, tg, Load{InFlight: 1, PrefillTokens: 4, DecodeBlocks: 2}, "after the swept reservation's owner released it")
	if n := g.l.Sweep(); n != 0 {
		t.Fatalf("a second sweep dropped %d, want 0", n)
	}
	young.Release()
	g.want(t, tg, Load{}, "after every release")
}

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// Changed is closed when load goes down (first byte, release, sweep), not when
// it goes up.
func TestLedgerChangedClosesWhenLoadGoesDown(t *testing.T) {
	g := newLedgerRig(time.Second)
	tg := Target{Worker: "w"}
	ch := g.l.Changed()
	r := g.l.Reserve(tg, Demand{Keys: []uint64{1}, BlockSize: 4, PromptTokens: 4, OutputTokens: 1, Prefill: true})
	if closed(ch) {
		t.Fatal("Changed closed when load went up")
	}
	r.FirstByte()
	if !closed(ch) {
		t.Fatal("Changed not closed by a first byte")
	}
	ch = g.l.Changed()
	if closed(ch) {
		t.Fatal("the new Changed channel is already closed")
	}
	r.Release()
	if !closed(ch) {
		t.Fatal("Changed not closed by a release")
	}
	ch = g.l.Changed()
	g.l.Reserve(tg, Demand{BlockSize: 4, PromptTokens: 1, OutputTokens: 1, Prefill: true})
	g.clk.Advance(2 * time.Second)
	g.l.Sweep()
	if !closed(ch) {
		t.Fatal("Changed not closed by a sweep")
	}
}

// A data-parallel engine's ranks are separate targets end to end: while a
// request is in flight on one rank the next goes to the other (the router pins
// it with X-Data-Parallel-Rank and the engine serves it there), each rank's load
// is booked on its own, and a follow-up sharing a prompt's prefix goes to the
// rank that holds it.
func TestDataParallelRanksAreSeparateTargets(t *testing.T) {
	f := startFleet(t, 1, func(_ int, c *fakeengine.Config) { c.DataParallelSize = 2 })
	rt := startRouter(t, testConfig(t, f))
	rankOf := func(h http.Header) string { return h.Get(HeaderDPRank) }
	ask := func(prompt string) http.Header { // t.Error, not t.Fatal: also called aside
		resp, err := http.Post(rt.url+"/v1/completions", "application/json", strings.NewReader(completionBody(prompt, 2)))
		if err != nil {
			t.Error(err)
			return nil
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("status %d", resp.StatusCode)
		}
		return resp.Header
	}

	// A hangs on the engine; B is decided while A is reserved.
	if err := f.engines["w0"].SetFaults(fakeengine.Faults{FailStatus: 500, HangBeforeFirstToken: 3 * time.Second}); err != nil {
		t.Fatal(err)
	}
	a, b := words("rank-a", 60), words("rank-b", 60)
	headers := make(chan http.Header, 2)
	go func() { headers <- ask(a) }()
	waitFor(t, 10*time.Second, "A to be reserved", func() bool { return len(rt.ledger.Loads()) == 1 })
	go func() { headers <- ask(b) }()
	waitFor(t, 10*time.Second, "A and B to be reserved", func() bool {
		l := rt.ledger.Loads()
		return l[Target{Worker: "w0", Rank: 0}].InFlight == 1 && l[Target{Worker: "w0", Rank: 1}].InFlight == 1
	})
	h1, h2 := <-headers, <-headers
	if ranks := []string{rankOf(h1), rankOf(h2)}; !(ranks[0] == "0" && ranks[1] == "1" || ranks[0] == "1" && ranks[1] == "0") {
		t.Fatalf("the engine served A and B on ranks %q, want one on each", ranks)
	}
	rt.assertNoLoad(t, f.ids)

	// Follow-ups find their prefix's rank (the router's own recent decisions).
	if err := f.engines["w0"].SetFaults(fakeengine.Faults{FailStatus: 500}); err != nil {
		t.Fatal(err)
	}
	first := rankOf(ask(a + " first"))
	for i := range 6 { // a router blind to ranks would pass 6 coin flips once in 64
		if got := rankOf(ask(fmt.Sprintf("%s follow-up %d", a, i))); got != first {
			t.Fatalf("follow-up %d of A went to rank %q, A to rank %q", i, got, first)
		}
	}
	rt.assertNoLoad(t, f.ids)
}
