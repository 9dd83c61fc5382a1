package kvindexv1

// A write or linearizable read sent to a follower fails with gRPC code
// UNAVAILABLE and a google.rpc.ErrorInfo detail carrying these values, so
// that clients can follow the leader. The server (internal/server) writes them and
// the Go client (clients/go) reads them; they are wire contract.
const (
	// ErrorDomain is the ErrorInfo domain of kvindex errors.
	ErrorDomain = "kvindex.io"
	// NotLeaderReason is the ErrorInfo reason of a not-leader error.
	NotLeaderReason = "NOT_LEADER"
	// LeaderIDKey is the ErrorInfo metadata key of the leader's node id.
	LeaderIDKey = "leader_id"
	// LeaderAddrKey is the ErrorInfo metadata key of the leader's gRPC address.
	LeaderAddrKey = "leader_addr"
)

// WatchFromKey is the response header of a Watch stream that carries, in
// decimal, the applied index the subscription starts after: the stream
// delivers every change applied after it. A client that loses the stream
// before any change resumes after it (WatchRequest.after_applied_index).
const WatchFromKey = "kvindex-watch-from"
