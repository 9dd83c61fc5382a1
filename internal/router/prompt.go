package router

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/kvindex/kvindex/internal/kvblock"
	"github.com/kvindex/kvindex/internal/openai"
	"github.com/kvindex/kvindex/internal/tokenize"
)

// Errors of a request's content; errors.go maps them to HTTP status.
var (
	// ErrBadRequest: the body or a header cannot be routed as given (400).
	ErrBadRequest = errors.New("bad request")
	// ErrUnknownModel: no worker serves the requested model (404, as vLLM).
	ErrUnknownModel = errors.New("model not found")
	// ErrUnknownWorker: a direct-mode header names a worker the router does not know
	// or that does not serve the model (400).
	ErrUnknownWorker = errors.New("unknown worker")
)

// endpoint is which OpenAI API a request came through.
type endpoint uint8

const (
	endpointCompletions endpoint = iota
	endpointChat
	endpointOther // another /v1/* POST: routed by load only
)

// prepared is a request read, tokenized and keyed, ready to be routed (possibly
// more than once, on retries).
type prepared struct {
	endpoint endpoint
	path     string
	body     []byte
	header   http.Header
	stream   bool
	route    RouteRequest
	// unkeyed says why a completion or chat request has no prompt tokens and no
	// prefix keys (input the router cannot tokenize); "" otherwise.
	unkeyed string
	// subset is the EPP's subset hint (sorted), part of the admission queue key;
	// empty without a hint.
	subset string
	// The indexer's answer, asked once per request.
	indexAsked bool
	indexOK    bool
	indexed    map[Target]Overlap
}

// prepare reads what routing needs from a request body: the model, the prompt's
// token ids (as the engine computes them) and block keys, and the session and
// prefix keys.
func (r *Router) prepare(h http.Header, path string, ep endpoint, body []byte) (*prepared, error) {
	p := &prepared{endpoint: ep, path: path, body: body, header: h}
	var tokens []uint32
	var fields keyFields
	var model, salt string
	switch ep {
	case endpointCompletions:
		var c struct {
			openai.CompletionRequest
			keyExtras
		}
		if err := json.Unmarshal(body, &c); err != nil {
			return nil, fmt.Errorf("%w: invalid JSON body: %v", ErrBadRequest, err)
		}
		fields.keyExtras = c.keyExtras
		if err := openai.CheckN(c.N); err != nil {
			return nil, err
		}
		model, salt, p.stream = c.Model, c.CacheSalt, c.Stream
		p.route.OutputTokens = c.OutputTokens()
		base, lora, err := r.resolveModel(model)
		if err != nil {
			return nil, err
		}
		p.route.Model, p.route.BaseModel, p.route.LoRA = cmpOr(model, base), base, lora
		if c.PromptEmbeds {
			// Embeddings are prompts the router cannot key, as media (below).
			p.unkeyed = "prompt_embeds: routed by load, without prefix keys"
		} else if tokens, err = c.PromptTokens(r.tokenizer(base)); err != nil {
			return nil, err
		}
	case endpointChat:
		var c struct {
			openai.ChatRequest
			keyExtras
		}
		if err := json.Unmarshal(body, &c); err != nil {
			return nil, fmt.Errorf("%w: invalid JSON body: %v", ErrBadRequest, err)
		}
		fields.keyExtras, fields.Messages = c.keyExtras, c.Messages
		if err := openai.CheckN(c.N); err != nil {
			return nil, err
		}
		model, salt, p.stream = c.Model, c.CacheSalt, c.Stream
		p.route.OutputTokens = c.OutputTokens()
		base, lora, err := r.resolveModel(model)
		if err != nil {
			return nil, err
		}
		p.route.Model, p.route.BaseModel, p.route.LoRA = cmpOr(model, base), base, lora
		if part := c.MediaPart(); part != "" {
			// The engine keys the blocks of a media item with the item's hash, which
			// the router cannot compute (nor the item's placeholder tokens): the
			// request is routed by load alone, and passed on as it came.
			p.unkeyed = fmt.Sprintf("a content part of type %q: routed by load, without prefix keys", part)
		} else if tokens, err = c.PromptTokens(r.tokenizer(base)); err != nil {
			return nil, err
		}
	default:
		var c struct {
			Model  string `json:"model"`
			Stream bool   `json:"stream"`
			keyExtras
		}
		if err := json.Unmarshal(body, &c); err != nil {
			return nil, fmt.Errorf("%w: invalid JSON body: %v", ErrBadRequest, err)
		}
		fields.keyExtras = c.keyExtras
		base, lora, err := r.resolveModel(c.Model)
		if err != nil {
			return nil, err
		}
		p.stream = c.Stream
		p.route.Model, p.route.BaseModel, p.route.LoRA = cmpOr(c.Model, base), base, lora
	}
	p.route.CacheSalt = salt
	p.route.PromptTokens = len(tokens)
	p.route.BlockSize = r.blockSizeOf(p.route.BaseModel)
	if p.route.OutputTokens == 0 {
		p.route.OutputTokens = r.cfg.DefaultOutputTokens
	}
	if len(tokens) > 0 {
		p.route.LocalKeys = kvblock.AppendLocalHashes(nil, tokens, p.route.BlockSize, p.route.LoRA)
		p.route.Keys = overlayKeys(p.route.LocalKeys, kvblock.Namespace{Model: p.route.BaseModel, LoRA: p.route.LoRA, CacheSalt: salt})
	}
	rules := r.keyRules
	switch r.cfg.Policy {
	case PolicyPrefixHash:
		p.route.PrefixKey, p.route.KeySource = rules.prefixKey(h, &fields, p.route.Model)
	default:
		p.route.SessionKey, p.route.KeySource = rules.sessionKey(h, &fields)
	}
	if r.cfg.Mode == ModeDirect {
		p.route.DirectWorker = strings.TrimSpace(h.Get("X-Worker-Instance-Id"))
		p.route.DirectPrefill = strings.TrimSpace(h.Get("X-Prefill-Instance-Id"))
	}
	return p, nil
}

