package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	kvindexv1 "github.com/kvindex/kvindex/api/proto/kvindex/v1"
	"github.com/kvindex/kvindex/internal/ingest"
	"github.com/kvindex/kvindex/internal/raftstore"
	"github.com/kvindex/kvindex/internal/tokenize"
	"github.com/kvindex/kvindex/internal/workerspec"
)

// Sentinel errors of the API. Handlers wrap them with %w and a message naming
// the field or the resource; errorTable maps each to a gRPC code, an HTTP status
// and the stable code string of JSON error bodies.
var (
	// ErrInvalidArgument: the request is malformed (bad JSON, a field of the
	// wrong type, a value out of range, invalid UTF-8, conflicting fields).
	ErrInvalidArgument = errors.New("invalid argument")
	// ErrUnknownModel: text or chat input for a model without a tokenizer.
	ErrUnknownModel = errors.New("unknown model")
	// ErrNotFound: the named worker (or other resource) does not exist.
	ErrNotFound = errors.New("not found")
	// ErrAlreadyExists: a worker with the id is registered with another spec.
	ErrAlreadyExists = errors.New("already exists")
	// ErrFailedPrecondition: the request is valid but the state forbids it.
	ErrFailedPrecondition = errors.New("failed precondition")
	// ErrUnauthenticated: an admin call without the bearer token.
	ErrUnauthenticated = errors.New("unauthenticated")
	// ErrPermissionDenied: an admin call with a wrong bearer token.
	ErrPermissionDenied = errors.New("permission denied")
	// ErrTooLarge: a body, a prompt or a hash list over its limit.
	ErrTooLarge = errors.New("too large")
	// ErrTooMany: a limit on concurrent requests of a kind (Watch streams,
	// dumps) is reached; healthy clients of other kinds are still served.
	ErrTooMany = errors.New("too many concurrent requests")
	// ErrRequestTimeout: the client did not send its request (a slow body)
	// within --http-read-timeout.
	ErrRequestTimeout = errors.New("request timeout")
	// ErrConflict: a compare-and-set lost to a concurrent change; read again and retry.
	ErrConflict = errors.New("conflicting change")
	// ErrWatchLagging: a Watch stream fell too far behind the apply loop.
	ErrWatchLagging = errors.New("watcher fell behind")
	// ErrWatchResumeUnavailable: a Watch asked to resume after an applied index
	// this member no longer has every change after (or never computed them):
	// the caller must start over from a Dump.
	ErrWatchResumeUnavailable = errors.New("watch cannot resume there")
	// ErrNotLeader: a write reached a node that is not the leader; a
	// *NotLeaderError says where the leader is.
	ErrNotLeader = errors.New("not the leader")
	// ErrUnavailable: the node cannot serve now (starting, stopping, no leader).
	ErrUnavailable = errors.New("unavailable")
	// ErrNotSupported: the operation does not exist in this version
	// (sequence-hash lookups, removing one dp rank).
	ErrNotSupported = errors.New("not supported")
)

// NotLeaderError is returned for a write sent to a follower. errors.Is(err,
// ErrNotLeader) holds. gRPC clients find LeaderID and LeaderAddr in an
// errdetails.ErrorInfo (reason NOT_LEADER, metadata leader_id and leader_addr);
// HTTP clients in the error body's "leader_id"/"leader_addr" and the
// X-Kvindex-Leader header.
type NotLeaderError struct {
	LeaderID   string // empty when no leader is known
	LeaderAddr string // the leader's gRPC address, empty when unknown
}

func (e *NotLeaderError) Error() string {
	if e.LeaderID == "" {
		return "not the leader (no leader known)"
	}
	return fmt.Sprintf("not the leader (leader is %s at %s)", e.LeaderID, e.LeaderAddr)
}

// Is makes errors.Is(err, ErrNotLeader) hold.
func (e *NotLeaderError) Is(target error) bool { return target == ErrNotLeader }

// errorClass is one row of the error table.
type errorClass struct {
	err  error
	grpc codes.Code
	http int
	code string // the "code" of JSON error bodies
}

