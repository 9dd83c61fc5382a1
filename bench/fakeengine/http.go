package fakeengine

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvindex/kvindex/internal/openai"
	"github.com/kvindex/kvindex/internal/tokenize"
)

// maxBodyBytes bounds request bodies.
const maxBodyBytes = 32 << 20

// Response headers with the simulated timing of a request (trailers when
// streaming), and the rank that served it.
const (
	HeaderSimTTFT = "X-Sim-Ttft-Ms"
	HeaderSimE2E  = "X-Sim-E2e-Ms"
	HeaderDPRank  = "X-Data-Parallel-Rank"
)

// Handler returns the engine's HTTP API:
//
//	POST /v1/completions, /v1/chat/completions   OpenAI, streaming (SSE) or not
//	POST /tokenize, /detokenize                  vLLM
//	GET  /v1/models, /health, /metrics           vLLM
//	POST /reset_prefix_cache                     vLLM (409 while requests run)
//	GET  /debug/kv-blocks                        true cache contents (Truth)
//	GET  /admin/faults, POST /admin/faults       injected faults (see faultsJSON)
//	POST /admin/restart-event-stream             simulated engine restart
//
// A request may pin its data-parallel rank with the X-Data-Parallel-Rank header.
func (e *Engine) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/completions", e.handleCompletions)
	mux.HandleFunc("POST /v1/chat/completions", e.handleChat)
	mux.HandleFunc("POST /tokenize", e.handleTokenize)
	mux.HandleFunc("POST /detokenize", e.handleDetokenize)
	mux.HandleFunc("GET /v1/models", e.handleModels)
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.Handle("GET /metrics", promhttp.HandlerFor(e.m.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("POST /reset_prefix_cache", e.handleResetPrefixCache)
	mux.HandleFunc("GET /debug/kv-blocks", func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, http.StatusOK, e.CacheTruth()) })
	mux.HandleFunc("GET /admin/faults", func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, http.StatusOK, e.Faults()) })
	mux.HandleFunc("POST /admin/faults", e.handleSetFaults)
	mux.HandleFunc("POST /admin/restart-event-stream", e.handleRestart)
	return mux
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, msg string) {
	typ := map[int]string{400: "BadRequestError", 404: "NotFoundError", 409: "ConflictError",
		429: "RateLimitError", 503: "ServiceUnavailableError"}[status]
	if typ == "" {
		typ = "InternalServerError"
	}
	writeJSON(w, status, errorBody{errorDetail{Message: msg, Type: typ, Code: status}})
}

