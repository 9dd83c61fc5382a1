package kvindex

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"sync"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	kvindexv1 "github.com/kvindex/kvindex/api/proto/kvindex/v1"
	"github.com/kvindex/kvindex/internal/retry"
)

// Options configure a Client.
type Options struct {
	// Addrs are the gRPC addresses (host:port) of the cluster's members; at
	// least one. Reads go to the first that answers, writes to the leader.
	Addrs []string
	// TLS, when set, dials with TLS (add a client certificate for mTLS);
	// plaintext otherwise.
	TLS *tls.Config
	// AdminToken is sent as "authorization: Bearer <token>" with writes.
	AdminToken string
	// MaxAttempts bounds the tries of one call over members and leader
	// redirects (and a Watch's consecutive failed resumes); 0 means
	// max(len(Addrs) + 2, 10), which with the default backoff spans an
	// election of a few seconds.
	MaxAttempts int
	// MinBackoff and MaxBackoff bound the pause between two attempts, which
	// doubles from MinBackoff up to MaxBackoff with random jitter (between half
	// and all of it), and never outlasts the call's context (0: 25 ms and 1 s).
	// A read tries every member once before it pauses; a redirect to the
	// leader is followed at once.
	MinBackoff, MaxBackoff time.Duration
	// DialOptions are added to every connection's.
	DialOptions []grpc.DialOption
}

// Client talks to a kvindex cluster over gRPC. Reads (Score, QueryByHash,
// Workers, Stats, Cluster) are idempotent and retried on another member when
// one is unavailable; writes (RegisterWorker, UnregisterWorker, Join, Leave) go
// to the leader, following a follower's not-leader answer to the leader it
// names. Safe for concurrent use.
type Client struct {
	opts    Options
	backoff retry.Backoff

	mu     sync.Mutex
	conns  map[string]*grpc.ClientConn // guarded by mu
	leader string                      // last known leader address; guarded by mu
	failed string                      // member a write last found unavailable; guarded by mu
	next   int                         // member to start reads at; guarded by mu
}

// ErrNoMembers: Options.Addrs is empty.
var ErrNoMembers = errors.New("kvindex: no member addresses")

// New returns a client of the members in opts.Addrs. Connections are made
// lazily, on first use.
func New(opts Options) (*Client, error) {
	if len(opts.Addrs) == 0 {
		return nil, ErrNoMembers
	}
	opts.Addrs = slices.Clone(opts.Addrs)
	if opts.MaxAttempts <= 0 {
		opts.MaxAttempts = max(len(opts.Addrs)+2, 10)
	}
	b := retry.Backoff{Initial: cmp.Or(opts.MinBackoff, retry.Default.Initial), Max: cmp.Or(opts.MaxBackoff, retry.Default.Max)}
	if err := b.Validate(); err != nil {
		return nil, fmt.Errorf("kvindex: MinBackoff=%v, MaxBackoff=%v: %w", opts.MinBackoff, opts.MaxBackoff, err)
	}
	return &Client{opts: opts, backoff: b, conns: map[string]*grpc.ClientConn{}}, nil
}

// Close closes every connection.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var errs []error
	for addr, conn := range c.conns {
		errs = append(errs, conn.Close())
		delete(c.conns, addr)
	}
	return errors.Join(errs...)
}

func (c *Client) conn(addr string) (*grpc.ClientConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cc := c.conns[addr]; cc != nil {
		return cc, nil
	}
	creds := insecure.NewCredentials()
	if c.opts.TLS != nil {
		creds = credentials.NewTLS(c.opts.TLS)
	}
	// Fixed windows first, so that the caller's DialOptions can change their
	// sizes (grpc-go has no option that turns its estimator back on).
	opts := append(kvindexv1.FlowControlDialOptions(), grpc.WithTransportCredentials(creds))
	cc, err := grpc.NewClient(addr, append(opts, c.opts.DialOptions...)...)
	if err != nil {
		return nil, fmt.Errorf("kvindex: dialing %s: %w", addr, err)
	}
	c.conns[addr] = cc
	return cc, nil
}