// errorTable is the one place where errors become gRPC codes and HTTP
// statuses: the first row whose err matches (errors.Is) wins. Errors of other
// packages that reach the API are listed beside ours.
var errorTable = []errorClass{
	{ErrInvalidArgument, codes.InvalidArgument, http.StatusBadRequest, "invalid_argument"},
	{workerspec.ErrInvalid, codes.InvalidArgument, http.StatusBadRequest, "invalid_argument"},
	{raftstore.ErrInvalidEntry, codes.InvalidArgument, http.StatusBadRequest, "invalid_argument"},
	{tokenize.ErrInvalidMessages, codes.InvalidArgument, http.StatusBadRequest, "invalid_argument"},
	{ErrUnknownModel, codes.NotFound, http.StatusNotFound, "unknown_model"},
	{tokenize.ErrUnknownModel, codes.NotFound, http.StatusNotFound, "unknown_model"},
	{ErrNotFound, codes.NotFound, http.StatusNotFound, "not_found"},
	{ErrAlreadyExists, codes.AlreadyExists, http.StatusConflict, "already_exists"},
	{ErrConflict, codes.Aborted, http.StatusConflict, "conflict"},
	{ErrFailedPrecondition, codes.FailedPrecondition, http.StatusBadRequest, "failed_precondition"},
	{ingest.ErrWorkerConflict, codes.FailedPrecondition, http.StatusBadRequest, "failed_precondition"},
	{tokenize.ErrNotSupported, codes.FailedPrecondition, http.StatusBadRequest, "failed_precondition"},
	{ErrUnauthenticated, codes.Unauthenticated, http.StatusUnauthorized, "unauthenticated"},
	{ErrPermissionDenied, codes.PermissionDenied, http.StatusForbidden, "permission_denied"},
	{ErrTooLarge, codes.ResourceExhausted, http.StatusRequestEntityTooLarge, "too_large"},
	{ErrTooMany, codes.ResourceExhausted, http.StatusTooManyRequests, "resource_exhausted"},
	{ErrRequestTimeout, codes.DeadlineExceeded, http.StatusRequestTimeout, "request_timeout"},
	{ErrWatchLagging, codes.ResourceExhausted, http.StatusTooManyRequests, "watch_lagging"},
	{ErrWatchResumeUnavailable, codes.OutOfRange, http.StatusGone, "watch_resume_unavailable"},
	{ErrNotLeader, codes.Unavailable, http.StatusServiceUnavailable, "not_leader"},
	{ErrUnavailable, codes.Unavailable, http.StatusServiceUnavailable, "unavailable"},
	{ingest.ErrSinkStopped, codes.Unavailable, http.StatusServiceUnavailable, "unavailable"},
	{ingest.ErrClosed, codes.Unavailable, http.StatusServiceUnavailable, "unavailable"},
	{ErrNotSupported, codes.Unimplemented, http.StatusNotImplemented, "not_supported"},
	{context.Canceled, codes.Canceled, 499, "canceled"}, // 499: nginx's "client closed request"
	{context.DeadlineExceeded, codes.DeadlineExceeded, http.StatusGatewayTimeout, "deadline_exceeded"},
}

var internalClass = errorClass{grpc: codes.Internal, http: http.StatusInternalServerError, code: "internal"}

func classify(err error) errorClass {
	for _, c := range errorTable {
		if errors.Is(err, c.err) {
			return c
		}
	}
	return internalClass
}

// grpcError turns err into a gRPC status error through the error table. Every
// classified error carries an ErrorInfo detail whose reason is its code string
// upper-cased (so a member that forwarded the call, or a client, can tell apart
// the kinds that share a gRPC code); a NotLeaderError's also names the leader.
func grpcError(err error) error {
	if err == nil {
		return nil
	}
	if _, isStatus := status.FromError(err); isStatus {
		return err
	}
	class := classify(err)
	st := status.New(class.grpc, err.Error())
	if class.err == nil {
		return st.Err() // internal: nothing a caller could act on
	}
	info := &errdetails.ErrorInfo{Reason: strings.ToUpper(class.code), Domain: kvindexv1.ErrorDomain}
	var nl *NotLeaderError
	if errors.As(err, &nl) {
		info.Metadata = map[string]string{kvindexv1.LeaderIDKey: nl.LeaderID, kvindexv1.LeaderAddrKey: nl.LeaderAddr}
	}
	if withInfo, derr := st.WithDetails(info); derr == nil {
		st = withInfo
	}
	return st.Err()
}

// kindOfReason is the sentinel of an ErrorInfo reason grpcError wrote (the
// first row with that code string), or nil.
func kindOfReason(reason string) error {
	for _, c := range errorTable {
		if strings.ToUpper(c.code) == reason {
			return c.err
		}
	}
	return nil
}

// errorBody is the JSON body of every REST error: {"error": {"code", "message"}},
// plus the leader of a not_leader error.
type errorBody struct {
	Error errorDetail `json:"error"`
}

type errorDetail struct {
	Code       string `json:"code"`
	Message    string `json:"message"`
	LeaderID   string `json:"leader_id,omitempty"`
	LeaderAddr string `json:"leader_addr,omitempty"`
}

// LeaderHeader names the HTTP response header carrying the leader's gRPC
// address on a not_leader error.
const LeaderHeader = "X-Kvindex-Leader"

// writeError writes err as a JSON error body with the status the table gives.
func writeError(w http.ResponseWriter, err error) {
	c := classify(err)
	body := errorBody{Error: errorDetail{Code: c.code, Message: err.Error()}}
	var nl *NotLeaderError
	if errors.As(err, &nl) {
		body.Error.LeaderID, body.Error.LeaderAddr = nl.LeaderID, nl.LeaderAddr
		if nl.LeaderAddr != "" {
			w.Header().Set(LeaderHeader, nl.LeaderAddr)
		}
	}
	writeJSON(w, c.http, body)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	data, err := json.Marshal(v)
	if err != nil {
		code = http.StatusInternalServerError
		data = []byte(`{"error":{"code":"internal","message":"encoding the response failed"}}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	w.Write(append(data, '\n'))
}

func invalidArg(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidArgument, fmt.Sprintf(format, args...))
}