// statusOf maps engine errors to HTTP statuses.
func statusOf(err error) int {
	switch {
	case errors.Is(err, ErrBadRequest), errors.Is(err, openai.ErrBadRequest), errors.Is(err, tokenize.ErrInvalidMessages), errors.Is(err, tokenize.ErrInvalidTokenID):
		return http.StatusBadRequest
	case errors.Is(err, ErrModelNotFound):
		return http.StatusNotFound
	case errors.Is(err, ErrCacheInUse):
		return http.StatusConflict
	case errors.Is(err, ErrEngineClosed):
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}

func decodeBody(w http.ResponseWriter, r *http.Request, v any) error {
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err != nil {
		return fmt.Errorf("%w: reading body: %v", ErrBadRequest, err)
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("%w: %v", ErrBadRequest, err)
	}
	return nil
}

func newID(prefix string) string {
	var b [12]byte
	rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

func (e *Engine) handleCompletions(w http.ResponseWriter, r *http.Request) {
	var body openai.CompletionRequest
	if err := decodeBody(w, r, &body); err != nil {
		writeError(w, statusOf(err), err.Error())
		return
	}
	if err := openai.CheckN(body.N); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	prompt, err := body.PromptTokens(e.tok)
	if err != nil {
		writeError(w, statusOf(err), err.Error())
		return
	}
	kv, err := kvTransferParams(body.KVTransferParams)
	if err != nil {
		writeError(w, statusOf(err), err.Error())
		return
	}
	req := Request{Prompt: prompt, Model: body.Model, CacheSalt: body.CacheSalt, KVTransfer: kv}
	if body.MaxTokens != nil {
		req.MaxTokens = int(*body.MaxTokens)
	}
	e.serveGeneration(w, r, req, generation{kind: kindCompletion, model: body.Model, stream: body.Stream, opts: body.StreamOptions})
}

func (e *Engine) handleChat(w http.ResponseWriter, r *http.Request) {
	var body openai.ChatRequest
	if err := decodeBody(w, r, &body); err != nil {
		writeError(w, statusOf(err), err.Error())
		return
	}
	if err := openai.CheckN(body.N); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	prompt, err := body.PromptTokens(e.tok)
	if err != nil {
		writeError(w, statusOf(err), err.Error())
		return
	}
	kv, err := kvTransferParams(body.KVTransferParams)
	if err != nil {
		writeError(w, statusOf(err), err.Error())
		return
	}
	req := Request{Prompt: prompt, Model: body.Model, CacheSalt: body.CacheSalt, KVTransfer: kv}
	switch {
	case body.MaxCompletionTokens != nil:
		req.MaxTokens = int(*body.MaxCompletionTokens)
	case body.MaxTokens != nil:
		req.MaxTokens = int(*body.MaxTokens)
	}
	e.serveGeneration(w, r, req, generation{kind: kindChat, model: body.Model, stream: body.Stream, opts: body.StreamOptions})
}

type genKind uint8

const (
	kindCompletion genKind = iota
	kindChat
)

type generation struct {
	kind   genKind
	model  string
	stream bool
	opts   *openai.StreamOptions
}

func (e *Engine) serveGeneration(w http.ResponseWriter, r *http.Request, req Request, g generation) {
	if g.model == "" {
		g.model = e.cfg.Model
	}
	if h := r.Header.Get(HeaderDPRank); h != "" {
		rank, err := strconv.ParseUint(h, 10, 32)
		if err != nil {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("%s: %q is not a rank", HeaderDPRank, h))
			return
		}
		req.PinDPRank, req.DPRank = true, uint32(rank)
	}
	f := e.Faults()
	if e.shouldFail(f.FailRate) {
		e.m.faults.WithLabelValues("fail_" + strconv.Itoa(f.FailStatus)).Inc()
		writeError(w, f.FailStatus, "injected fault")
		return
	}
	if f.HangBeforeFirstToken > 0 {
		e.m.faults.WithLabelValues("hang").Inc()
		t := time.NewTimer(f.HangBeforeFirstToken)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			return
		}
	}
	s, err := e.Submit(req)
	if err != nil {
		writeError(w, statusOf(err), err.Error())
		return
	}
	defer s.Close()
	id, object := newID("cmpl-"), "text_completion"
	if g.kind == kindChat {
		id, object = newID("chatcmpl-"), "chat.completion"
	}
	if g.stream {
		e.streamGeneration(w, r.Context(), s, g, id, object+chunkSuffix(g.kind), f)
		return
	}
	var out []uint32
	for {
		tok, err := s.Next(r.Context())
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			if r.Context().Err() == nil {
				writeError(w, statusOf(err), err.Error())
			}
			return
		}
		out = append(out, tok)
	}
	res := s.Result()
	text, err := e.tok.Decode(out)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	setTiming(w.Header(), res)
	finish := res.FinishReason
	resp := response{ID: id, Object: object, Created: time.Now().Unix(), Model: g.model,
		Usage: usageOf(res, len(out)), KVTransferParams: res.KVTransfer}
	if g.kind == kindChat {
		resp.Choices = []chatChoice{{Message: &chatMessage{Role: "assistant", Content: text, ToolCalls: []any{}}, FinishReason: &finish}}
	} else {
		resp.Choices = []completionChoice{{Text: text, FinishReason: &finish}}
	}
	writeJSON(w, http.StatusOK, resp)
}

