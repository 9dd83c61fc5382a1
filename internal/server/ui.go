package server

import (
	"context"
	"fmt"
	"net/http"
	"runtime/metrics"
	"slices"
	"sync"
	"time"

	kvindexv1 "github.com/kvindex/kvindex/api/proto/kvindex/v1"
	"github.com/kvindex/kvindex/internal/console"
	"github.com/kvindex/kvindex/internal/kvblock"
	"github.com/kvindex/kvindex/internal/radix"
	"github.com/kvindex/kvindex/internal/tokenize"
)

// The indexer's web console (docs/console.md):
//
//	GET  /ui                 the page (embedded, internal/console)
//	GET  /ui/assets/{file}   its CSS and JavaScript
//	GET  /ui/api/state       the state the page shows, JSON (uiState)
//	GET  /ui/api/events      the same state as Server-Sent Events ("state"), sent when it changes
//	POST /ui/api/try         "try a prompt": the hit-rate scoring with per-tier blocks and the block path
//
// All of them are public, like GET /workers and POST /kv-cache/hit-rate; the
// page's admin actions (unregister) call the admin endpoints with the token
// the operator typed. The state is built from this node's own state, once per
// uiInterval while someone watches (console.Hub), whatever the number of pages.

// uiInterval is how often the console's state is rebuilt while a page watches.
var uiInterval = time.Second

// uiMaxPath bounds the blocks of the block path the try panel returns.
const uiMaxPath = 1024

// uiState is GET /ui/api/state and the data of every "state" event.
type uiState struct {
	NodeID   string         `json:"node_id"`
	Cluster  uiCluster      `json:"cluster"`
	Timeline []uiLeadership `json:"timeline"`
	Index    uiIndex        `json:"index"`
	Workers  []uiWorker     `json:"workers"`
	Models   []string       `json:"models"`
	Admin    bool           `json:"admin_token_required"`
}

type uiCluster struct {
	Leader       string     `json:"leader"`
	Term         uint64     `json:"term"`
	CommitIndex  uint64     `json:"commit_index"`
	AppliedIndex uint64     `json:"applied_index"`
	Members      []uiMember `json:"members"`
}

type uiMember struct {
	ID           string `json:"id"`
	RaftAddr     string `json:"raft_addr"`
	Suffrage     string `json:"suffrage"`
	IsLeader     bool   `json:"is_leader"`
	AppliedIndex uint64 `json:"applied_index"`
	// Lag is the commit index minus the member's applied index (0 when unknown).
	Lag uint64 `json:"lag"`
}

// uiLeadership is one entry of the leadership timeline: from At on (unix
// milliseconds, when this node first saw it), Leader led in Term.
type uiLeadership struct {
	At     int64  `json:"at"`
	Term   uint64 `json:"term"`
	Leader string `json:"leader"`
}

type uiIndex struct {
	Nodes        int               `json:"nodes"`
	Residencies  int               `json:"residencies"`
	Holders      int               `json:"holders"`
	Namespaces   int               `json:"namespaces"`
	Detached     int               `json:"detached_blocks"`
	HeapBytes    uint64            `json:"heap_bytes"`
	AppliedIndex uint64            `json:"applied_index"`
	Counters     map[string]uint64 `json:"counters"`
}

type uiWorker struct {
	ID         string `json:"id"`
	Model      string `json:"model"`
	Role       string `json:"role"`
	BlockSize  uint32 `json:"block_size"`
	DPSize     uint32 `json:"dp_size"`
	State      string `json:"state"`
	GPUBlocks  uint64 `json:"gpu_blocks"`
	CPUBlocks  uint64 `json:"cpu_blocks"`
	DiskBlocks uint64 `json:"disk_blocks"`
	// LastSeq is the highest applied sequence number over the worker's ranks.
	LastSeq uint64 `json:"last_seq"`
	// EventRate is applied batches per second over the last few seconds (this
	// node's ingest; 0 on followers).
	EventRate  float64 `json:"event_rate"`
	Gaps       uint64  `json:"gaps"`
	Replayed   uint64  `json:"replayed"`
	Resets     uint64  `json:"resets"`
	Restarts   uint64  `json:"restarts"`
	LagSeconds float64 `json:"lag_seconds"`
}

