package server

import (
	"bytes"
	"encoding/json"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"

	kvindexv1 "github.com/kvindex/kvindex/api/proto/kvindex/v1"
	"github.com/kvindex/kvindex/internal/radix"
	"github.com/kvindex/kvindex/internal/tokenize"
	"github.com/kvindex/kvindex/internal/workerspec"
)

// The compatible REST shapes. docs/api.md says where each comes from; field
// names here are public API and never change.

// hitRateRequest is POST /kv-cache/hit-rate's body (openFuyao hermes-router's
// cache-indexer contract).
type hitRateRequest struct {
	Model               string                     `json:"model"`
	LoraName            string                     `json:"lora_name"`
	CacheSalt           string                     `json:"cache_salt"`
	BlockSize           *int64                     `json:"block_size"`
	TokenIDs            tokenIDs                   `json:"token_ids"`
	Prompt              *string                    `json:"prompt"`
	Messages            []tokenize.Message         `json:"messages"`
	AddGenerationPrompt *bool                      `json:"add_generation_prompt"`
	Tools               []tokenize.Tool            `json:"tools"`
	ChatTemplateKwargs  map[string]json.RawMessage `json:"chat_template_kwargs"`
	Pods                []string                   `json:"pods"`
}

type hitRateResponse struct {
	Model        string       `json:"model"`
	BlockSize    int          `json:"block_size"`
	TotalBlocks  int          `json:"total_blocks"`
	PromptTokens int          `json:"prompt_tokens"`
	AppliedIndex uint64       `json:"applied_index"`
	Pods         []podHitRate `json:"pods"`
}

type podHitRate struct {
	Pod           string  `json:"pod"`
	MatchedBlocks int     `json:"matched_blocks"`
	MatchedTokens int     `json:"matched_tokens"`
	HitRate       float64 `json:"hit_rate"`
	GPUHitRate    float64 `json:"gpu_hit_rate"`
	CPUHitRate    float64 `json:"cpu_hit_rate"`
	DiskHitRate   float64 `json:"disk_hit_rate"`
}

func (a *API) handleHitRate(w http.ResponseWriter, r *http.Request) error {
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
	resp := hitRateResponse{
		Model: res.model, BlockSize: res.blockSize, TotalBlocks: res.totalBlocks, PromptTokens: res.promptTokens,
		AppliedIndex: res.applied, Pods: make([]podHitRate, len(res.workers)),
	}
	for i, wr := range res.workers {
		resp.Pods[i] = podHitRate{
			Pod: wr.id, MatchedBlocks: wr.blocks, MatchedTokens: wr.blocks * res.blockSize,
			HitRate:     hitRate(wr.blocks, res.totalBlocks),
			GPUHitRate:  hitRate(wr.perTier[radix.TierGPU], res.totalBlocks),
			CPUHitRate:  hitRate(wr.perTier[radix.TierCPU], res.totalBlocks),
			DiskHitRate: hitRate(wr.perTier[radix.TierDisk], res.totalBlocks),
		}
	}
	writeJSON(w, http.StatusOK, resp)
	return nil
}

func setBlockSize(q *scoreQuery, bs *int64) error {
	if bs == nil {
		return nil
	}
	if *bs < 1 || *bs > maxBlockSize {
		return invalidArg("block_size=%d must be between 1 and %d", *bs, maxBlockSize)
	}
	q.blockSize = int(*bs)
	return nil
}

// queryJSON is the body of POST /query and /query_by_hash in Dynamo's
// standalone indexer form ({token_ids | block_hashes, model_name, lora_name,
// tenant_id}) and Mooncake's ({model, lora_name, token_ids | seq_hashes |
// block_hash, tenant_id, instance_id, block_size, cache_salt}).
type queryJSON struct {
	TokenIDs    tokenIDs        `json:"token_ids"`
	BlockHashes []hashValue     `json:"block_hashes"`
	SeqHashes   []hashValue     `json:"seq_hashes"`
	BlockHash   []hashValue     `json:"block_hash"`
	HashKind    string          `json:"hash_kind"`
	Model       string          `json:"model"`
	ModelName   string          `json:"model_name"`
	LoraName    *string         `json:"lora_name"`
	CacheSalt   string          `json:"cache_salt"`
	TenantID    string          `json:"tenant_id"`
	InstanceID  json.RawMessage `json:"instance_id"`
	Workers     []string        `json:"workers"`
	BlockSize   *int64          `json:"block_size"`
}

// tokenIDs is a JSON array of token ids, parsed by hand: encoding/json spends
// ~100 ns on each number through reflection, which made decoding a 2k-token
// prompt cost more than scoring it.
type tokenIDs []uint32

