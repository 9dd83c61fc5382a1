package server

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/kvindex/kvindex/internal/kvblock"
	"github.com/kvindex/kvindex/internal/radix"
	"github.com/kvindex/kvindex/internal/tokenize"
)

// maxBlockSize bounds block_size in requests (as ingest bounds it for workers).
const maxBlockSize = 1 << 16

// scoreQuery is one scoring request, whatever API it came through. Exactly one
// of tokens, text, messages and localKeys is the prompt.
type scoreQuery struct {
	model, lora, salt string
	blockSize         int // 0: the block size of the model's workers
	tokens            []uint32
	hasTokens         bool
	text              *string
	messages          []tokenize.Message
	chat              tokenize.ChatOptions
	// localKeys are block keys the caller computed (QueryByHash, local kind).
	localKeys []uint64
	byHash    bool
	// workers are the candidates; nil means every worker of the model.
	workers      []string
	linearizable bool
}

// scoreResult is the answer to a scoreQuery, before any API shapes it.
type scoreResult struct {
	model        string
	blockSize    int
	promptTokens int
	totalBlocks  int
	applied      uint64
	// workers holds every candidate, highest blocks first, ties by id.
	workers []workerResult

	// Buffers of the computation, kept with the result so that a released
	// result lends them to the next request (see newScoreResult): the prompt's
	// block keys, Match's answer, the candidates in id order, the backing
	// array of their ranks, and their encoded sizes (scorewire.go).
	keys    []uint64
	matches []radix.WorkerMatch
	byID    []workerResult
	ranks   []rankResult
	sizes   []int
}

// resultPool recycles scoreResults with their buffers: a 2k-token query over 64
// workers otherwise allocates ~24 KB of them, which at thousands of queries a
// second is what paces garbage collection (and its latency spikes).
var resultPool = sync.Pool{New: func() any { return new(scoreResult) }}

// newScoreResult returns an empty result, with a released one's buffers.
func newScoreResult() *scoreResult {
	r := resultPool.Get().(*scoreResult)
	*r = scoreResult{keys: r.keys[:0], matches: r.matches[:0], byID: r.byID[:0], ranks: r.ranks[:0], sizes: r.sizes[:0], workers: r.workers[:0]}
	return r
}

// release hands r's buffers to a later request. The caller must not use r, or
// anything but the strings it holds, afterwards; a result never released is
// merely collected.
func (r *scoreResult) release() { resultPool.Put(r) }

// matched is how many of r.workers (those first) have a matched block.
func (r *scoreResult) matched() int {
	n := 0
	for n < len(r.workers) && r.workers[n].blocks > 0 {
		n++
	}
	return n
}

type workerResult struct {
	id string
	// registered says the worker is in the registry; ranks is empty otherwise.
	registered bool
	// The figures of the worker's best dp rank.
	blocks  int
	perTier [radix.NumTiers]int
	ranks   []rankResult // by rank
}

type rankResult struct {
	rank    uint32
	blocks  int
	perTier [radix.NumTiers]int
}

