package server

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	kvindexv1 "github.com/kvindex/kvindex/api/proto/kvindex/v1"
)

// TestErrorsKeepTheirKindThroughAnotherMember sends every row of the error
// table through a member's gRPC answer and back (grpcError, then fromRemote,
// as a follower forwarding a write sees it): the code, gRPC code and HTTP
// status must be the ones the leader gave. Several kinds share a gRPC code
// (RESOURCE_EXHAUSTED is too_large, resource_exhausted or watch_lagging), so
// the code alone cannot carry them.
func TestErrorsKeepTheirKindThroughAnotherMember(t *testing.T) {
	for _, row := range errorTable {
		t.Run(row.code+"/"+row.err.Error(), func(t *testing.T) {
			var err error = fmt.Errorf("on the leader: %w", row.err)
			if errors.Is(row.err, ErrNotLeader) {
				err = &NotLeaderError{LeaderID: "n2", LeaderAddr: "127.0.0.1:7"}
			}
			want := classify(err)
			got := classify(fromRemote("127.0.0.1:9", grpcError(err)))
			if got.code != want.code || got.grpc != want.grpc || got.http != want.http {
				t.Errorf("through a member: %s %s %d, want %s %s %d", got.code, got.grpc, got.http, want.code, want.grpc, want.http)
			}
		})
	}
	if upper := strings.ToUpper("not_leader"); upper != kvindexv1.NotLeaderReason {
		t.Errorf("not_leader's reason is %q, the API's NotLeaderReason %q", upper, kvindexv1.NotLeaderReason)
	}
	// gRPC's own errors carry no ErrorInfo: their code decides.
	if got := classify(fromRemote("127.0.0.1:9", status.Error(codes.Aborted, "lost"))); got.code != "conflict" {
		t.Errorf("a bare ABORTED from a member classifies as %s, want conflict", got.code)
	}
	if got := classify(fromRemote("127.0.0.1:9", status.Error(codes.DataLoss, "?"))); got.code != "internal" {
		t.Errorf("an unknown code from a member classifies as %s, want internal", got.code)
	}
}
