package server

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	indexerv1 "github.com/kvindex/kvindex/api/proto/indexer/v1"
	kvindexv1 "github.com/kvindex/kvindex/api/proto/kvindex/v1"
	"github.com/kvindex/kvindex/internal/kvblock"
	"github.com/kvindex/kvindex/internal/radix"
	"github.com/kvindex/kvindex/internal/tokenize"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// scoreView is one worker's answer, whatever API shaped it.
type scoreView struct {
	blocks int
	tiers  [radix.NumTiers]int
	ranks  map[uint32]int // blocks per dp rank, when the API reports ranks
}

// traffic is the prompts the query tests send to the fake engines: a shared
// system prefix, continuations per engine, a long prompt that pushes e1's
// older blocks to its CPU tier, and salted and text/chat prompts.
type traffic struct {
	sys, query []uint32
	text       string
	messages   []tokenize.Message
}

func sendTraffic(f *fixture) traffic {
	sys := tokens(0, 12)
	tr := traffic{sys: sys, query: concat(sys, tokens(100, 8), tokens(180, 5))}
	f.generate("e0", 0, concat(sys, tokens(100, 8)), "")
	f.generate("e1", 0, concat(sys, tokens(120, 8)), "")
	f.generate("e1", 0, tokens(200, 24), "") // e1 has 6 GPU blocks: the first prompt moves to CPU
	f.generate("e2", 1, concat(sys, tokens(100, 8), tokens(140, 4)), "")
	f.generate("e2", 0, tokens(60, 8), "")
	f.generate("e0", 0, sys, "tenant-x")

	builtin := tokenize.NewBuiltin()
	tr.text = "You are a helpful assistant. Answer briefly."
	f.generate("e0", 0, builtin.Encode(tr.text+" What is 2+2?", true), "")
	tr.messages = []tokenize.Message{{Role: "system", Content: "You are terse."}, {Role: "user", Content: "Name a prime."}}
	rendered, err := builtin.ApplyChatTemplate(tr.messages, tokenize.ChatOptions{AddGenerationPrompt: true})
	if err != nil {
		f.t.Fatal(err)
	}
	f.generate("e2", 0, builtin.Encode(rendered, false), "")
	return tr
}

// want returns per worker what the engines really cache of prompt.
func (f *fixture) want(prompt []uint32, lora, salt string) map[string]scoreView {
	out := map[string]scoreView{}
	for name, e := range f.engines {
		v := scoreView{ranks: map[uint32]int{}}
		best := -1
		for rank, ex := range truthMatch(e.CacheTruth(), prompt, lora, salt) {
			v.ranks[rank] = ex.blocks
			if ex.blocks > best || (ex.blocks == best && rank == 0) {
				best, v.blocks, v.tiers = ex.blocks, ex.blocks, ex.perTier
			}
		}
		out[name] = v
	}
	return out
}

func compareViews(t *testing.T, api string, got, want map[string]scoreView, withRanks, withTiers bool) {
	t.Helper()
	for name, w := range want {
		g, ok := got[name]
		if !ok {
			t.Errorf("%s: no score for %s", api, name)
			continue
		}
		if g.blocks != w.blocks {
			t.Errorf("%s: %s matched %d blocks, the engine caches %d", api, name, g.blocks, w.blocks)
		}
		if withTiers && g.tiers != w.tiers {
			t.Errorf("%s: %s tiers %v, the engine's %v", api, name, g.tiers, w.tiers)
		}
		if withRanks {
			for r, b := range w.ranks {
				if g.ranks[r] != b {
					t.Errorf("%s: %s rank %d matched %d blocks, the engine caches %d", api, name, r, g.ranks[r], b)
				}
			}
		}
	}
}

func viewsFromProto(scores []*kvindexv1.WorkerScore) map[string]scoreView {
	out := map[string]scoreView{}
	for _, s := range scores {
		v := scoreView{blocks: int(s.MatchedBlocks), ranks: map[uint32]int{},
			tiers: [radix.NumTiers]int{int(s.GpuMatchedBlocks), int(s.CpuMatchedBlocks), int(s.DiskMatchedBlocks)}}
		for _, r := range s.DpRanks {
			v.ranks[r.DpRank] = int(r.MatchedBlocks)
		}
		out[s.Worker] = v
	}
	return out
}