func (t *tokenIDs) UnmarshalJSON(data []byte) error {
	i, n := 0, len(data)
	skip := func() {
		for i < n && (data[i] == ' ' || data[i] == '\t' || data[i] == '\n' || data[i] == '\r') {
			i++
		}
	}
	bad := func() error {
		return &json.UnmarshalTypeError{Value: "value " + strconv.Quote(string(data[:min(n, i+20)])) + "...", Type: tokenIDsType}
	}
	skip()
	if n-i >= 4 && string(data[i:i+4]) == "null" {
		*t = nil
		return nil
	}
	if i == n || data[i] != '[' {
		return bad()
	}
	i++
	out := make(tokenIDs, 0, n/4)
	skip()
	if i < n && data[i] == ']' {
		*t = out
		return nil
	}
	for {
		skip()
		start := i
		var v uint64
		for i < n && data[i] >= '0' && data[i] <= '9' {
			v = v*10 + uint64(data[i]-'0')
			if v > 1<<32-1 {
				return bad()
			}
			i++
		}
		if i == start || (data[start] == '0' && i-start > 1) {
			return bad() // not an unsigned integer (sign, fraction, exponent, string, leading zero)
		}
		out = append(out, uint32(v))
		skip()
		if i == n {
			return bad()
		}
		switch data[i] {
		case ',':
			i++
		case ']':
			*t = out
			return nil
		default:
			return bad()
		}
	}
}

var tokenIDsType = reflect.TypeFor[[]uint32]()

// hashValue is a block hash given as a JSON integer (signed, as Dynamo's i64,
// or unsigned) or a string (decimal or 0x-prefixed hex, as Mooncake allows).
type hashValue uint64

func (h *hashValue) UnmarshalJSON(data []byte) error {
	s := string(bytes.TrimSpace(data))
	if strings.HasPrefix(s, `"`) {
		if err := json.Unmarshal(data, &s); err != nil {
			return err
		}
	}
	var v uint64
	var err error
	switch {
	case strings.HasPrefix(s, "0x") || strings.HasPrefix(s, "0X"):
		v, err = strconv.ParseUint(s[2:], 16, 64)
	case strings.HasPrefix(s, "-"):
		var i int64
		i, err = strconv.ParseInt(s, 10, 64)
		v = uint64(i)
	default:
		v, err = strconv.ParseUint(s, 10, 64)
	}
	if err != nil {
		return &json.UnmarshalTypeError{Value: "value " + s, Type: hashValueType}
	}
	*h = hashValue(v)
	return nil
}

var hashValueType = reflect.TypeFor[uint64]()

func (a *API) handleQuery(w http.ResponseWriter, r *http.Request) error {
	return a.compatQuery(w, r, false)
}

func (a *API) handleQueryByHash(w http.ResponseWriter, r *http.Request) error {
	return a.compatQuery(w, r, true)
}

