package router

import (
	"testing"
	"time"
)

func TestChooseOverlap(t *testing.T) {
	ix := Overlap{GPU: 3, CPU: 1, Source: SourceIndex}
	cases := []struct {
		name              string
		indexed           Overlap
		ok                bool
		predicted, approx int
		want              Overlap
	}{
		{"index answered", ix, true, 0, 9, ix},
		{"index knows nothing of the target", Overlap{}, true, 0, 0, Overlap{Source: SourceIndex}},
		{"predicted longer than indexed", ix, true, 5, 0, Overlap{GPU: 5, Source: SourcePredicted}},
		{"predicted ties indexed", ix, true, 4, 0, Overlap{GPU: 4, Source: SourcePredicted}},
		{"predicted shorter", ix, true, 3, 0, ix},
		{"index down: approximate", Overlap{}, false, 0, 2, Overlap{GPU: 2, Source: SourceApproximate}},
		{"index down, nothing known", Overlap{}, false, 0, 0, Overlap{Source: SourceLoadOnly}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := ChooseOverlap(c.indexed, c.ok, c.predicted, c.approx); got != c.want {
				t.Fatalf("got %+v, want %+v", got, c.want)
			}
		})
	}
}

func TestExportedRecentDecisionsAndKeys(t *testing.T) {
	toks := make([]uint32, 40)
	for i := range toks {
		toks[i] = uint32(i)
	}
	local, keys := PromptKeys(toks, 16, "m", "", "")
	if len(local) != 2 || len(keys) != 2 || local[0] == keys[0] {
		t.Fatalf("local %v keys %v", local, keys)
	}
	_, other := PromptKeys(toks, 16, "m", "", "salt")
	if other[0] == keys[0] {
		t.Fatal("the salt is not in the chained keys")
	}
	now := time.Unix(100, 0)
	r := NewRecentDecisions(time.Second, time.Minute, 100)
	a, b := Target{Worker: "a"}, Target{Worker: "b"}
	r.Record(keys[:1], a, now)
	pred, approx := make([]int, 2), make([]int, 2)
	r.Match(keys, []Target{a, b}, now.Add(2*time.Second), pred, approx)
	if pred[0] != 0 || approx[0] != 1 || pred[1]+approx[1] != 0 {
		t.Fatalf("predicted %v approximate %v", pred, approx)
	}
	l := NewLedger(time.Minute, func() time.Time { return now })
	res := l.Reserve(a, Demand{Keys: keys, BlockSize: 16, PromptTokens: 40, OutputTokens: 10, Prefill: true})
	if act, pre := l.Shared(a, keys); act != 2 || pre != 2 {
		t.Fatalf("shared %d/%d", act, pre)
	}
	res.Release()
	if l.Load(a) != (Load{}) {
		t.Fatalf("load after release: %+v", l.Load(a))
	}
}