// uiConsole is the console's state that outlives one snapshot: the
// leadership timeline and the samples the event rates are computed from.
type uiConsole struct {
	a        *API
	hub      *console.Hub
	timeline *console.Series[uiLeadership]

	mu    sync.Mutex            // also makes noteLeader's check-and-add one step
	rates map[string]rateSample // by worker; guarded by mu
}

type rateSample struct {
	at      time.Time
	applied uint64
	rate    float64
}

func (a *API) newUIConsole() *uiConsole {
	c := &uiConsole{a: a, timeline: console.NewSeries[uiLeadership](64), rates: map[string]rateSample{}}
	c.hub = console.NewHub(console.HubConfig{Interval: uiInterval, Log: a.log,
		Snapshot: func(ctx context.Context) (any, error) { return c.state(ctx) }})
	return c
}

// uiRoutes are the console's routes (see routes).
func (a *API) uiRoutes() []route {
	c := a.ui
	assets := console.AssetHandler("/ui/assets/")
	return []route{
		{"GET /ui", accessPublic, func(w http.ResponseWriter, _ *http.Request) error {
			console.ServePage(w, "indexer.html")
			return nil
		}},
		{"GET /ui/assets/{file}", accessPublic, func(w http.ResponseWriter, r *http.Request) error {
			assets.ServeHTTP(w, r)
			return nil
		}},
		{"GET /ui/api/state", accessPublic, func(w http.ResponseWriter, r *http.Request) error {
			st, err := c.state(r.Context())
			if err != nil {
				return err
			}
			writeJSON(w, http.StatusOK, st)
			return nil
		}},
		{"GET /ui/api/events", accessPublic, func(w http.ResponseWriter, r *http.Request) error {
			c.hub.ServeHTTP(w, r)
			return nil
		}},
		{"POST /ui/api/try", accessPublic, a.handleUITry},
	}
}

// noteLeader adds the leader of term to the timeline unless it is the last
// entry already.
func (c *uiConsole) noteLeader(term uint64, leader string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if last, ok := c.timeline.Last(); !ok || last.Term != term || last.Leader != leader {
		c.timeline.Add(uiLeadership{At: time.Now().UnixMilli(), Term: term, Leader: leader})
	}
}