// NotLeader reports whether err is a follower's refusal of a write and, when
// the follower knew it, the leader's gRPC address.
func NotLeader(err error) (leaderAddr string, ok bool) {
	st, isStatus := status.FromError(err)
	if !isStatus || st.Code() != codes.Unavailable {
		return "", false
	}
	for _, d := range st.Details() {
		if info, isInfo := d.(*errdetails.ErrorInfo); isInfo && info.Reason == kvindexv1.NotLeaderReason {
			return info.Metadata[kvindexv1.LeaderAddrKey], true
		}
	}
	return "", false
}

// retriable: the member could not serve the call at all, another may.
func retriable(err error) bool {
	return status.Code(err) == codes.Unavailable
}

// read runs call on one member after another until one answers; once every
// member was tried, it pauses (backoff) before each further attempt.
func (c *Client) read(ctx context.Context, call func(*grpc.ClientConn) error) error {
	c.mu.Lock()
	start := c.next
	c.mu.Unlock()
	var err error
	for attempt := range c.opts.MaxAttempts {
		if n := attempt - len(c.opts.Addrs); n >= 0 {
			if c.backoff.Wait(ctx, n) != nil {
				return err
			}
		}
		addr := c.opts.Addrs[(start+attempt)%len(c.opts.Addrs)]
		if leader, ok := NotLeader(err); ok && leader != "" {
			addr = leader // a linearizable read reached a follower
		}
		cc, dialErr := c.conn(addr)
		if dialErr != nil {
			return dialErr
		}
		if err = call(cc); err == nil || !retriable(err) {
			if err == nil {
				c.mu.Lock()
				c.next = (start + attempt) % len(c.opts.Addrs)
				c.mu.Unlock()
			}
			return err
		}
		if ctx.Err() != nil {
			return err
		}
	}
	return err
}

// write runs call on the leader: the last one known, else the members in
// turn, following not-leader answers. retryUnavailable says whether the call
// may be repeated after an ambiguous failure (it is idempotent); a call that
// may not is sent only over a connection that is up, so that a member that
// cannot be reached (nothing was sent) is passed over for the next one. A
// member that failed with UNAVAILABLE is not taken for the leader again.
func (c *Client) write(ctx context.Context, retryUnavailable bool, call func(context.Context, *grpc.ClientConn) error) error {
	if c.opts.AdminToken != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+c.opts.AdminToken)
	}
	c.mu.Lock()
	addr, failed := c.leader, c.failed
	c.mu.Unlock()
	member := 0
	if addr == "" {
		// The members in turn, from the first, unless it is the one that
		// failed last: its connection state may not show it yet.
		if len(c.opts.Addrs) > 1 && c.opts.Addrs[0] == failed {
			member = 1
		}
		addr = c.opts.Addrs[member]
		member++
	}
	var err error
	pauses := 0
	for range c.opts.MaxAttempts {
		cc, dialErr := c.conn(addr)
		if dialErr != nil {
			return dialErr
		}
		unsent := false
		if retryUnavailable || reachable(ctx, cc) {
			err = call(ctx, cc)
		} else {
			err, unsent = status.Errorf(codes.Unavailable, "kvindex: member %s cannot be reached", addr), true
		}
		if err == nil {
			c.mu.Lock()
			c.leader, c.failed = addr, ""
			c.mu.Unlock()
			return nil
		}
		leader, notLeader := NotLeader(err)
		if notLeader || retriable(err) {
			c.mu.Lock()
			c.leader = "" // not the leader, or gone: an answer of the leader (NotFound, say) keeps it
			if retriable(err) && !notLeader {
				c.failed = addr
			}
			c.mu.Unlock()
		}
		switch {
		case ctx.Err() != nil:
			return err
		case notLeader && leader != "" && leader != addr:
			addr = leader
		case notLeader || (retriable(err) && (retryUnavailable || unsent)):
			// No leader known yet (an election), or the member is down: try
			// the next after a pause.
			addr = c.opts.Addrs[member%len(c.opts.Addrs)]
			member++
			if c.backoff.Wait(ctx, pauses) != nil {
				return err
			}
			pauses++
		default:
			return err
		}
	}
	return err
}