// TestScoreMatchesTheEnginesTruth asks every scoring API of a running indexer
// about prompts sent to fake engines and compares each answer with what the
// engines really cache.
func TestScoreMatchesTheEnginesTruth(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	tr := sendTraffic(f)
	ctx := context.Background()
	want := f.want(tr.query, "", "")
	if want["e0"].blocks != 5 || want["e2"].ranks[1] != 5 || want["e1"].blocks != 3 || want["e1"].tiers[radix.TierCPU] == 0 {
		t.Fatalf("the traffic did not set up the expected caches: %+v", want)
	}
	totalBlocks := len(tr.query) / 4
	builtin := tokenize.NewBuiltin()
	textTokens := builtin.Encode(tr.text, true)
	rendered, _ := builtin.ApplyChatTemplate(tr.messages, tokenize.ChatOptions{AddGenerationPrompt: true})
	chatTokens := builtin.Encode(rendered, false)
	protoMessages := []*kvindexv1.ChatMessage{{Role: "system", Content: "You are terse."}, {Role: "user", Content: "Name a prime."}}

	cases := []struct {
		name     string
		prompt   []uint32 // what the request's prompt tokenizes to
		salt     string
		ranks    bool // the API reports dp ranks
		tiers    bool
		fetch    func(t *testing.T) map[string]scoreView
		requires func(map[string]scoreView) bool // the case is not vacuous
	}{
		{name: "grpc Score token_ids", prompt: tr.query, ranks: true, tiers: true, fetch: func(t *testing.T) map[string]scoreView {
			resp, err := f.index.Score(ctx, &kvindexv1.ScoreRequest{Model: testModel, TokenIds: tr.query})
			if err != nil {
				t.Fatal(err)
			}
			if resp.TotalBlocks != uint32(totalBlocks) || resp.PromptTokens != uint32(len(tr.query)) || resp.BlockSize != 4 ||
				resp.AppliedIndex == 0 || resp.AppliedIndex > f.srv.Backend().AppliedIndex() {
				t.Errorf("Score header = %v", resp)
			}
			for i, s := range resp.Scores {
				if want := float64(s.MatchedBlocks) / float64(totalBlocks); math.Abs(s.HitRate-want) > 1e-12 || s.MatchedTokens != 4*s.MatchedBlocks {
					t.Errorf("%s: hit_rate %v matched_tokens %d for %d blocks", s.Worker, s.HitRate, s.MatchedTokens, s.MatchedBlocks)
				}
				if i > 0 && s.MatchedBlocks > resp.Scores[i-1].MatchedBlocks {
					t.Errorf("scores not ordered by matched blocks: %v", resp.Scores)
				}
			}
			return viewsFromProto(resp.Scores)
		}},
		{name: "grpc Score text", prompt: textTokens, tiers: true, fetch: func(t *testing.T) map[string]scoreView {
			resp, err := f.index.Score(ctx, &kvindexv1.ScoreRequest{Model: testModel, Text: tr.text})
			if err != nil {
				t.Fatal(err)
			}
			if resp.PromptTokens != uint32(len(textTokens)) {
				t.Errorf("prompt_tokens = %d, want %d", resp.PromptTokens, len(textTokens))
			}
			return viewsFromProto(resp.Scores)
		}},
		{name: "grpc Score messages", prompt: chatTokens, ranks: true, fetch: func(t *testing.T) map[string]scoreView {
			resp, err := f.index.Score(ctx, &kvindexv1.ScoreRequest{Model: testModel, Messages: protoMessages})
			if err != nil {
				t.Fatal(err)
			}
			return viewsFromProto(resp.Scores)
		}},
		{name: "grpc Score with cache salt", prompt: tr.sys, salt: "tenant-x", fetch: func(t *testing.T) map[string]scoreView {
			resp, err := f.index.Score(ctx, &kvindexv1.ScoreRequest{Model: testModel, TokenIds: tr.sys, CacheSalt: "tenant-x"})
			if err != nil {
				t.Fatal(err)
			}
			return viewsFromProto(resp.Scores)
		}, requires: func(v map[string]scoreView) bool { return v["e0"].blocks == 3 && v["e2"].blocks == 0 }},
		{name: "grpc QueryByHash local", prompt: tr.query, ranks: true, tiers: true, fetch: func(t *testing.T) map[string]scoreView {
			keys := kvblock.AppendLocalHashes(nil, tr.query, 4, "")
			resp, err := f.index.QueryByHash(ctx, &kvindexv1.QueryByHashRequest{Model: testModel, BlockHashes: keys,
				HashKind: kvindexv1.BlockHashKind_BLOCK_HASH_KIND_LOCAL, Consistency: kvindexv1.Consistency_CONSISTENCY_LINEARIZABLE})
			if err != nil {
				t.Fatal(err)
			}
			return viewsFromProto(resp.Scores)
		}},
		{name: "grpc QueryByHash matched only", prompt: tr.query, ranks: true, tiers: true, fetch: func(t *testing.T) map[string]scoreView {
			keys := kvblock.AppendLocalHashes(nil, tr.query, 4, "")
			ask := func(matchedOnly bool) map[string]scoreView {
				resp, err := f.index.QueryByHash(ctx, &kvindexv1.QueryByHashRequest{Model: testModel, BlockHashes: keys,
					HashKind: kvindexv1.BlockHashKind_BLOCK_HASH_KIND_LOCAL, Consistency: kvindexv1.Consistency_CONSISTENCY_LINEARIZABLE,
					Workers: []string{"e0", "e1", "e2", "not-caching"}, MatchedOnly: matchedOnly})
				if err != nil {
					t.Fatal(err)
				}
				return viewsFromProto(resp.Scores)
			}
			if v, ok := ask(false)["not-caching"]; !ok || v.blocks != 0 {
				t.Fatalf("without matched_only the answer lacks the worker that matched nothing (%v, %+v)", ok, v)
			}
			out := ask(true)
			for id, v := range out {
				if v.blocks == 0 {
					t.Errorf("matched_only answered %s, which matched no block", id)
				}
			}
			return out
		}},
		{name: "llm-d GetPodScores", prompt: textTokens, ranks: true, fetch: func(t *testing.T) map[string]scoreView {
			resp, err := f.llmd.GetPodScores(ctx, &indexerv1.GetPodScoresRequest{Prompt: tr.text, ModelName: testModel})
			if err != nil {
				t.Fatal(err)
			}
			out := map[string]scoreView{}
			for _, s := range resp.Scores {
				v := out[s.Pod]
				if v.ranks == nil {
					v.ranks = map[uint32]int{}
				}
				rank := uint32(0)
				if s.DataParallelRank != nil {
					rank = uint32(*s.DataParallelRank)
				} else if s.Pod == "e2" {
					t.Errorf("dp worker e2 scored without a rank: %v", s)
				}
				v.ranks[rank] = int(s.Score)
				v.blocks = max(v.blocks, int(s.Score))
				out[s.Pod] = v
			}
			return out
		}},
		{name: "REST /v1/score", prompt: tr.query, ranks: true, tiers: true, fetch: func(t *testing.T) map[string]scoreView {
			code, body := f.postJSON("/v1/score", map[string]any{"model": testModel, "token_ids": tr.query})
			if code != 200 {
				t.Fatalf("%d %s", code, body)
			}
			var resp kvindexv1.ScoreResponse
			if err := protojson.Unmarshal([]byte(body), &resp); err != nil {
				t.Fatal(err)
			}
			return viewsFromProto(resp.Scores)
		}},
		{name: "REST /kv-cache/hit-rate token_ids", prompt: tr.query, tiers: true, fetch: func(t *testing.T) map[string]scoreView {
			return f.hitRate(t, map[string]any{"model": testModel, "token_ids": tr.query, "block_size": 4}, totalBlocks)
		}},
		{name: "REST /kv-cache/hit-rate prompt", prompt: textTokens, tiers: true, fetch: func(t *testing.T) map[string]scoreView {
			return f.hitRate(t, map[string]any{"model": testModel, "prompt": tr.text}, len(textTokens)/4)
		}},
		{name: "REST /kv-cache/hit-rate messages", prompt: chatTokens, fetch: func(t *testing.T) map[string]scoreView {
			return f.hitRate(t, map[string]any{"model": testModel, "messages": []map[string]any{
				{"role": "system", "content": "You are terse."},
				{"role": "user", "content": []map[string]string{{"type": "text", "text": "Name a prime."}}},
			}}, len(chatTokens)/4)
		}},
		{name: "REST /query (Dynamo shape)", prompt: tr.query, ranks: true, fetch: func(t *testing.T) map[string]scoreView {
			code, body := f.postJSON("/query?format=dynamo", map[string]any{"model_name": testModel, "token_ids": tr.query})
			if code != 200 {
				t.Fatalf("%d %s", code, body)
			}
			var resp struct {
				Scores      map[string]map[string]int `json:"scores"`
				Frequencies []int                     `json:"frequencies"`
				TreeSizes   map[string]map[string]int `json:"tree_sizes"`
			}
			decodeInto(t, body, &resp)
			out := map[string]scoreView{}
			for w, ranks := range resp.Scores {
				v := scoreView{ranks: map[uint32]int{}}
				for r, tok := range ranks {
					n, _ := strconv.Atoi(r)
					v.ranks[uint32(n)] = tok / 4
					v.blocks = max(v.blocks, tok/4)
					if resp.TreeSizes[w][r] < tok/4 {
						t.Errorf("tree size of %s/%s = %d < its match", w, r, resp.TreeSizes[w][r])
					}
				}
				out[w] = v
			}
			if len(resp.Frequencies) == 0 || resp.Frequencies[0] < resp.Frequencies[len(resp.Frequencies)-1] {
				t.Errorf("frequencies = %v", resp.Frequencies)
			}
			for name := range f.engines { // Dynamo reports only workers that match
				if _, ok := out[name]; !ok {
					out[name] = scoreView{ranks: map[uint32]int{}}
				}
			}
			return out
		}},
		{name: "REST /query (Mooncake shape)", prompt: tr.query, ranks: true, tiers: true, fetch: func(t *testing.T) map[string]scoreView {
			code, body := f.postJSON("/query?format=mooncake", map[string]any{"model": testModel, "token_ids": tr.query,
				"block_size": 4, "tenant_id": "t1"})
			if code != 200 {
				t.Fatalf("%d %s", code, body)
			}
			var resp map[string]map[string]struct {
				Longest int            `json:"longest_matched"`
				GPU     int            `json:"GPU"`
				CPU     int            `json:"CPU"`
				Disk    int            `json:"DISK"`
				DP      map[string]int `json:"DP"`
			}
			decodeInto(t, body, &resp)
			out := map[string]scoreView{}
			for w, inst := range resp["t1"] {
				v := scoreView{blocks: inst.Longest / 4, tiers: [radix.NumTiers]int{inst.GPU / 4, inst.CPU / 4, inst.Disk / 4}, ranks: map[uint32]int{}}
				for r, tok := range inst.DP {
					n, _ := strconv.Atoi(r)
					v.ranks[uint32(n)] = tok / 4
				}
				out[w] = v
			}
			return out
		}},
		{name: "REST /query_by_hash (Dynamo local hashes)", prompt: tr.query, ranks: true, fetch: func(t *testing.T) map[string]scoreView {
			keys := kvblock.AppendLocalHashes(nil, tr.query, 4, "")
			signed := make([]int64, len(keys))
			for i, k := range keys {
				signed[i] = int64(k) // Dynamo sends i64
			}
			code, body := f.postJSON("/query_by_hash?format=dynamo", map[string]any{"model_name": testModel, "block_hashes": signed})
			if code != 200 {
				t.Fatalf("%d %s", code, body)
			}
			var resp struct {
				Scores map[string]map[string]int `json:"scores"`
			}
			decodeInto(t, body, &resp)
			out := map[string]scoreView{}
			for name := range f.engines {
				v := scoreView{ranks: map[uint32]int{}}
				for r, tok := range resp.Scores[name] {
					n, _ := strconv.Atoi(r)
					v.ranks[uint32(n)] = tok / 4
					v.blocks = max(v.blocks, tok/4)
				}
				out[name] = v
			}
			return out
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			want := f.want(c.prompt, "", c.salt)
			if c.requires != nil && !c.requires(want) {
				t.Fatalf("vacuous case: the engines cache %+v", want)
			}
			if want["e0"].blocks+want["e1"].blocks+want["e2"].blocks == 0 {
				t.Fatalf("vacuous case: no engine caches any of the prompt")
			}
			compareViews(t, c.name, c.fetch(t), want, c.ranks, c.tiers)
		})
	}
}

