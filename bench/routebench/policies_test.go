package routebench

import (
	"testing"

	"github.com/kvindex/kvindex/internal/router"
)

func cands(loads, overlaps, waiting []int, usage []float64) []router.Candidate {
	out := make([]router.Candidate, len(loads))
	for i := range out {
		out[i] = router.Candidate{Worker: &router.Worker{ID: workerID(i)}, Load: router.Load{InFlight: loads[i]},
			Overlap: router.Overlap{GPU: overlaps[i]}}
		if waiting != nil {
			out[i].Engine = router.EngineLoad{Waiting: waiting[i], KVUsage: usage[i]}
		}
	}
	return out
}

func TestSGLangPick(t *testing.T) {
	req := &router.RouteRequest{PromptTokens: 160, BlockSize: 16} // 10 blocks
	first := func(int) int { return 1 }                           // ties keep the first
	cases := []struct {
		name            string
		loads, overlaps []int
		tree            []int
		want            int
	}{
		{"balanced, match above 30 %: best match", []int{5, 0, 0}, []int{4, 0, 2}, []int{0, 0, 0}, 0},
		{"balanced, match at 30 %: smallest tree", []int{0, 0, 0}, []int{3, 0, 0}, []int{10, 5, 7}, 1},
		{"imbalanced (abs > 64 and rel > 1.5): shortest queue", []int{100, 20, 30}, []int{10, 0, 0}, []int{0, 0, 0}, 1},
		{"abs gap 64 is not imbalanced", []int{84, 20, 30}, []int{10, 0, 0}, []int{0, 0, 0}, 0},
		{"rel below 1.5 is not imbalanced", []int{290, 200, 200}, []int{10, 0, 0}, []int{0, 0, 0}, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := sglangPick(req, cands(c.loads, c.overlaps, nil, nil), c.tree, first); got != c.want {
				t.Fatalf("picked %d, want %d", got, c.want)
			}
		})
	}
}

func TestLLMDPick(t *testing.T) {
	req := &router.RouteRequest{Keys: make([]uint64, 10), PromptTokens: 160, BlockSize: 16}
	first := func(int) int { return 1 }
	cases := []struct {
		name              string
		overlaps, waiting []int
		usage             []float64
		want              int
	}{
		// prefix 3·1 + queue 2·0 + kv 2·0.5 = 4 vs 0 + 2 + 2·0.5 = 3
		{"full prefix beats an empty queue", []int{10, 0}, []int{4, 0}, []float64{0.5, 0.5}, 0},
		// 3·0.3 + 0 + 2·0.5 = 1.9 vs 0 + 2 + 1 = 3
		{"short prefix loses to an idle worker", []int{3, 0}, []int{4, 0}, []float64{0.5, 0.5}, 1},
		{"equal but KV usage", []int{0, 0}, []int{1, 1}, []float64{0.9, 0.2}, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := llmdPick(req, cands([]int{0, 0}, c.overlaps, c.waiting, c.usage), first); got != c.want {
				t.Fatalf("picked %d, want %d", got, c.want)
			}
		})
	}
}