// reachable reports whether cc has a connection up, making one if it has none
// (bounded by ctx and gRPC's connect timeout).
func reachable(ctx context.Context, cc *grpc.ClientConn) bool {
	cc.Connect()
	for {
		state := cc.GetState()
		switch state {
		case connectivity.Ready:
			return true
		case connectivity.TransientFailure, connectivity.Shutdown:
			return false
		}
		if !cc.WaitForStateChange(ctx, state) {
			return false
		}
	}
}

// Score asks, for one prompt (token ids, text or chat messages), how much of its
// prefix each worker caches.
func (c *Client) Score(ctx context.Context, req *kvindexv1.ScoreRequest) (resp *kvindexv1.ScoreResponse, err error) {
	err = c.read(ctx, func(cc *grpc.ClientConn) error {
		resp, err = kvindexv1.NewIndexServiceClient(cc).Score(ctx, req)
		return err
	})
	return resp, err
}

// ScoreTokens is Score for a prompt given as token ids, over workers (every
// worker of the model when none are given).
func (c *Client) ScoreTokens(ctx context.Context, model string, tokens []uint32, workers ...string) (*kvindexv1.ScoreResponse, error) {
	return c.Score(ctx, &kvindexv1.ScoreRequest{Model: model, TokenIds: tokens, Workers: workers})
}

// ScoreText is Score for a prompt given as text, tokenized by the indexer with
// the model's tokenizer.
func (c *Client) ScoreText(ctx context.Context, model, text string, workers ...string) (*kvindexv1.ScoreResponse, error) {
	return c.Score(ctx, &kvindexv1.ScoreRequest{Model: model, Text: text, Workers: workers})
}

// QueryByHash scores block hashes the caller computed (see internal/kvblock).
func (c *Client) QueryByHash(ctx context.Context, req *kvindexv1.QueryByHashRequest) (resp *kvindexv1.QueryByHashResponse, err error) {
	err = c.read(ctx, func(cc *grpc.ClientConn) error {
		resp, err = kvindexv1.NewIndexServiceClient(cc).QueryByHash(ctx, req)
		return err
	})
	return resp, err
}

// Workers lists the registered workers of model (all when empty).
func (c *Client) Workers(ctx context.Context, model string) (resp *kvindexv1.WorkersResponse, err error) {
	err = c.read(ctx, func(cc *grpc.ClientConn) error {
		resp, err = kvindexv1.NewIndexServiceClient(cc).Workers(ctx, &kvindexv1.WorkersRequest{Model: model})
		return err
	})
	return resp, err
}

// Stats describes the index of the member that answers.
func (c *Client) Stats(ctx context.Context) (resp *kvindexv1.StatsResponse, err error) {
	err = c.read(ctx, func(cc *grpc.ClientConn) error {
		resp, err = kvindexv1.NewIndexServiceClient(cc).Stats(ctx, &kvindexv1.StatsRequest{})
		return err
	})
	return resp, err
}

// Cluster describes the raft cluster as the member that answers sees it.
func (c *Client) Cluster(ctx context.Context) (resp *kvindexv1.ClusterResponse, err error) {
	err = c.read(ctx, func(cc *grpc.ClientConn) error {
		resp, err = kvindexv1.NewAdminServiceClient(cc).Cluster(ctx, &kvindexv1.ClusterRequest{})
		return err
	})
	return resp, err
}