func chunkSuffix(k genKind) string {
	if k == kindChat {
		return ".chunk"
	}
	return ""
}

func setTiming(h http.Header, res Result) {
	h.Set(HeaderSimTTFT, strconv.FormatFloat(float64(res.SimTTFT)/float64(time.Millisecond), 'f', 3, 64))
	h.Set(HeaderSimE2E, strconv.FormatFloat(float64(res.SimE2E)/float64(time.Millisecond), 'f', 3, 64))
	h.Set(HeaderDPRank, strconv.Itoa(int(res.DPRank)))
}

// streamGeneration writes SSE chunks as vLLM does: nothing until the first token
// (so errors before it are plain HTTP errors and a hang sends no byte), a chunk per
// token (the chat role delta with the first), a final chunk with finish_reason, an
// optional usage chunk, then [DONE]. Timing goes out as trailers.
// f's AbortAfterTokens and StallAfterTokens break or stall the stream (faults).
func (e *Engine) streamGeneration(w http.ResponseWriter, ctx context.Context, s *Stream, g generation, id, object string, f Faults) {
	flusher, _ := w.(http.Flusher)
	created := time.Now().Unix()
	started := false
	send := func(v any) {
		data, _ := json.Marshal(v)
		fmt.Fprintf(w, "data: %s\n\n", data)
		if flusher != nil {
			flusher.Flush()
		}
	}
	start := func() {
		h := w.Header()
		h.Set("Content-Type", "text/event-stream")
		h.Set("Cache-Control", "no-cache")
		h.Set("Trailer", HeaderSimTTFT+", "+HeaderSimE2E+", "+HeaderDPRank)
		w.WriteHeader(http.StatusOK)
		started = true
	}
	chunk := func(text string, first bool, finish *string) response {
		c := response{ID: id, Object: object, Created: created, Model: g.model}
		if g.kind == kindChat {
			d := &chatDelta{Content: text}
			if first {
				d.Role = "assistant"
			}
			c.Choices = []chatChoice{{Delta: d, FinishReason: finish}}
		} else {
			c.Choices = []completionChoice{{Text: text, FinishReason: finish}}
		}
		return c
	}
	n := 0
	for {
		tok, err := s.Next(ctx)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if !started {
				writeError(w, statusOf(err), err.Error())
				return
			}
			send(errorBody{errorDetail{Message: err.Error(), Type: "InternalServerError", Code: statusOf(err)}})
			fmt.Fprint(w, "data: [DONE]\n\n")
			return
		}
		if !started {
			start()
		}
		text, _ := e.tok.Decode([]uint32{tok})
		send(chunk(text, n == 0, nil))
		n++
		if n == f.AbortAfterTokens {
			e.m.faults.WithLabelValues("abort").Inc()
			panic(http.ErrAbortHandler) // the client sees the connection break mid-stream
		}
		if n == f.StallAfterTokens {
			e.m.faults.WithLabelValues("stall").Inc()
			<-ctx.Done() // hung until the client leaves; the deferred Close aborts the request
			return
		}
	}
	res := s.Result()
	finish := res.FinishReason
	final := chunk("", false, &finish)
	final.KVTransferParams = res.KVTransfer
	send(final)
	if g.opts != nil && g.opts.IncludeUsage {
		send(response{ID: id, Object: object, Created: created, Model: g.model, Choices: []any{}, Usage: usageOf(res, n)})
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
	setTiming(w.Header(), res)
}