// score answers q from the backend's index.
func (a *API) score(ctx context.Context, q *scoreQuery) (*scoreResult, error) {
	if q.model == "" {
		return nil, invalidArg("model is required")
	}
	if err := checkNames("model", q.model, "lora_name", q.lora, "cache_salt", q.salt); err != nil {
		return nil, err
	}
	for _, w := range q.workers {
		if err := checkNames("worker id", w); err != nil {
			return nil, err
		}
	}
	if q.blockSize < 0 || q.blockSize > maxBlockSize {
		return nil, invalidArg("block_size=%d must be between 1 and %d", q.blockSize, maxBlockSize)
	}
	if q.linearizable {
		if err := a.backend.Linearizable(ctx); err != nil {
			return nil, err
		}
	}
	view, err := a.view.get(ctx)
	if err != nil {
		return nil, err
	}
	mv := view.byModel[q.model]
	bs, err := mv.resolveBlockSize(q.model, q.blockSize, a.defaultBlockSize)
	if err != nil {
		return nil, err
	}
	res := newScoreResult()
	res.model, res.blockSize = q.model, bs

	var keys []uint64
	if q.byHash {
		if len(q.localKeys) > a.maxPromptTokens {
			return nil, fmt.Errorf("%w: %d block hashes, more than the limit of %d", ErrTooLarge, len(q.localKeys), a.maxPromptTokens)
		}
		keys = q.localKeys
	} else {
		tokens, err := a.promptTokens(q)
		if err != nil {
			return nil, err
		}
		res.promptTokens = len(tokens)
		res.keys = kvblock.AppendLocalHashes(res.keys[:0], tokens, bs, q.lora)
		keys = res.keys
	}
	res.totalBlocks = len(keys)
	ns := kvblock.Namespace{Model: q.model, LoRA: q.lora, CacheSalt: q.salt}
	nsID := ns.ID()
	if mv != nil { // names of unregistered models would let queries fill the table
		a.names.learn(nsID, ns)
	}

	// Candidates in id order. The eligible ones can hold these keys: live
	// workers of the model with the same block size (or none known).
	eligible := func(w *viewWorker) bool {
		return !w.dead && w.model == q.model && (w.blockSize == 0 || w.blockSize == bs)
	}
	var cands []*viewWorker
	var filter []string // nil: Match answers for every worker of the namespace
	// None named, or an empty list (as llm-d means it): every worker.
	if len(q.workers) == 0 {
		// The namespace holds only this model's workers, so Match needs no filter
		// (resolving one costs a map lookup per worker of the model on every
		// request); the merge below drops the ineligible ones, whose answers are
		// independent of the others'.
		cands = mv.all()
	} else {
		ids := slices.Compact(slices.Sorted(slices.Values(q.workers)))
		cands = make([]*viewWorker, len(ids))
		filter = make([]string, 0, len(ids))
		for i, id := range ids {
			w := view.byID[id]
			if w == nil {
				w = &viewWorker{id: id} // unknown: scores zero, reports no ranks
			} else if eligible(w) {
				// A dead worker holds no block; named, it is reported with zero.
				filter = append(filter, id)
			}
			cands[i] = w
		}
	}
	res.applied = a.backend.AppliedIndex()
	if len(cands) > 0 && (filter == nil || len(filter) > 0) {
		res.matches = a.backend.Index().Match(nsID, keys, filter, res.matches[:0])
	}
	matches := res.matches

	ranks := 0
	for _, w := range cands {
		ranks += int(w.ranks)
	}
	flat := slices.Grow(res.ranks[:0], ranks)
	byID := slices.Grow(res.byID[:0], len(cands))[:len(cands)]
	matched := 0 // how many of byID have blocks
	m := 0
	for i, w := range cands {
		for m < len(matches) && matches[m].Worker.Worker < w.id {
			m++
		}
		wr := &byID[i]
		*wr = workerResult{id: w.id, registered: w.model != ""}
		start := len(flat)
		for r := range w.ranks {
			flat = append(flat, rankResult{rank: r})
		}
		wr.ranks = flat[start:len(flat):len(flat)]
		ok := eligible(w)
		for ; m < len(matches) && matches[m].Worker.Worker == w.id; m++ {
			if !ok {
				continue
			}
			wm := &matches[m]
			rank := wm.Worker.DPRank
			for uint32(len(wr.ranks)) <= rank { // a rank beyond the spec's dp_size
				wr.ranks = append(wr.ranks, rankResult{rank: uint32(len(wr.ranks))})
			}
			wr.ranks[rank].blocks, wr.ranks[rank].perTier = wm.Blocks, wm.PerTier
			if wm.Blocks > wr.blocks {
				wr.blocks, wr.perTier = wm.Blocks, wm.PerTier
			}
		}
		if wr.blocks > 0 {
			matched++
		}
	}
	res.ranks, res.byID = flat, byID
	// Matched workers first, highest blocks first, ties by id; then the others,
	// by id. Both parts keep id order when copied out of byID, so only the
	// matched part needs sorting, and stably by blocks alone.
	out := slices.Grow(res.workers[:0], len(byID))[:len(byID)]
	mi, ui := 0, matched
	for i := range byID {
		if byID[i].blocks > 0 {
			out[mi] = byID[i]
			mi++
		} else {
			out[ui] = byID[i]
			ui++
		}
	}
	slices.SortStableFunc(out[:matched], func(x, y workerResult) int { return cmp.Compare(y.blocks, x.blocks) })
	res.workers = out
	return res, nil
}

// promptTokens returns the prompt of q as token ids, tokenizing text and chat
// messages with the model's tokenizer.
func (a *API) promptTokens(q *scoreQuery) ([]uint32, error) {
	given := 0
	for _, set := range []bool{q.hasTokens, q.text != nil, q.messages != nil} {
		if set {
			given++
		}
	}
	switch {
	case given == 0:
		return nil, invalidArg("the prompt is missing: give one of token_ids, text (prompt) or messages")
	case given > 1:
		return nil, invalidArg("give only one of token_ids, text (prompt) and messages")
	}
	tokens := q.tokens
	if !q.hasTokens {
		tok, err := a.tokenizer(q.model)
		if err != nil {
			return nil, err
		}
		if q.text != nil {
			if len(*q.text) > a.maxPromptBytes() {
				return nil, fmt.Errorf("%w: text of %d bytes, more than the limit of %d", ErrTooLarge, len(*q.text), a.maxPromptBytes())
			}
			tokens = tok.Encode(*q.text, true)
		} else {
			if len(q.messages) == 0 {
				return nil, invalidArg("messages must not be empty")
			}
			rendered, err := tok.ApplyChatTemplate(q.messages, q.chat)
			if errors.Is(err, tokenize.ErrNotSupported) {
				return nil, fmt.Errorf("messages: %w", err) // no chat template: failed_precondition
			}
			if err != nil {
				return nil, fmt.Errorf("%w: messages: %w", ErrInvalidArgument, err)
			}
			if len(rendered) > a.maxPromptBytes() {
				return nil, fmt.Errorf("%w: rendered chat of %d bytes, more than the limit of %d", ErrTooLarge, len(rendered), a.maxPromptBytes())
			}
			tokens = tok.Encode(rendered, false)
		}
	}
	if len(tokens) > a.maxPromptTokens {
		return nil, fmt.Errorf("%w: the prompt has %d tokens, more than the limit of %d (--max-prompt-tokens)", ErrTooLarge, len(tokens), a.maxPromptTokens)
	}
	return tokens, nil
}

// maxPromptBytes bounds text before tokenizing: no tokenizer makes fewer than
// one token of 64 bytes, so a longer text could only fail the token limit.
func (a *API) maxPromptBytes() int { return 64 * a.maxPromptTokens }

// tokenizer returns the model's tokenizer, or the fallback one when configured.
func (a *API) tokenizer(model string) (tokenize.Tokenizer, error) {
	t, err := a.tokenizers.Lookup(model)
	if err == nil {
		return t, nil
	}
	if a.fallback != nil {
		return a.fallback, nil
	}
	return nil, fmt.Errorf("%w: no tokenizer for model %q; send token_ids, or start the indexer with --tokenizer %s=<dir>", ErrUnknownModel, model, model)
}