// Dump calls fn with every change of a dump of the index of one member (the
// first that answers), in order, and returns the applied index dumped. A dump
// that fails midway is not retried: fn has seen part of it.
func (c *Client) Dump(ctx context.Context, req *kvindexv1.DumpRequest, fn func(*kvindexv1.IndexChange) error) (applied uint64, err error) {
	err = c.read(ctx, func(cc *grpc.ClientConn) error {
		stream, err := kvindexv1.NewIndexServiceClient(cc).Dump(ctx, req)
		if err != nil {
			return err
		}
		first := true
		for {
			m, err := stream.Recv()
			if err != nil {
				if errors.Is(err, io.EOF) {
					return nil
				}
				if first {
					return err // nothing seen yet: another member may serve it
				}
				return status.Error(codes.Aborted, err.Error())
			}
			first = false
			applied = m.AppliedIndex
			for _, ch := range m.Changes {
				if err := fn(ch); err != nil {
					return err
				}
			}
		}
	})
	return applied, err
}

// ErrWatchResync ends a Watch whose stream broke when no member still had
// every change since the last one delivered: the caller's view may miss
// changes, so it must start over (Dump, then Watch after the dump's applied
// index).
var ErrWatchResync = errors.New("kvindex: watch cannot resume without a gap; Dump again")

// Watch streams index changes to fn, batch by batch, until ctx ends (then it
// returns nil), fn fails (its error is returned), or the changes cannot
// continue without a gap (an error wrapping ErrWatchResync). When a stream
// breaks (a member stops, or the watcher fell behind), Watch resumes on the
// next member after the applied index of the last change delivered (or where
// the stream started, when none was), pausing with backoff after a failed
// attempt; a member that no longer has those changes answers OUT_OF_RANGE,
// which ends Watch with ErrWatchResync. With req.AfterAppliedIndex set (say,
// a Dump's applied index) the first stream starts there too.
func (c *Client) Watch(ctx context.Context, req *kvindexv1.WatchRequest, fn func([]*kvindexv1.IndexChange) error) error {
	req = proto.Clone(req).(*kvindexv1.WatchRequest)
	w := &watch{c: c, req: req, fn: fn, after: req.GetAfterAppliedIndex(), positioned: req.AfterAppliedIndex != nil}
	c.mu.Lock()
	member := c.next
	c.mu.Unlock()
	failures := 0
	for {
		addr := c.opts.Addrs[member%len(c.opts.Addrs)]
		progressed, err := w.stream(ctx, addr)
		var fnErr fnError
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.As(err, &fnErr):
			return fnErr.err
		case status.Code(err) == codes.OutOfRange:
			return fmt.Errorf("%w: %v", ErrWatchResync, err)
		case !w.positioned:
			// Broke before the member said where the stream starts: what
			// happened meanwhile cannot be asked for.
			return fmt.Errorf("%w: the stream from %s broke before it started: %v", ErrWatchResync, addr, err)
		case !resumable(err):
			return err
		}
		if progressed {
			failures = 0
		}
		if failures >= c.opts.MaxAttempts {
			return err
		}
		if c.backoff.Wait(ctx, failures) != nil {
			return nil // ctx ended
		}
		failures++
		member++
	}
}

// resumable: the stream broke in a way another stream can recover from (a
// member down or shutting down, a watcher that fell behind, a reset stream).
func resumable(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.ResourceExhausted, codes.Aborted, codes.Internal, codes.Unknown:
		return true
	}
	return false
}

// fnError carries the error of a Watch callback out of the stream.
type fnError struct{ err error }

func (e fnError) Error() string { return e.err.Error() }

// watch is the state of one Watch across its streams.
type watch struct {
	c   *Client
	req *kvindexv1.WatchRequest
	fn  func([]*kvindexv1.IndexChange) error
	// after is the applied index up to which fn has every change; positioned
	// says it is known (from the request, a stream's header or a change).
	after      uint64
	positioned bool
}

