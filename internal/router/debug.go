package router

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
)

// candidateJSON is one candidate of a decision as /debug/route shows it.
type candidateJSON struct {
	Worker       string    `json:"worker"`
	DPRank       uint32    `json:"dp_rank"`
	Role         string    `json:"role"`
	Cost         float64   `json:"cost"`
	Overlap      int       `json:"overlap_blocks"`
	OverlapGPU   int       `json:"overlap_gpu_blocks"`
	OverlapCPU   int       `json:"overlap_cpu_blocks"`
	OverlapDisk  int       `json:"overlap_disk_blocks"`
	Source       Source    `json:"overlap_source"`
	InFlight     int       `json:"inflight"`
	Prefill      int       `json:"active_prefill_tokens"`
	Decode       int       `json:"active_decode_blocks"`
	SessionBound bool      `json:"session_bound,omitempty"`
	Terms        CostTerms `json:"terms"`
	// The engine's own gauges (--scrape-engine-metrics); absent when not scraped.
	EngineWaiting int     `json:"engine_waiting,omitempty"`
	EngineRunning int     `json:"engine_running,omitempty"`
	EngineKVUsage float64 `json:"engine_kv_usage,omitempty"`
	// From vllm:cache_config_info: with it the usage counts as blocks in the cost.
	EngineGPUBlocks int `json:"engine_gpu_blocks,omitempty"`
}

// decisionJSON is a decision as /debug/route answers it and the debug log prints
// it (a RouteDecision with every candidate's cost terms).
type decisionJSON struct {
	Worker            string          `json:"worker"`
	DPRank            uint32          `json:"dp_rank"`
	PrefillWorker     string          `json:"prefill_worker,omitempty"`
	PrefillDPRank     uint32          `json:"prefill_dp_rank,omitempty"`
	LocalPrefill      bool            `json:"local_prefill,omitempty"`
	Policy            string          `json:"policy"`
	Source            Source          `json:"source"`
	Reason            string          `json:"reason,omitempty"`
	Model             string          `json:"model"`
	PromptTokens      int             `json:"prompt_tokens"`
	PromptBlocks      int             `json:"prompt_blocks"`
	BlockSize         int             `json:"block_size"`
	KeySource         string          `json:"key_source,omitempty"`
	OverlapBlocks     int             `json:"overlap_blocks"`
	AvailableBlocks   int             `json:"available_overlap_blocks"`
	Cost              float64         `json:"cost"`
	IndexerAnswered   bool            `json:"indexer_answered"`
	Candidates        []candidateJSON `json:"candidates"`
	PrefillCandidates []candidateJSON `json:"prefill_candidates,omitempty"`
	Excluded          []Exclusion     `json:"excluded,omitempty"`
	// Wait: the dry run's request would not be decided on arrival but wait in
	// the admission queue; no worker is chosen then. Never set in the debug log.
	Wait *waitJSON `json:"wait,omitempty"`
}

// waitJSON is why the dry run's request would wait in the admission queue.
type waitJSON struct {
	Reason string `json:"reason"`
	// Ahead: requests of its candidate set already waiting; it would queue
	// behind them without deciding.
	Ahead int `json:"queued_ahead,omitempty"`
	// Held: the free workers it would leave to earlier waiters of other
	// candidate sets (the others are busy or full).
	Held []string `json:"held_for_earlier,omitempty"`
}

func candidatesJSON(cs []Candidate) []candidateJSON {
	out := make([]candidateJSON, len(cs))
	for i, c := range cs {
		out[i] = candidateJSON{Worker: c.Worker.ID, DPRank: c.Rank, Role: c.Worker.Role.String(), Cost: c.Cost,
			Overlap: c.Overlap.Blocks(), OverlapGPU: c.Overlap.GPU, OverlapCPU: c.Overlap.CPU, OverlapDisk: c.Overlap.Disk,
			Source: c.Overlap.Source, InFlight: c.inFlight(), Prefill: c.Load.PrefillTokens, Decode: c.Load.DecodeBlocks,
			SessionBound: c.SessionBound, Terms: c.Terms,
			EngineWaiting: c.Engine.Waiting, EngineRunning: c.Engine.Running, EngineKVUsage: c.Engine.KVUsage,
			EngineGPUBlocks: c.Engine.GPUBlocks}
	}
	return out
}

func (d *Decision) json(p *prepared) decisionJSON {
	j := decisionJSON{Worker: d.Target.Worker, DPRank: d.Target.Rank, LocalPrefill: d.LocalPrefill,
		Policy: d.Policy, Source: d.Source, Reason: d.Reason, Model: p.route.Model,
		PromptTokens: p.route.PromptTokens, PromptBlocks: len(p.route.LocalKeys), BlockSize: p.route.BlockSize,
		KeySource: p.route.KeySource, OverlapBlocks: d.Captured, AvailableBlocks: d.Available,
		IndexerAnswered: p.indexOK, Candidates: candidatesJSON(d.Candidates),
		PrefillCandidates: candidatesJSON(d.PrefillCandidates), Excluded: d.Excluded}
	if d.Prefill != nil {
		j.PrefillWorker, j.PrefillDPRank = d.Prefill.Worker, d.Prefill.Rank
		j.Cost = d.candidate(*d.Prefill).Cost
	} else {
		j.Cost = d.candidate(d.Target).Cost
	}
	return j
}

// decisionLog renders a decision lazily, only when the debug log is on.
type decisionLog struct {
	d *Decision
	p *prepared
}

func (l decisionLog) LogValue() slog.Value {
	b, _ := json.Marshal(l.d.json(l.p))
	return slog.StringValue(string(b))
}

// handleDebugRoute is the dry run: the decision a request would get, with every
// candidate's cost terms, without sending it or holding any load. It is decided
// as the admission queue decides a request on arrival (dryAdmit): workers left
// to earlier waiters are excluded ("queued"), and a request that would wait
// gets no worker but the reason (wait). The body is a /v1/chat/completions or
// /v1/completions body: "messages" selects chat.
func (r *Router) handleDebugRoute(w http.ResponseWriter, req *http.Request) {
	body, err := r.readBody(w, req)
	if err != nil {
		writeError(w, err)
		return
	}
	ep, path := endpointCompletions, "/v1/completions"
	var probe struct {
		Messages json.RawMessage `json:"messages"`
	}
	if json.Unmarshal(body, &probe) == nil && len(probe.Messages) > 0 {
		ep, path = endpointChat, "/v1/chat/completions"
	}
	if strings.HasSuffix(req.URL.Query().Get("endpoint"), "chat/completions") {
		ep, path = endpointChat, "/v1/chat/completions"
	}
	p, err := r.prepare(req.Header, path, ep, body)
	if err != nil {
		writeError(w, err)
		return
	}
	d, wait, err := r.dryAdmit(req.Context(), p)
	if err != nil {
		writeError(w, err)
		return
	}
	if wait != nil {
		d = &Decision{Policy: r.policy.Name()} // no worker, no candidates: the request would not be decided yet
	}
	j := d.json(p)
	j.Wait = wait
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(j)
}