// followLeadership notes this node's view of the leader and term in the
// console's timeline every uiInterval from start, so the timeline shows the
// elections that happened while no page was open (an operator opens the
// console after the incident). Reading raft's configuration once a second is
// all it costs; a leadership shorter than that shows only if a page read it.
func (s *Server) followLeadership(ctx context.Context) {
	t := time.NewTicker(uiInterval)
	defer t.Stop()
	for {
		if st, err := s.node.Cluster(); err == nil {
			s.api.ui.noteLeader(st.Term, st.LeaderID)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// state builds the console's state from this node's backend.
func (c *uiConsole) state(ctx context.Context) (*uiState, error) {
	a := c.a
	cs, err := a.backend.Cluster(ctx, false)
	if err != nil {
		return nil, err
	}
	st := &uiState{NodeID: cs.NodeID, Admin: a.adminToken != "", Models: []string{}, Workers: []uiWorker{},
		Cluster: uiCluster{Leader: cs.LeaderID, Term: cs.Term, CommitIndex: cs.CommitIndex, AppliedIndex: cs.AppliedIndex, Members: []uiMember{}}}
	for _, m := range cs.Members {
		um := uiMember{ID: m.ID, RaftAddr: m.RaftAddr, Suffrage: "voter", IsLeader: m.IsLeader, AppliedIndex: m.AppliedIndex}
		if !m.Voter {
			um.Suffrage = "nonvoter"
		}
		if m.AppliedIndex > 0 && cs.CommitIndex > m.AppliedIndex {
			um.Lag = cs.CommitIndex - m.AppliedIndex
		}
		st.Cluster.Members = append(st.Cluster.Members, um)
	}
	c.noteLeader(cs.Term, cs.LeaderID)
	st.Timeline = c.timeline.Values()

	ix := a.backend.Index().Stats()
	st.Index = uiIndex{Nodes: ix.Nodes, Residencies: ix.Residencies, Holders: ix.Workers, Namespaces: ix.Namespaces,
		Detached: ix.Detached, HeapBytes: heapBytes(), AppliedIndex: a.backend.AppliedIndex(), Counters: indexCounters(ix)}

	resp, err := a.workers(ctx, "", false)
	if err != nil {
		return nil, err
	}
	list, err := a.backend.Workers(ctx)
	if err != nil {
		return nil, err
	}
	streams := map[string]WorkerStatus{}
	for _, ws := range list {
		streams[ws.Spec.ID] = ws
	}
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	seen := map[string]bool{}
	for _, info := range resp.GetWorkers() {
		spec := info.GetSpec()
		uw := uiWorker{ID: spec.GetId(), Model: spec.GetModel(), Role: roleJSON(spec.GetRole()), BlockSize: spec.GetBlockSize(),
			DPSize: spec.GetDpSize(), State: stateJSON(info.GetState()),
			GPUBlocks: info.GetGpuBlocks(), CPUBlocks: info.GetCpuBlocks(), DiskBlocks: info.GetDiskBlocks()}
		for _, r := range info.GetDpRanks() {
			uw.LastSeq = max(uw.LastSeq, r.GetLastSeq())
		}
		var applied uint64
		for _, s := range streams[uw.ID].Streams {
			applied += s.Stats.Applied
			uw.Gaps += s.Stats.Gaps
			uw.Replayed += s.Stats.Replayed
			uw.Resets += s.Stats.Resets
			uw.Restarts += s.Stats.Restarts
			uw.LagSeconds = max(uw.LagSeconds, s.LagSeconds)
		}
		uw.EventRate = c.rate(uw.ID, applied, now)
		seen[uw.ID] = true
		st.Workers = append(st.Workers, uw)
		if !slices.Contains(st.Models, uw.Model) {
			st.Models = append(st.Models, uw.Model)
		}
	}
	for id := range c.rates {
		if !seen[id] {
			delete(c.rates, id)
		}
	}
	slices.Sort(st.Models)
	return st, nil
}

// rate is a worker's applied batches per second, measured over at least two
// seconds so that extra snapshots (GET state) do not make it jump. c.mu is held.
func (c *uiConsole) rate(id string, applied uint64, now time.Time) float64 {
	prev, ok := c.rates[id]
	switch {
	case !ok || applied < prev.applied:
		c.rates[id] = rateSample{at: now, applied: applied}
		return 0
	case now.Sub(prev.at) < 2*time.Second:
		return prev.rate
	}
	r := float64(applied-prev.applied) / now.Sub(prev.at).Seconds()
	c.rates[id] = rateSample{at: now, applied: applied, rate: r}
	return r
}

func heapBytes() uint64 {
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return s[0].Value.Uint64()
}

func roleJSON(r kvindexv1.WorkerRole) string {
	for name, v := range workerRoles {
		if v == r && name != "" {
			return name
		}
	}
	return ""
}

func stateJSON(s kvindexv1.WorkerState) string {
	switch s {
	case kvindexv1.WorkerState_WORKER_STATE_CONNECTING:
		return "connecting"
	case kvindexv1.WorkerState_WORKER_STATE_LIVE:
		return "live"
	case kvindexv1.WorkerState_WORKER_STATE_REPLAYING:
		return "replaying"
	case kvindexv1.WorkerState_WORKER_STATE_DEAD:
		return "dead"
	}
	return "unknown"
}

// uiTryResponse is POST /ui/api/try: hit-rate's answer with each worker's
// blocks per tier, and the block path.
type uiTryResponse struct {
	Model        string        `json:"model"`
	BlockSize    int           `json:"block_size"`
	TotalBlocks  int           `json:"total_blocks"`
	PromptTokens int           `json:"prompt_tokens"`
	AppliedIndex uint64        `json:"applied_index"`
	Workers      []uiTryWorker `json:"workers"`
	// Path is the prompt's chain of blocks (the first uiMaxPath), each with the
	// number of candidate workers holding it; Truncated says blocks were left off.
	Path      []uiPathBlock `json:"path"`
	Truncated bool          `json:"truncated"`
}

type uiTryWorker struct {
	Worker        string  `json:"worker"`
	MatchedBlocks int     `json:"matched_blocks"`
	GPUBlocks     int     `json:"gpu_blocks"`
	CPUBlocks     int     `json:"cpu_blocks"`
	DiskBlocks    int     `json:"disk_blocks"`
	HitRate       float64 `json:"hit_rate"`
	GPUHitRate    float64 `json:"gpu_hit_rate"`
	CPUHitRate    float64 `json:"cpu_hit_rate"`
	DiskHitRate   float64 `json:"disk_hit_rate"`
}

type uiPathBlock struct {
	Block   int    `json:"block"`
	Key     string `json:"key"` // the block's local hash, hex
	Holders int    `json:"holders"`
}

// handleUITry scores a prompt exactly as POST /kv-cache/hit-rate does (same
// body) and adds the tiers' block counts and the block path.
func (a *API) handleUITry(w http.ResponseWriter, r *http.Request) error {
	var req hitRateRequest
	if err := decodeJSON(r, &req); err != nil {
		return err
	}
	q := &scoreQuery{
		model: req.Model, lora: req.LoraName, salt: req.CacheSalt,
		tokens: req.TokenIDs, hasTokens: req.TokenIDs != nil, text: req.Prompt, messages: req.Messages,
		chat: tokenize.ChatOptions{
			AddGenerationPrompt: req.AddGenerationPrompt == nil || *req.AddGenerationPrompt,
			Tools:               req.Tools, Kwargs: req.ChatTemplateKwargs,
		},
		workers: req.Pods,
	}
	if err := setBlockSize(q, req.BlockSize); err != nil {
		return err
	}
	res, err := a.score(r.Context(), q)
	if err != nil {
		return err
	}
	out := uiTryResponse{Model: res.model, BlockSize: res.blockSize, TotalBlocks: res.totalBlocks,
		PromptTokens: res.promptTokens, AppliedIndex: res.applied, Workers: make([]uiTryWorker, len(res.workers)), Path: []uiPathBlock{}}
	for i, wr := range res.workers {
		out.Workers[i] = uiTryWorker{Worker: wr.id, MatchedBlocks: wr.blocks,
			GPUBlocks: wr.perTier[radix.TierGPU], CPUBlocks: wr.perTier[radix.TierCPU], DiskBlocks: wr.perTier[radix.TierDisk],
			HitRate:     hitRate(wr.blocks, res.totalBlocks),
			GPUHitRate:  hitRate(wr.perTier[radix.TierGPU], res.totalBlocks),
			CPUHitRate:  hitRate(wr.perTier[radix.TierCPU], res.totalBlocks),
			DiskHitRate: hitRate(wr.perTier[radix.TierDisk], res.totalBlocks),
		}
	}
	tokens, err := a.promptTokens(q)
	if err != nil {
		return err
	}
	keys := kvblock.AppendLocalHashes(nil, tokens, res.blockSize, q.lora)
	if len(keys) > uiMaxPath {
		keys, out.Truncated = keys[:uiMaxPath], true
	}
	for i, k := range keys {
		holders := 0
		for _, wr := range res.workers {
			if wr.blocks > i {
				holders++
			}
		}
		out.Path = append(out.Path, uiPathBlock{Block: i, Key: fmt.Sprintf("%016x", k), Holders: holders})
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}
