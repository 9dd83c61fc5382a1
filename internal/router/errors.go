package router

import (
	"encoding/json"
	"errors"
	"net/http"

	"github.com/kvindex/kvindex/internal/openai"
	"github.com/kvindex/kvindex/internal/tokenize"
)

// Errors of the proxy itself.
var (
	// ErrTooLarge: the body exceeds --max-body-bytes (413).
	ErrTooLarge = errors.New("request body too large")
	// ErrBodyTimeout: the body did not arrive within --body-read-timeout (408).
	ErrBodyTimeout = errors.New("request body timed out")
	// ErrUpstream: every attempt failed before a response could be relayed (502).
	ErrUpstream = errors.New("upstream failed")
	// ErrUpstreamTimeout: the engine did not answer within --first-byte-timeout
	// (--request-idle-timeout for a non-streamed answer) or stalled past
	// --request-idle-timeout (504).
	ErrUpstreamTimeout = errors.New("upstream timed out")
)

// errorStatus is the one table from the router's errors to HTTP status and the
// OpenAI error type.
var errorStatus = []struct {
	err    error
	status int
	kind   string
}{
	{ErrBadRequest, http.StatusBadRequest, "BadRequestError"},
	{openai.ErrBadRequest, http.StatusBadRequest, "BadRequestError"},
	{tokenize.ErrInvalidMessages, http.StatusBadRequest, "BadRequestError"},
	{tokenize.ErrInvalidTokenID, http.StatusBadRequest, "BadRequestError"},
	{ErrUnknownWorker, http.StatusBadRequest, "BadRequestError"},
	{ErrUnknownModel, http.StatusNotFound, "NotFoundError"},
	{ErrTooLarge, http.StatusRequestEntityTooLarge, "BadRequestError"},
	{ErrBodyTimeout, http.StatusRequestTimeout, "BadRequestError"},
	{ErrQueueFull, http.StatusTooManyRequests, "RateLimitError"},
	{ErrQueueTimeout, http.StatusTooManyRequests, "RateLimitError"},
	{ErrNoWorkers, http.StatusServiceUnavailable, "ServiceUnavailableError"},
	{ErrUpstreamTimeout, http.StatusGatewayTimeout, "TimeoutError"},
	{ErrUpstream, http.StatusBadGateway, "UpstreamError"},
}

func statusOf(err error) (int, string) {
	for _, e := range errorStatus {
		if errors.Is(err, e.err) {
			return e.status, e.kind
		}
	}
	return http.StatusInternalServerError, "InternalServerError"
}

// errorBody is OpenAI's error shape, as vLLM answers it.
type errorBody struct {
	Error errorDetail `json:"error"`
}

type errorDetail struct {
	Message string `json:"message"`
	Type    string `json:"type"`
	Param   any    `json:"param"`
	Code    int    `json:"code"`
}

func errorJSON(status int, kind, msg string) []byte {
	b, _ := json.Marshal(errorBody{Error: errorDetail{Message: msg, Type: kind, Code: status}})
	return b
}

// writeError answers err with its status and an OpenAI error body; 429s carry
// Retry-After.
func writeError(w http.ResponseWriter, err error) {
	status, kind := statusOf(err)
	if status == http.StatusTooManyRequests {
		w.Header().Set("Retry-After", "1")
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(errorJSON(status, kind, err.Error()))
}
