package router

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"time"

	"github.com/kvindex/kvindex/internal/openai"
	"github.com/kvindex/kvindex/internal/tokenize"
)

// Probe prompts of the token-parity check: plain text with a special-token-free
// mix of words, digits and punctuation, and a chat with a system turn.
const parityText = "KV cache parity probe: the quick brown fox jumps over 13 lazy dogs, twice!"

var parityMessages = []tokenize.Message{
	{Role: "system", Content: "You are a helpful assistant."},
	{Role: "user", Content: "Say hello to the router and the engine in one sentence."},
}

// parityResult is one model's outcome.
type parityResult struct {
	model, worker string
	match         bool
	// unreachable: the engine could not be asked; says nothing about parity.
	unreachable bool
	detail      string
}

// checkParity compares, for one worker of the model, the router's token ids of
// the probe prompts with the engine's POST /tokenize. A mismatch means every
// overlap the router computes for the model will be 0.
func (r *Router) checkParity(ctx context.Context, w *Worker) parityResult {
	res := parityResult{model: w.Model, worker: w.ID}
	tok := r.tokenizer(w.Model)
	chat := openai.ChatRequest{Model: w.Model, Messages: parityMessages}
	wantChat, err := chat.PromptTokens(tok)
	if err != nil {
		res.detail = "the router cannot render the probe chat: " + err.Error()
		return res
	}
	for _, probe := range []struct {
		name string
		body any
		want []uint32
	}{
		{"text", map[string]any{"model": w.Model, "prompt": parityText}, tok.Encode(parityText, true)},
		{"chat", map[string]any{"model": w.Model, "messages": parityMessages, "add_generation_prompt": true}, wantChat},
	} {
		got, err := engineTokenize(ctx, r.hc, w, probe.body)
		if err != nil {
			res.detail, res.unreachable = fmt.Sprintf("%s probe: %v", probe.name, err), true
			return res
		}
		if !slices.Equal(got, probe.want) {
			res.detail = fmt.Sprintf("%s probe: the engine's %d tokens differ from the router's %d (first engine ids %v, router %v)",
				probe.name, len(got), len(probe.want), got[:min(8, len(got))], probe.want[:min(8, len(probe.want))])
			return res
		}
	}
	res.match = true
	return res
}

func engineTokenize(ctx context.Context, hc *http.Client, w *Worker, body any) ([]uint32, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	b, err := json.Marshal(body)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.URL+"/tokenize", bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("POST %s/tokenize: %s", w.URL, resp.Status)
	}
	var out struct {
		Tokens []uint32 `json:"tokens"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxModelsBody)).Decode(&out); err != nil {
		return nil, fmt.Errorf("POST %s/tokenize: %w", w.URL, err)
	}
	return out.Tokens, nil
}

// probeParity checks every model of the fleet once (on the first of its workers
// that answers) and sets kvindex_router_token_parity. It returns whether every
// model got an answer.
func (r *Router) probeParity(ctx context.Context) bool {
	done := map[string]bool{}
	models := map[string]bool{}
	for _, w := range r.fleet.Workers() {
		models[w.Model] = true
		if done[w.Model] {
			continue
		}
		res := r.checkParity(ctx, w)
		if res.unreachable {
			r.log.Debug("token parity: worker unreachable; trying the model's next worker", "worker", w.ID, "detail", res.detail)
			continue
		}
		done[w.Model] = true
		if res.match {
			r.metrics.tokenParity.WithLabelValues(w.Model).Set(1)
			r.log.Info("token parity: the router's token ids equal the engine's", "model", w.Model, "worker", w.ID)
		} else {
			r.metrics.tokenParity.WithLabelValues(w.Model).Set(0)
			r.log.Warn("token parity FAILED: every KV overlap for this model will be 0; give the router the model's tokenizer (--tokenizer model=dir)",
				"model", w.Model, "worker", w.ID, "detail", res.detail)
		}
	}
	return len(done) == len(models)
}

// watchParity probes at start and every --parity-interval; while some model's
// workers do not answer yet (engines still starting), it asks again every
// --workers-refresh.
func (r *Router) watchParity(ctx context.Context) {
	for {
		wait := r.cfg.ParityInterval
		if !r.probeParity(ctx) {
			wait = min(wait, r.cfg.WorkersRefresh)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}
