package fakeengine

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"
)

// postJSON posts body and decodes the JSON answer into out (when non-nil).
func postJSON(t *testing.T, url, body string, out any) *http.Response {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if out != nil {
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
			t.Fatalf("decoding %s answer (status %d): %v", url, resp.StatusCode, err)
		}
	}
	return resp
}

type completionAnswer struct {
	Choices []struct {
		Text         string `json:"text"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
	Usage struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		TotalTokens         int `json:"total_tokens"`
		PromptTokensDetails struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
	KVTransferParams *KVTransferParams `json:"kv_transfer_params"`
	Error            *errorDetail      `json:"error"`
}

func tokensJSON(ids []uint32) string {
	b, _ := json.Marshal(ids)
	return string(b)
}

func TestRepeatedPrefixIsCachedAndCheaper(t *testing.T) {
	cfg := testConfig()
	e := startEngine(t, cfg)
	first := seqPrompt(0, 10)
	second := append(slices.Clone(first[:8]), seqPrompt(50, 4)...)

	var a1, a2 completionAnswer
	r1 := postJSON(t, e.URL()+"/v1/completions", `{"prompt":`+tokensJSON(first)+`,"max_tokens":1}`, &a1)
	r2 := postJSON(t, e.URL()+"/v1/completions", `{"prompt":`+tokensJSON(second)+`,"max_tokens":1}`, &a2)
	if a1.Usage.PromptTokensDetails.CachedTokens != 0 || a1.Usage.PromptTokens != 10 {
		t.Fatalf("first request usage %+v, want 10 prompt tokens, none cached", a1.Usage)
	}
	// Two full blocks (8 tokens) of the second prompt were computed by the first.
	if a2.Usage.PromptTokensDetails.CachedTokens != 8 || a2.Usage.PromptTokens != 12 {
		t.Fatalf("second request usage %+v, want 12 prompt tokens, 8 cached", a2.Usage)
	}
	tm := cfg.Timing
	want1 := tm.StepBase + 10*tm.PrefillPerToken
	want2 := tm.StepBase + 4*tm.PrefillPerToken
	got1, got2 := simHeader(t, r1, HeaderSimTTFT), simHeader(t, r2, HeaderSimTTFT)
	if got1 != want1 || got2 != want2 || got2 >= got1 {
		t.Fatalf("simulated TTFT %v then %v, want %v then %v (the cached prefix costs nothing)", got1, got2, want1, want2)
	}
}

func simHeader(t *testing.T, resp *http.Response, name string) time.Duration {
	t.Helper()
	v := resp.Header.Get(name)
	if v == "" {
		v = resp.Trailer.Get(name)
	}
	d, err := time.ParseDuration(v + "ms")
	if err != nil {
		t.Fatalf("%s = %q: %v", name, v, err)
	}
	return d
}

// generate runs a request through the Go API and returns the events it produced.
func generateEvents(t *testing.T, e *Engine, sub *subscriber, req Request) (Result, []decodedEvent) {
	t.Helper()
	res, err := e.Generate(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	// One step per generated token at most; batches of this request are the ones
	// up to the engine's last seq.
	var events []decodedEvent
	last := uint64(e.CacheTruth().Ranks[0].LastSeq)
	for sub.lastSeq < last {
		f := sub.next()
		sub.lastSeq = f.seq
		events = append(events, decodeBatch(t, f.payload).events...)
	}
	return res, events
}

func hashSet(blocks []CachedBlock, tier string) map[uint64]bool {
	out := map[uint64]bool{}
	for _, b := range blocks {
		if slices.Contains(b.Tiers, tier) {
			out[b.Hash] = true
		}
	}
	return out
}

func TestEvictionRemovesExactlyTheEvictedBlocks(t *testing.T) {
	cfg := testConfig()
	cfg.NumGPUBlocks = 8
	e := startEngine(t, cfg)
	sub := subscribe(t, e, 0)

	// A fills 4 of the 8 blocks; B needs 6, so two of A's cached blocks go, tail
	// first (vLLM frees a request's blocks in reverse order).
	_, evA := generateEvents(t, e, sub, Request{Prompt: seqPrompt(0, 16), MaxTokens: 1})
	if len(evA) != 1 || len(evA[0].hashes) != 4 {
		t.Fatalf("A events %v, want one BlockStored of 4 blocks", evA)
	}
	aHashes := evA[0].hashes
	before := hashSet(e.CacheTruth().Ranks[0].Blocks, MediumGPU)

	_, evB := generateEvents(t, e, sub, Request{Prompt: seqPrompt(100, 24), MaxTokens: 1})
	var removed []uint64
	stored := 0
	for _, ev := range evB {
		switch ev.kind {
		case "BlockRemoved":
			if ev.medium != "GPU" {
				t.Fatalf("removal from medium %v, want GPU", ev.medium)
			}
			removed = append(removed, ev.hashes...)
		case "BlockStored":
			stored += len(ev.hashes)
		}
	}
	if want := []uint64{aHashes[3], aHashes[2]}; !slices.Equal(removed, want) {
		t.Fatalf("BlockRemoved %v, want A's last two blocks %v", removed, want)
	}
	after := hashSet(e.CacheTruth().Ranks[0].Blocks, MediumGPU)
	var gone []uint64
	for h := range before {
		if !after[h] {
			gone = append(gone, h)
		}
	}
	slices.Sort(gone)
	slices.Sort(removed)
	if !slices.Equal(gone, removed) || stored != 6 || len(after) != 8 {
		t.Fatalf("cache lost %v, events removed %v, stored %d, now %d blocks; want the same set, 6 stored, 8 cached", gone, removed, stored, len(after))
	}
}

func TestCPUTierTakesEvictedBlocksAndServesHits(t *testing.T) {
	cfg := testConfig()
	cfg.NumGPUBlocks = 8
	cfg.NumCPUBlocks = 4
	e := startEngine(t, cfg)
	sub := subscribe(t, e, 0)

	promptA := seqPrompt(0, 16)
	_, evA := generateEvents(t, e, sub, Request{Prompt: promptA, MaxTokens: 1})
	aHashes := evA[0].hashes
	_, evB := generateEvents(t, e, sub, Request{Prompt: seqPrompt(100, 24), MaxTokens: 1})

	// Each evicted block is announced on CPU (with its parent and tokens) before it
	// leaves the GPU.
	var order []string
	for _, ev := range evB {
		if ev.medium == "CPU" || ev.kind == "BlockRemoved" {
			order = append(order, ev.String())
		}
		if ev.kind == "BlockStored" && ev.medium == "CPU" {
			h := ev.hashes[0]
			i := slices.Index(aHashes, h)
			if i < 1 || ev.parent == nil || *ev.parent != aHashes[i-1] || !slices.Equal(ev.tokens, promptA[i*4:(i+1)*4]) {
				t.Fatalf("CPU BlockStored %v: parent %v tokens %v, want A's block %d with its parent and tokens", ev, ev.parent, ev.tokens, i)
			}
		}
	}
	want := []string{
		decodedEvent{kind: "BlockStored", hashes: aHashes[3:4], medium: "CPU"}.String(),
		decodedEvent{kind: "BlockRemoved", hashes: aHashes[3:4], medium: "GPU"}.String(),
		decodedEvent{kind: "BlockStored", hashes: aHashes[2:3], medium: "CPU"}.String(),
		decodedEvent{kind: "BlockRemoved", hashes: aHashes[2:3], medium: "GPU"}.String(),
	}
	if !slices.Equal(order, want) {
		t.Fatalf("offload events %v, want %v", order, want)
	}

	// A again: blocks 0-1 hit on GPU, block 2 on CPU (loaded back), block 3 is
	// past the hit limit (the last prompt token is always recomputed).
	res, err := e.Generate(context.Background(), Request{Prompt: promptA, MaxTokens: 1})
	if err != nil {
		t.Fatal(err)
	}
	tm := cfg.Timing
	if wantTTFT := tm.StepBase + 4*tm.PrefillPerToken + 4*tm.CPULoadPerToken; res.CachedTokens != 12 || res.SimTTFT != wantTTFT {
		t.Fatalf("cached %d, TTFT %v; want 12 cached (8 GPU + 4 CPU) and %v", res.CachedTokens, res.SimTTFT, wantTTFT)
	}
	for _, b := range e.CacheTruth().Ranks[0].Blocks {
		if b.Hash == aHashes[2] && !slices.Equal(b.Tiers, []string{"GPU", "CPU"}) {
			t.Fatalf("A's block 2 tiers %v, want GPU and CPU after the reload", b.Tiers)
		}
	}
}

func TestLoRAAndCacheSaltAreKeptApart(t *testing.T) {
	cfg := testConfig()
	cfg.LoRAModules = []string{"sql"}
	e := startEngine(t, cfg)
	sub := subscribe(t, e, 0)
	prompt := seqPrompt(0, 9)
	_, base := generateEvents(t, e, sub, Request{Prompt: prompt, MaxTokens: 1})
	res, lora := generateEvents(t, e, sub, Request{Prompt: prompt, MaxTokens: 1, Model: "sql"})
	if res.CachedTokens != 0 {
		t.Fatalf("LoRA request reused %d base-model tokens", res.CachedTokens)
	}
	ev := lora[0]
	if ev.loraName != "sql" || slices.Equal(ev.hashes, base[0].hashes) {
		t.Fatalf("LoRA BlockStored %v lora_name=%v, want lora_name sql and hashes unlike the base model's", ev, ev.loraName)
	}
	res, salted := generateEvents(t, e, sub, Request{Prompt: prompt, MaxTokens: 1, CacheSalt: "tenant-a"})
	if res.CachedTokens != 0 {
		t.Fatalf("salted request reused %d unsalted tokens", res.CachedTokens)
	}
	extra, _ := salted[0].extraKeys.([]any)
	if len(extra) != 2 || extra[1] != nil {
		t.Fatalf("extra_keys %v, want the salt on the first block only", salted[0].extraKeys)
	}
	if first, _ := extra[0].([]any); len(first) != 1 || first[0] != "tenant-a" {
		t.Fatalf("first block extra keys %v, want [tenant-a]", extra[0])
	}
	res, err := e.Generate(context.Background(), Request{Prompt: prompt, MaxTokens: 1, CacheSalt: "tenant-a"})
	if err != nil || res.CachedTokens != 8 {
		t.Fatalf("same salt again: cached %d, %v; want 8", res.CachedTokens, err)
	}
}

func TestPrefillDecodeDisaggregation(t *testing.T) {
	pcfg := testConfig()
	pcfg.Role = RolePrefill
	dcfg := testConfig()
	dcfg.Role = RoleDecode
	p, d := startEngine(t, pcfg), startEngine(t, dcfg)
	prompt := tokensJSON(seqPrompt(0, 10))

	var pa completionAnswer
	postJSON(t, p.URL()+"/v1/completions", `{"prompt":`+prompt+`,"max_tokens":8,"kv_transfer_params":{"do_remote_decode":true}}`, &pa)
	kv := pa.KVTransferParams
	if kv == nil || !kv.DoRemotePrefill || kv.DoRemoteDecode || len(kv.RemoteBlockIDs) != 3 || kv.RemoteEngineID == "" || kv.RemotePort == 0 {
		t.Fatalf("prefill answer kv_transfer_params = %+v, want do_remote_prefill with 3 block ids and the engine's address", kv)
	}
	if pa.Usage.CompletionTokens != 1 {
		t.Fatalf("prefill engine generated %d tokens, want only the first", pa.Usage.CompletionTokens)
	}
	kvJSON, _ := json.Marshal(kv)
	var da completionAnswer
	resp := postJSON(t, d.URL()+"/v1/completions", `{"prompt":`+prompt+`,"max_tokens":4,"kv_transfer_params":`+string(kvJSON)+`}`, &da)
	tm := dcfg.Timing
	if want := tm.StepBase + 10*tm.KVTransferPerToken + tm.DecodePerSeq; simHeader(t, resp, HeaderSimTTFT) != want {
		t.Fatalf("decode TTFT %v, want %v (transfer instead of prefill)", simHeader(t, resp, HeaderSimTTFT), want)
	}
	if da.Usage.PromptTokensDetails.CachedTokens != 10 || da.Usage.CompletionTokens != 4 {
		t.Fatalf("decode usage %+v, want all 10 prompt tokens received and 4 generated", da.Usage)
	}

	for _, tt := range []struct {
		name, url, params string
	}{
		{"decode engine asked to prefill for remote", d.URL(), `{"do_remote_decode":true}`},
		{"prefill engine given a remote prefill", p.URL(), `{"do_remote_prefill":true}`},
		{"both directions", p.URL(), `{"do_remote_prefill":true,"do_remote_decode":true}`},
	} {
		resp := postJSON(t, tt.url+"/v1/completions", `{"prompt":`+prompt+`,"kv_transfer_params":`+tt.params+`}`, nil)
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("%s: status %d, want 400", tt.name, resp.StatusCode)
		}
	}
}