// stream runs one Watch stream on addr until it breaks; progressed says fn
// got at least one batch from it.
func (w *watch) stream(ctx context.Context, addr string) (progressed bool, err error) {
	cc, err := w.c.conn(addr)
	if err != nil {
		return false, err
	}
	if w.positioned {
		after := w.after
		w.req.AfterAppliedIndex = &after
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := kvindexv1.NewIndexServiceClient(cc).Watch(ctx, w.req)
	if err != nil {
		return false, err
	}
	md, err := stream.Header()
	if err != nil {
		return false, err
	}
	if !w.positioned {
		if v := md.Get(kvindexv1.WatchFromKey); len(v) == 1 {
			if from, perr := strconv.ParseUint(v[0], 10, 64); perr == nil {
				w.after, w.positioned = from, true
			}
		}
	}
	for {
		m, err := stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = status.Error(codes.Unavailable, "the member ended the Watch stream")
			}
			return progressed, err
		}
		if len(m.Changes) == 0 {
			continue
		}
		if err := w.fn(m.Changes); err != nil {
			return progressed, fnError{err}
		}
		progressed = true
		w.after, w.positioned = m.Changes[len(m.Changes)-1].AppliedIndex, true
	}
}

// RegisterWorker registers a worker with the cluster (through the leader).
// Registering an identical spec again succeeds, so it is retried like a read.
func (c *Client) RegisterWorker(ctx context.Context, spec *kvindexv1.WorkerSpec) (resp *kvindexv1.RegisterWorkerResponse, err error) {
	err = c.write(ctx, true, func(ctx context.Context, cc *grpc.ClientConn) error {
		resp, err = kvindexv1.NewAdminServiceClient(cc).RegisterWorker(ctx, &kvindexv1.RegisterWorkerRequest{Worker: spec})
		return err
	})
	return resp, err
}

// UnregisterWorker removes a worker and its blocks (through the leader).
func (c *Client) UnregisterWorker(ctx context.Context, id string) (resp *kvindexv1.UnregisterWorkerResponse, err error) {
	err = c.write(ctx, false, func(ctx context.Context, cc *grpc.ClientConn) error {
		resp, err = kvindexv1.NewAdminServiceClient(cc).UnregisterWorker(ctx, &kvindexv1.UnregisterWorkerRequest{WorkerId: id})
		return err
	})
	return resp, err
}

// Join adds a node to the raft cluster (through the leader).
func (c *Client) Join(ctx context.Context, req *kvindexv1.JoinRequest) (resp *kvindexv1.JoinResponse, err error) {
	err = c.write(ctx, false, func(ctx context.Context, cc *grpc.ClientConn) error {
		resp, err = kvindexv1.NewAdminServiceClient(cc).Join(ctx, req)
		return err
	})
	return resp, err
}

// Leave removes a node from the raft cluster (through the leader).
func (c *Client) Leave(ctx context.Context, nodeID string) (resp *kvindexv1.LeaveResponse, err error) {
	err = c.write(ctx, false, func(ctx context.Context, cc *grpc.ClientConn) error {
		resp, err = kvindexv1.NewAdminServiceClient(cc).Leave(ctx, &kvindexv1.LeaveRequest{NodeId: nodeID})
		return err
	})
	return resp, err
}

// Snapshot asks the member at addr (one of Options.Addrs or another) to take
// a raft snapshot now. It is never redirected: a snapshot is per node.
func (c *Client) Snapshot(ctx context.Context, addr string) (*kvindexv1.SnapshotResponse, error) {
	if c.opts.AdminToken != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+c.opts.AdminToken)
	}
	cc, err := c.conn(addr)
	if err != nil {
		return nil, err
	}
	return kvindexv1.NewAdminServiceClient(cc).Snapshot(ctx, &kvindexv1.SnapshotRequest{})
}
