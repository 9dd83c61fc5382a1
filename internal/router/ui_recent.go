package router

import (
	"sync/atomic"
	"time"

	"github.com/kvindex/kvindex/internal/console"
)

// uiRecentSize is how many recent decisions the console keeps.
const uiRecentSize = 64

// recentDecisions is a bounded ring of the router's last decisions, for the
// console. record adds one per routed attempt: a pointer to the decision and a
// copy of the request's routing fields (not its body), so recording costs no
// rendering; the JSON is built only when a console reads it. Safe for
// concurrent use (console.Series).
type recentDecisions struct {
	seq  atomic.Uint64
	ring *console.Series[recentDecision]
}

type recentDecision struct {
	seq uint64
	at  time.Time
	d   *Decision
	p   *prepared // routing fields only: route and indexOK
}

func newRecentDecisions(n int) *recentDecisions {
	return &recentDecisions{ring: console.NewSeries[recentDecision](n)}
}

// add records d, decided for p. Decisions are not modified once made.
func (rd *recentDecisions) add(d *Decision, p *prepared, at time.Time) {
	rd.ring.Add(recentDecision{seq: rd.seq.Add(1), at: at, d: d, p: &prepared{route: p.route, indexOK: p.indexOK}})
}

// uiDecision is a recorded decision as GET /ui/api/decisions/{seq} answers it:
// the /debug/route shape with its sequence number and time.
type uiDecision struct {
	Seq uint64 `json:"seq"`
	At  int64  `json:"at"` // unix milliseconds
	decisionJSON
}

// uiDecisionSummary is a recorded decision in the console's state: the
// decision without its candidates (GET /ui/api/decisions/{seq} has them).
type uiDecisionSummary struct {
	Seq             uint64  `json:"seq"`
	At              int64   `json:"at"`
	Policy          string  `json:"policy"`
	Source          Source  `json:"source"`
	Worker          string  `json:"worker"`
	DPRank          uint32  `json:"dp_rank"`
	PrefillWorker   string  `json:"prefill_worker,omitempty"`
	Model           string  `json:"model"`
	PromptBlocks    int     `json:"prompt_blocks"`
	OverlapBlocks   int     `json:"overlap_blocks"`
	AvailableBlocks int     `json:"available_overlap_blocks"`
	Cost            float64 `json:"cost"`
	Candidates      int     `json:"candidates"`
}

func (e recentDecision) json() uiDecision {
	return uiDecision{Seq: e.seq, At: e.at.UnixMilli(), decisionJSON: e.d.json(e.p)}
}

func (e recentDecision) summary() uiDecisionSummary {
	d := e.d
	s := uiDecisionSummary{Seq: e.seq, At: e.at.UnixMilli(), Policy: d.Policy, Source: d.Source, Worker: d.Target.Worker,
		DPRank: d.Target.Rank, Model: e.p.route.Model, PromptBlocks: len(e.p.route.LocalKeys), OverlapBlocks: d.Captured,
		AvailableBlocks: d.Available, Candidates: len(d.Candidates) + len(d.PrefillCandidates)}
	if d.Prefill != nil { // as decisionJSON: the cost is the prefill leg's
		s.PrefillWorker, s.Cost = d.Prefill.Worker, d.candidate(*d.Prefill).Cost
	} else {
		s.Cost = d.candidate(d.Target).Cost
	}
	return s
}

// find returns the recorded decision seq, if still kept.
func (rd *recentDecisions) find(seq uint64) (recentDecision, bool) {
	for _, e := range rd.ring.Values() {
		if e.seq == seq {
			return e, true
		}
	}
	return recentDecision{}, false
}