func (f *fixture) hitRate(t *testing.T, req map[string]any, total int) map[string]scoreView {
	t.Helper()
	code, body := f.postJSON("/kv-cache/hit-rate", req)
	if code != 200 {
		t.Fatalf("%d %s", code, body)
	}
	var resp hitRateResponse
	decodeInto(t, body, &resp)
	if resp.Model != testModel || resp.BlockSize != 4 || resp.TotalBlocks != total {
		t.Errorf("hit-rate header = %+v, want %d blocks", resp, total)
	}
	out := map[string]scoreView{}
	for _, p := range resp.Pods {
		if p.MatchedTokens != 4*p.MatchedBlocks || math.Abs(p.HitRate-p.GPUHitRate-p.CPUHitRate-p.DiskHitRate) > 1e-9 {
			t.Errorf("pod %+v is inconsistent", p)
		}
		n := float64(total)
		out[p.Pod] = scoreView{blocks: p.MatchedBlocks, tiers: [radix.NumTiers]int{
			int(math.Round(p.GPUHitRate * n)), int(math.Round(p.CPUHitRate * n)), int(math.Round(p.DiskHitRate * n))}}
	}
	return out
}

// TestCompatibleShapesMatchGoldenFiles pins the JSON shapes of the endpoints
// other tools call (hermes-router, Dynamo, Mooncake, llm-d): field names and
// nesting must never change. Run with -update to rewrite testdata/.
func TestCompatibleShapesMatchGoldenFiles(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	tr := sendTraffic(f)
	localKeys := kvblock.AppendLocalHashes(nil, tr.query, 4, "")
	cases := []struct {
		file string
		get  func() (int, string)
	}{
		{"hit_rate_response.json", func() (int, string) {
			return f.postJSON("/kv-cache/hit-rate", map[string]any{"model": testModel, "token_ids": tr.query, "pods": []string{"e0", "e1", "e2", "gone"}})
		}},
		{"query_response.json", func() (int, string) {
			return f.postJSON("/query", map[string]any{"model": testModel, "token_ids": tr.query})
		}},
		{"query_dynamo_response.json", func() (int, string) {
			return f.postJSON("/query?format=dynamo", map[string]any{"model_name": testModel, "token_ids": tr.query, "tenant_id": "default"})
		}},
		{"query_mooncake_response.json", func() (int, string) {
			return f.postJSON("/query?format=mooncake", map[string]any{"model": testModel, "token_ids": tr.query, "instance_id": "e0", "block_size": 4})
		}},
		{"query_by_hash_response.json", func() (int, string) {
			return f.postJSON("/query_by_hash", map[string]any{"model_name": testModel, "block_hashes": localKeys})
		}},
		{"workers_dynamo_response.json", func() (int, string) { return f.get("/workers?format=dynamo") }},
		{"llmd_get_pod_scores_response.json", func() (int, string) {
			resp, err := f.llmd.GetPodScores(context.Background(), &indexerv1.GetPodScoresRequest{Prompt: tr.text, ModelName: testModel})
			if err != nil {
				t.Fatal(err)
			}
			data, _ := protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}.Marshal(resp)
			return 200, string(data)
		}},
		{"error_response.json", func() (int, string) {
			return f.postJSON("/kv-cache/hit-rate", map[string]any{"model": testModel, "token_ids": []int{1}, "block_size": -16})
		}},
	}
	volatile := regexp.MustCompile(`"(applied_index|tcp_port)":\s*"?\d+"?`)
	endpoint := regexp.MustCompile(`tcp://127\.0\.0\.1:\d+`)
	for _, c := range cases {
		t.Run(c.file, func(t *testing.T) {
			_, body := c.get()
			var v any
			if err := json.Unmarshal([]byte(body), &v); err != nil {
				t.Fatalf("not JSON: %s", body)
			}
			pretty, _ := json.MarshalIndent(v, "", "  ")
			got := volatile.ReplaceAllString(string(pretty), `"$1": 0`)
			got = endpoint.ReplaceAllString(got, "tcp://127.0.0.1:PORT") + "\n"
			path := filepath.Join("testdata", c.file)
			if *update {
				if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			if got != string(want) {
				t.Errorf("%s changed:\n got %s\nwant %s", c.file, got, want)
			}
		})
	}
}

