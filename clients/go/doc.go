// Package kvindex is the Go client of a kvindex cluster: a typed gRPC client of
// the kvindex.v1 IndexService and AdminService (api/proto/kvindex/v1) that
// dials any member, retries idempotent calls on another member when one is
// unavailable, and sends writes to the leader, following a follower's
// not-leader answer (an errdetails.ErrorInfo with reason NOT_LEADER and the
// leader's gRPC address) to it. A write that must not run twice
// (UnregisterWorker, Join, Leave) is sent only over a connection that is up:
// a member that cannot be reached is passed over for the next one, since
// nothing was sent to it, while a failure after the call was sent is returned.
//
// Import it as
//
//	kvindex "github.com/kvindex/kvindex/clients/go"
//
// Concurrency: a Client is safe for concurrent use; it keeps one gRPC
// connection per member address, made on first use.
package kvindex