func (e *Engine) handleTokenize(w http.ResponseWriter, r *http.Request) {
	var body tokenizeRequest
	if err := decodeBody(w, r, &body); err != nil {
		writeError(w, statusOf(err), err.Error())
		return
	}
	if err := e.checkModel(body.Model); err != nil {
		writeError(w, statusOf(err), err.Error())
		return
	}
	var ids []uint32
	switch {
	case body.Prompt != nil && body.Messages != nil:
		writeError(w, http.StatusBadRequest, "give either prompt or messages, not both")
		return
	case body.Prompt != nil:
		ids = e.tok.Encode(*body.Prompt, body.AddSpecialTokens == nil || *body.AddSpecialTokens)
	case body.Messages != nil:
		text, err := e.tok.ApplyChatTemplate(body.Messages, tokenize.ChatOptions{
			AddGenerationPrompt:  body.AddGenerationPrompt == nil || *body.AddGenerationPrompt,
			ContinueFinalMessage: body.ContinueFinalMessage,
			Tools:                body.Tools,
			Kwargs:               body.ChatTemplateKwargs,
		})
		if err != nil {
			writeError(w, statusOf(err), err.Error())
			return
		}
		ids = e.tok.Encode(text, body.AddSpecialTokens != nil && *body.AddSpecialTokens)
	default:
		writeError(w, http.StatusBadRequest, "prompt or messages is required")
		return
	}
	resp := tokenizeResponse{Count: len(ids), MaxModelLen: e.cfg.MaxModelLen, Tokens: ids}
	if body.ReturnTokenStrs {
		resp.TokenStrs = make([]string, len(ids))
		for i, id := range ids {
			resp.TokenStrs[i], _ = e.tok.Decode([]uint32{id})
		}
	}
	writeJSON(w, http.StatusOK, resp)
}

func (e *Engine) handleDetokenize(w http.ResponseWriter, r *http.Request) {
	var body detokenizeRequest
	if err := decodeBody(w, r, &body); err != nil {
		writeError(w, statusOf(err), err.Error())
		return
	}
	if err := e.checkModel(body.Model); err != nil {
		writeError(w, statusOf(err), err.Error())
		return
	}
	text, err := e.tok.Decode(body.Tokens)
	if err != nil {
		writeError(w, statusOf(err), err.Error())
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"prompt": text})
}

func (e *Engine) checkModel(model string) error {
	if model == "" || model == e.cfg.Model {
		return nil
	}
	if _, ok := e.loras[model]; ok {
		return nil
	}
	return fmt.Errorf("%w: the model `%s` does not exist", ErrModelNotFound, model)
}

func (e *Engine) handleModels(w http.ResponseWriter, _ *http.Request) {
	created := time.Now().Unix()
	list := modelList{Object: "list", Data: []modelCard{{ID: e.cfg.Model, Object: "model", Created: created,
		OwnedBy: "vllm", Root: e.cfg.Model, MaxModelLen: e.cfg.MaxModelLen}}}
	for _, name := range e.cfg.LoRAModules {
		base := e.cfg.Model
		list.Data = append(list.Data, modelCard{ID: name, Object: "model", Created: created, OwnedBy: "vllm",
			Root: name, Parent: &base, MaxModelLen: e.cfg.MaxModelLen})
	}
	writeJSON(w, http.StatusOK, list)
}

func (e *Engine) handleResetPrefixCache(w http.ResponseWriter, _ *http.Request) {
	if err := e.ResetPrefixCache(); err != nil {
		writeError(w, statusOf(err), err.Error())
		return
	}
	w.WriteHeader(http.StatusOK)
}

func (e *Engine) handleSetFaults(w http.ResponseWriter, r *http.Request) {
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	f, err := e.Faults().patch(data)
	if err == nil {
		err = e.SetFaults(f)
	}
	if err != nil {
		writeError(w, statusOf(err), err.Error())
		return
	}
	writeJSON(w, http.StatusOK, f)
}

func (e *Engine) handleRestart(w http.ResponseWriter, _ *http.Request) {
	if err := e.RestartEventStream(); err != nil {
		writeError(w, statusOf(err), err.Error())
		return
	}
	writeJSON(w, http.StatusOK, map[string]bool{"restarted": true})
}