// TestWorkersStatsClusterDump checks the read endpoints against the engines.
func TestWorkersStatsClusterDump(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	tr := sendTraffic(f)
	ctx := context.Background()

	workers, err := f.index.Workers(ctx, &kvindexv1.WorkersRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, w := range workers.Workers {
		ids = append(ids, w.Spec.Id)
		truth := f.engines[w.Spec.Id].CacheTruth()
		var gpu, cpu uint64
		for _, rk := range truth.Ranks {
			for _, b := range rk.Blocks {
				if slices.Contains(b.Tiers, "GPU") {
					gpu++
				}
				if slices.Contains(b.Tiers, "CPU") {
					cpu++
				}
			}
		}
		// A followed worker is LIVE, or REPLAYING while an idle catch-up replay
		// (--idle-replay-interval) asks its engine for missed batches.
		following := w.State == kvindexv1.WorkerState_WORKER_STATE_LIVE || w.State == kvindexv1.WorkerState_WORKER_STATE_REPLAYING
		if w.GpuBlocks != gpu || w.CpuBlocks != cpu || !following ||
			len(w.DpRanks) != len(truth.Ranks) || w.Spec.Model != testModel || w.Spec.BlockSize != 4 {
			t.Errorf("worker %s = %v; the engine holds %d GPU and %d CPU blocks", w.Spec.Id, w, gpu, cpu)
		}
		for i, r := range w.DpRanks {
			if truth.Ranks[i].LastSeq >= 0 && r.LastSeq != uint64(truth.Ranks[i].LastSeq) {
				t.Errorf("%s rank %d last_seq %d, engine %d", w.Spec.Id, r.DpRank, r.LastSeq, truth.Ranks[i].LastSeq)
			}
		}
	}
	if !slices.Equal(ids, []string{"e0", "e1", "e2"}) {
		t.Errorf("workers = %v", ids)
	}
	if w, err := f.index.Workers(ctx, &kvindexv1.WorkersRequest{Model: "other"}); err != nil || len(w.Workers) != 0 {
		t.Errorf("Workers(model=other) = %v, %v", w, err)
	}
	code, body := f.get("/workers")
	var rest kvindexv1.WorkersResponse
	if err := protojson.Unmarshal([]byte(body), &rest); code != 200 || err != nil || len(rest.Workers) != 3 {
		t.Errorf("GET /workers = %d %s %v", code, body, err)
	}

	stats, err := f.index.Stats(ctx, &kvindexv1.StatsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	ixStats := f.srv.Index().Stats()
	if stats.Nodes != uint64(ixStats.Nodes) || stats.Residencies == 0 || stats.Namespaces != 2 || stats.Counters["stored_attached"] == 0 {
		t.Errorf("Stats = %v", stats)
	}
	// The traffic has stopped: the digest is the index's, at the applied index
	// (once the last digest, of at most a second ago, is replaced).
	for deadline := time.Now().Add(10 * time.Second); stats.DigestAppliedIndex != f.srv.backend.AppliedIndex() && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
		if stats, err = f.index.Stats(ctx, &kvindexv1.StatsRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	if d := f.srv.Index().Digest(); stats.IndexDigest != hex.EncodeToString(d[:]) || stats.DigestAppliedIndex != f.srv.backend.AppliedIndex() {
		t.Errorf("Stats digest %q at %d, want %x at %d", stats.IndexDigest, stats.DigestAppliedIndex, d, f.srv.backend.AppliedIndex())
	}
	if code, body := f.get("/v1/stats"); code != 200 || !strings.Contains(body, `"stored_attached"`) {
		t.Errorf("GET /v1/stats = %d %s", code, body)
	}

	cl, err := f.admin.Cluster(ctx, &kvindexv1.ClusterRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if cl.Leader != "node-a" || cl.NodeId != "node-a" || len(cl.Members) != 1 || !cl.Members[0].IsLeader ||
		cl.Members[0].GrpcAddr != f.srv.GRPCAddr() || cl.AppliedIndex == 0 ||
		cl.IndexDigest != stats.IndexDigest || cl.Members[0].IndexDigest != stats.IndexDigest {
		t.Errorf("Cluster = %v", cl)
	}
	code, body = f.get("/cluster")
	var cj map[string]any
	decodeInto(t, body, &cj)
	// docs/design.md's shape: term and applied_index are JSON numbers, suffrage a plain word.
	if term, ok := cj["term"].(json.Number); code != 200 || cj["leader"] != "node-a" || !ok || term == "0" ||
		cj["members"].([]any)[0].(map[string]any)["suffrage"] != "voter" {
		t.Errorf("GET /cluster = %d %s", code, body)
	}

	// Dump: every block of every engine, with the chain hashes clients compute.
	stream, err := f.index.Dump(ctx, &kvindexv1.DumpRequest{Workers: []string{"e0"}})
	if err != nil {
		t.Fatal(err)
	}
	dumped := map[uint64]bool{}
	for {
		m, err := stream.Recv()
		if err != nil {
			break
		}
		for _, c := range m.Changes {
			if c.Worker != "e0" || c.Kind != kvindexv1.ChangeKind_CHANGE_KIND_STORED || c.Model != testModel || len(c.SequenceHashes) != 1 {
				t.Fatalf("dumped change %v", c)
			}
			if c.NamespaceId == (kvblock.Namespace{Model: testModel}).ID() {
				dumped[c.SequenceHashes[0]] = true
			}
		}
	}
	chain := kvblock.AppendChainHashes(nil, kvblock.AppendLocalHashes(nil, concat(tr.sys, tokens(100, 8)), 4, ""))
	for i, seq := range chain {
		if !dumped[seq] {
			t.Errorf("the dump lacks block %d of e0's prompt", i)
		}
	}
	if n := unsaltedBlocks(f, "e0"); len(dumped) != n {
		t.Errorf("the dump of e0 has %d unsalted blocks, the engine %d", len(dumped), n)
	}
	code, body = f.get("/dump?worker=e2")
	var dj struct {
		Applied string            `json:"applied_index"`
		Changes []json.RawMessage `json:"changes"`
	}
	decodeInto(t, body, &dj)
	if code != 200 || len(dj.Changes) == 0 || dj.Applied == "" || strings.Contains(body, `"worker":"e0"`) {
		t.Errorf("GET /dump?worker=e2 = %d %.300s", code, body)
	}
}

// unsaltedBlocks counts the reachable blocks an engine caches without LoRA or salt.
func unsaltedBlocks(f *fixture, name string) int {
	n := 0
	for _, blocks := range truthBlocks(f.engines[name].CacheTruth()) {
		for k := range blocks {
			if k.salt == "" && k.lora == "" {
				n++
			}
		}
	}
	return n
}

func TestProtoRoundTripOfResponses(t *testing.T) {
	// The REST bodies of the kvindex.v1 endpoints are protojson: a response read
	// back equals the gRPC one (checked on a response with every field set).
	r := &scoreResult{model: "m", blockSize: 4, promptTokens: 9, totalBlocks: 2, applied: 7,
		workers: []workerResult{{id: "w", registered: true, blocks: 2, perTier: [3]int{1, 1, 0},
			ranks: []rankResult{{rank: 0, blocks: 2, perTier: [3]int{1, 1, 0}}}}}}
	p := r.proto()
	data, err := protoJSON.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	var back kvindexv1.ScoreResponse
	if err := protojson.Unmarshal(data, &back); err != nil || !proto.Equal(&back, p) {
		t.Errorf("round trip: %v %v", err, &back)
	}
	if p.Scores[0].HitRate != 1 || p.Scores[0].MatchedTokens != 8 {
		t.Errorf("score = %v", p.Scores[0])
	}
}

// TestAnEmptyWorkerListMeansEveryWorker: a hit-rate request with "pods": []
// scores every worker of the model, as one without "pods" does (and as
// llm-d's empty pod_identifiers means); it used to score nobody.
func TestAnEmptyWorkerListMeansEveryWorker(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	tr := sendTraffic(f)
	pods := func(body map[string]any) []string {
		code, resp := f.postJSON("/kv-cache/hit-rate", body)
		var hr hitRateResponse
		if err := json.Unmarshal([]byte(resp), &hr); code != 200 || err != nil {
			t.Fatalf("POST /kv-cache/hit-rate = %d %s", code, resp)
		}
		var ids []string
		for _, p := range hr.Pods {
			ids = append(ids, fmt.Sprintf("%s:%d", p.Pod, p.MatchedBlocks))
		}
		return ids
	}
	all := pods(map[string]any{"model": testModel, "token_ids": tr.query})
	empty := pods(map[string]any{"model": testModel, "token_ids": tr.query, "pods": []string{}})
	if len(all) < 2 || !slices.Equal(all, empty) {
		t.Errorf(`with "pods": [] the answer lists %v, without "pods" %v: want the same, every worker`, empty, all)
	}
}