func (a *API) compatQuery(w http.ResponseWriter, r *http.Request, byHash bool) error {
	format := r.URL.Query().Get("format")
	if format != "" && format != "dynamo" && format != "mooncake" {
		return invalidArg("format=%q: want dynamo, mooncake or nothing (both shapes in one object)", format)
	}
	var req queryJSON
	if err := decodeJSON(r, &req); err != nil {
		return err
	}
	model, err := oneModel(req.Model, req.ModelName)
	if err != nil {
		return err
	}
	tenant := req.TenantID
	if tenant == "" {
		tenant = "default"
	}
	if format == "" && (tenant == "scores" || tenant == "frequencies" || tenant == "tree_sizes") {
		return invalidArg("tenant_id %q collides with a Dynamo response key; add ?format=mooncake", tenant)
	}
	q := &scoreQuery{model: model, salt: req.CacheSalt, workers: req.Workers}
	if req.LoraName != nil {
		q.lora = *req.LoraName
	}
	if len(req.InstanceID) > 0 && string(bytes.TrimSpace(req.InstanceID)) != "null" {
		id, err := instanceID(req.InstanceID)
		if err != nil {
			return err
		}
		q.workers = append(q.workers, id)
	}
	if err := setBlockSize(q, req.BlockSize); err != nil {
		return err
	}
	if byHash {
		if err := req.setHashes(q); err != nil {
			return err
		}
	} else {
		if req.TokenIDs == nil {
			return invalidArg("token_ids is required")
		}
		q.tokens, q.hasTokens = req.TokenIDs, true
	}
	res, err := a.score(r.Context(), q)
	if err != nil {
		return err
	}
	out := map[string]any{}
	if format != "mooncake" {
		a.dynamoShape(res, out)
	}
	if format != "dynamo" {
		out[tenant] = mooncakeShape(res)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// setHashes takes the one hash list of the request: Dynamo's block_hashes are
// local hashes, Mooncake's seq_hashes (block_hash in early drafts) sequence
// hashes; hash_kind ("local" or "sequence") overrides.
func (req *queryJSON) setHashes(q *scoreQuery) error {
	lists := 0
	var hashes []hashValue
	kind := "local"
	for _, l := range []struct {
		v    []hashValue
		kind string
	}{{req.BlockHashes, "local"}, {req.SeqHashes, "sequence"}, {req.BlockHash, "sequence"}} {
		if l.v != nil {
			lists++
			hashes, kind = l.v, l.kind
		}
	}
	switch {
	case lists == 0:
		return invalidArg("block_hashes (or seq_hashes) is required")
	case lists > 1:
		return invalidArg("give only one of block_hashes, seq_hashes and block_hash")
	}
	switch req.HashKind {
	case "":
	case "local", "sequence":
		kind = req.HashKind
	default:
		return invalidArg("hash_kind=%q: want local or sequence", req.HashKind)
	}
	if kind == "sequence" {
		return errSequenceHashes
	}
	q.byHash = true
	q.localKeys = make([]uint64, len(hashes))
	for i, h := range hashes {
		q.localKeys[i] = uint64(h)
	}
	return nil
}

// dynamoShape adds Dynamo's standalone indexer response to out: scores (matched
// tokens by worker and dp rank, matching ranks only), frequencies (per prompt
// block, how many ranks hold it) and tree_sizes (blocks each matching rank
// holds).
func (a *API) dynamoShape(res *scoreResult, out map[string]any) {
	scores := map[string]map[string]int{}
	sizes := map[string]map[string]int{}
	var depth []int
	ix := a.backend.Index()
	for _, w := range res.workers {
		for _, rk := range w.ranks {
			if rk.blocks == 0 {
				continue
			}
			rank := strconv.FormatUint(uint64(rk.rank), 10)
			if scores[w.id] == nil {
				scores[w.id], sizes[w.id] = map[string]int{}, map[string]int{}
			}
			scores[w.id][rank] = rk.blocks * res.blockSize
			sizes[w.id][rank] = ix.HeldBlocks(radix.WorkerKey{Worker: w.id, DPRank: rk.rank})
			for len(depth) < rk.blocks {
				depth = append(depth, 0)
			}
			for i := range rk.blocks {
				depth[i]++
			}
		}
	}
	if depth == nil {
		depth = []int{}
	}
	out["scores"], out["frequencies"], out["tree_sizes"] = scores, depth, sizes
}

// mooncakeInstance is one instance of Mooncake's /query response. The tier
// figures are matched prefix tokens whose fastest tier is that one, so they
// sum to longest_matched (Mooncake's draft counts, per medium, the prefix
// available on it; see docs/api.md).
type mooncakeInstance struct {
	LongestMatched int            `json:"longest_matched"`
	GPU            int            `json:"GPU"`
	CPU            int            `json:"CPU"`
	Disk           int            `json:"DISK"`
	DP             map[string]int `json:"DP"`
}

func mooncakeShape(res *scoreResult) map[string]mooncakeInstance {
	out := make(map[string]mooncakeInstance, len(res.workers))
	for _, w := range res.workers {
		inst := mooncakeInstance{
			LongestMatched: w.blocks * res.blockSize,
			GPU:            w.perTier[radix.TierGPU] * res.blockSize,
			CPU:            w.perTier[radix.TierCPU] * res.blockSize,
			Disk:           w.perTier[radix.TierDisk] * res.blockSize,
			DP:             map[string]int{},
		}
		for _, rk := range w.ranks {
			inst.DP[strconv.FormatUint(uint64(rk.rank), 10)] = rk.blocks * res.blockSize
		}
		out[w.id] = inst
	}
	return out
}

// dynamoWorker is one entry of GET /workers?format=dynamo.
type dynamoWorker struct {
	InstanceID dynamoInstanceID  `json:"instance_id"`
	Endpoints  map[string]string `json:"endpoints"`
}

// dynamoInstanceID is a worker id as Dynamo's listing carries it: Dynamo's
// instance ids are integers (its WorkerId is a u64), and its clients decode
// the field as one, so an id that is the decimal form of an integer (as the
// compatible /register stores a numeric instance_id) is written as a JSON
// number; any other id (a kvindex worker name) stays a string.
type dynamoInstanceID string

func (id dynamoInstanceID) MarshalJSON() ([]byte, error) {
	if n, err := strconv.ParseInt(string(id), 10, 64); err == nil && strconv.FormatInt(n, 10) == string(id) {
		return []byte(id), nil
	}
	return json.Marshal(string(id))
}

func dynamoWorkers(resp *kvindexv1.WorkersResponse) []dynamoWorker {
	out := make([]dynamoWorker, 0, len(resp.Workers))
	for _, w := range resp.Workers {
		dw := dynamoWorker{InstanceID: dynamoInstanceID(w.Spec.Id), Endpoints: map[string]string{}}
		ranks := max(w.Spec.DpSize, 1)
		for r := range ranks {
			if w.Spec.EventsEndpoint == "" {
				break
			}
			if ep, err := workerspec.OffsetEndpoint(w.Spec.EventsEndpoint, r); err == nil {
				dw.Endpoints[strconv.FormatUint(uint64(r), 10)] = ep
			}
		}
		out = append(out, dw)
	}
	slices.SortFunc(out, func(x, y dynamoWorker) int { return strings.Compare(string(x.InstanceID), string(y.InstanceID)) })
	return out
}
