package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"sync"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	kvindexv1 "github.com/kvindex/kvindex/api/proto/kvindex/v1"
)

// peerHeader marks a gRPC request one member sends another (a forwarded write,
// a join, a cluster progress query); its value is the sender's node id. A member
// answers such a request itself: it never forwards it again, so a stale view of
// the leader cannot make requests go round in circles.
const peerHeader = "x-kvindex-peer"

// fromPeer reports whether the request of ctx came from another member.
func fromPeer(ctx context.Context) bool {
	md, _ := metadata.FromIncomingContext(ctx)
	return len(md.Get(peerHeader)) > 0
}

// peers holds this node's gRPC connections to the other members. Safe for
// concurrent use.
type peers struct {
	nodeID string
	token  string // the admin token, sent with every request
	creds  credentials.TransportCredentials

	mu    sync.Mutex
	conns map[string]*grpc.ClientConn // guarded by mu
}

// newPeers dials members with TLS when tlsCfg is set (the cluster's members
// then verify each other like clients: see Config.peerTLS).
func newPeers(nodeID, token string, tlsCfg *tls.Config) *peers {
	creds := insecure.NewCredentials()
	if tlsCfg != nil {
		creds = credentials.NewTLS(tlsCfg)
	}
	return &peers{nodeID: nodeID, token: token, creds: creds, conns: map[string]*grpc.ClientConn{}}
}

// admin returns an AdminService client of the member at addr and ctx carrying
// the admin token and, when asPeer, the peer mark (the member then answers
// itself rather than forwarding to the leader).
func (p *peers) admin(ctx context.Context, addr string, asPeer bool) (context.Context, kvindexv1.AdminServiceClient, error) {
	ctx, cc, err := p.dial(ctx, addr, asPeer)
	if err != nil {
		return nil, nil, err
	}
	return ctx, kvindexv1.NewAdminServiceClient(cc), nil
}

// member returns a MemberService client of the member at addr, with ctx
// carrying the admin token and the peer mark.
func (p *peers) member(ctx context.Context, addr string) (context.Context, kvindexv1.MemberServiceClient, error) {
	ctx, cc, err := p.dial(ctx, addr, true)
	if err != nil {
		return nil, nil, err
	}
	return ctx, kvindexv1.NewMemberServiceClient(cc), nil
}

// dial returns the connection to the member at addr (made once, then shared)
// and ctx with the outgoing metadata of admin.
func (p *peers) dial(ctx context.Context, addr string, asPeer bool) (context.Context, *grpc.ClientConn, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	cc := p.conns[addr]
	if cc == nil {
		var err error
		if cc, err = grpc.NewClient(addr, append(kvindexv1.FlowControlDialOptions(), grpc.WithTransportCredentials(p.creds))...); err != nil {
			return nil, nil, fmt.Errorf("%w: dialing member %s: %w", ErrUnavailable, addr, err)
		}
		p.conns[addr] = cc
	}
	var md []string
	if asPeer {
		md = append(md, peerHeader, p.nodeID)
	}
	if p.token != "" {
		md = append(md, "authorization", "Bearer "+p.token)
	}
	return metadata.AppendToOutgoingContext(ctx, md...), cc, nil
}

// close closes every connection.
func (p *peers) close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs []error
	for addr, cc := range p.conns {
		errs = append(errs, cc.Close())
		delete(p.conns, addr)
	}
	return errors.Join(errs...)
}

// remoteError is an error answer of another member, classified like ours.
type remoteError struct {
	kind error // a sentinel of errors.go
	msg  string
}

func (e *remoteError) Error() string { return e.msg }
func (e *remoteError) Unwrap() error { return e.kind }

// statusKinds maps a member's gRPC codes back to our sentinels when its error
// carries no ErrorInfo of ours (gRPC's own errors: a connection refused, a
// deadline, a message over the size limit).
var statusKinds = map[codes.Code]error{
	codes.InvalidArgument:    ErrInvalidArgument,
	codes.NotFound:           ErrNotFound,
	codes.AlreadyExists:      ErrAlreadyExists,
	codes.Aborted:            ErrConflict,
	codes.FailedPrecondition: ErrFailedPrecondition,
	codes.Unauthenticated:    ErrUnauthenticated,
	codes.PermissionDenied:   ErrPermissionDenied,
	codes.ResourceExhausted:  ErrTooLarge,
	codes.OutOfRange:         ErrWatchResumeUnavailable,
	codes.Unavailable:        ErrUnavailable,
	codes.Unimplemented:      ErrNotSupported,
	codes.Canceled:           context.Canceled,
	codes.DeadlineExceeded:   context.DeadlineExceeded,
}

// fromRemote turns the error of a call to the member at addr into one the error
// table classifies: a not-leader answer becomes a *NotLeaderError, an error
// with our ErrorInfo the sentinel its reason names, other codes their
// statusKinds sentinel, and a member that cannot be reached ErrUnavailable.
func fromRemote(addr string, err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return &remoteError{kind: ErrUnavailable, msg: fmt.Sprintf("member %s: %v", addr, err)}
	}
	var kind error
	for _, d := range st.Details() {
		info, isInfo := d.(*errdetails.ErrorInfo)
		if !isInfo || info.Domain != kvindexv1.ErrorDomain {
			continue
		}
		if info.Reason == kvindexv1.NotLeaderReason {
			return &NotLeaderError{LeaderID: info.Metadata[kvindexv1.LeaderIDKey], LeaderAddr: info.Metadata[kvindexv1.LeaderAddrKey]}
		}
		kind = kindOfReason(info.Reason)
	}
	if kind == nil {
		var known bool
		if kind, known = statusKinds[st.Code()]; !known {
			kind = fmt.Errorf("member %s failed (%s)", addr, st.Code())
		}
	}
	return &remoteError{kind: kind, msg: st.Message()}
}