// overlayKeys chains local keys into prefix keys with the namespace mixed in, so
// equal prompts of different models, adapters or salts never share an entry.
func overlayKeys(locals []uint64, ns kvblock.Namespace) []uint64 {
	keys := kvblock.AppendChainHashes(make([]uint64, 0, len(locals)), locals)
	id := ns.ID()
	for i := range keys {
		keys[i] = kvblock.NextChainHash(id, keys[i])
	}
	return keys
}

// resolveModel maps a requested model name to the base model that serves it and
// the LoRA adapter ("" for the base model). An empty name is accepted when the
// fleet serves exactly one base model, as a single vLLM engine accepts it.
func (r *Router) resolveModel(model string) (base, lora string, err error) {
	ws := r.fleet.Workers()
	if model == "" {
		var models []string
		for _, w := range ws {
			models = append(models, w.Model)
		}
		models = slices.Compact(slices.Sorted(slices.Values(models)))
		if len(models) != 1 {
			return "", "", fmt.Errorf("%w: model is required (the fleet serves %d models)", ErrBadRequest, len(models))
		}
		return models[0], "", nil
	}
	for _, w := range ws {
		if l, ok := w.Serves(model); ok {
			return w.Model, l, nil
		}
	}
	return "", "", fmt.Errorf("%w: the model `%s` does not exist", ErrUnknownModel, model)
}

// tokenizer returns the model's tokenizer: the one given with --tokenizer, else the
// built-in byte-level one (the fake engine's; token parity will flag a real engine).
func (r *Router) tokenizer(model string) tokenize.Tokenizer {
	if t, err := r.tokenizers.Lookup(model); err == nil {
		return t
	}
	return r.builtin
}

// blockSizeOf is the block size of the model's workers (the first one's: an
// index only matches workers of one block size per model).
func (r *Router) blockSizeOf(model string) int {
	for _, w := range r.fleet.Workers() {
		if w.Model == model {
			return w.BlockSize
		}
	}
	return r.cfg.BlockSize
}
