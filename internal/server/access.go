package server

import (
	"crypto/subtle"
	"fmt"
	"net"
	"strings"
	"sync/atomic"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	indexerv1 "github.com/kvindex/kvindex/api/proto/indexer/v1"
	kvindexv1 "github.com/kvindex/kvindex/api/proto/kvindex/v1"
)

// access is the credential a gRPC method or an HTTP route requires. The zero
// value is accessAdmin, so that a method or route nobody classified needs the
// admin token: a new endpoint is denied by default, never open by mistake.
type access int

const (
	// accessAdmin needs the admin token (when --admin-token is set).
	accessAdmin access = iota
	// accessPublic needs nothing: reads, health, metrics.
	accessPublic
	// accessLedger needs the ledger token or the admin token (when
	// --admin-token is set): the routers' shared load ledger, so that a router
	// can hold a credential that opens nothing else.
	accessLedger
)

func (a access) String() string {
	switch a {
	case accessPublic:
		return "public"
	case accessLedger:
		return "ledger"
	}
	return "admin"
}

// publicMethods are the gRPC methods anyone may call; every other method,
// including any added later, needs the admin token. Dump is public but runs
// one at a time (dumpSlot): it walks the whole index.
var publicMethods = map[string]bool{
	kvindexv1.IndexService_Score_FullMethodName:                      true,
	kvindexv1.IndexService_QueryByHash_FullMethodName:                true,
	kvindexv1.IndexService_Workers_FullMethodName:                    true,
	kvindexv1.IndexService_Stats_FullMethodName:                      true,
	kvindexv1.IndexService_Watch_FullMethodName:                      true,
	kvindexv1.IndexService_Dump_FullMethodName:                       true,
	kvindexv1.AdminService_Cluster_FullMethodName:                    true,
	indexerv1.IndexerService_GetPodScores_FullMethodName:             true,
	healthpb.Health_Check_FullMethodName:                             true,
	healthpb.Health_List_FullMethodName:                              true,
	healthpb.Health_Watch_FullMethodName:                             true,
	"/grpc.reflection.v1.ServerReflection/ServerReflectionInfo":      true,
	"/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo": true,
}

// ledgerMethods are the gRPC methods the ledger token opens (the admin token
// opens them too): what a router calls with --indexer-token.
var ledgerMethods = map[string]bool{
	kvindexv1.LoadService_Report_FullMethodName: true,
}

// methodAccess is what calling the gRPC method fullMethod requires.
func methodAccess(fullMethod string) access {
	switch {
	case publicMethods[fullMethod]:
		return accessPublic
	case ledgerMethods[fullMethod]:
		return accessLedger
	}
	return accessAdmin
}

// authorize checks the bearer token of a call that needs one; authorization is
// the "Authorization" header or metadata value. Without an admin token nothing
// is checked (Config.Validate allows that only on loopback or with
// --insecure-no-admin-token, and refuses a ledger token alone).
func (a *API) authorize(need access, authorization string) error {
	if need == accessPublic || a.adminToken == "" {
		return nil
	}
	what := "the admin token"
	if need == accessLedger {
		what = "the ledger or the admin token"
	}
	if authorization == "" {
		return fmt.Errorf("%w: this call needs %s (Authorization: Bearer <token>)", ErrUnauthenticated, what)
	}
	scheme, token, ok := strings.Cut(authorization, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return fmt.Errorf("%w: the Authorization value must be \"Bearer <token>\"", ErrUnauthenticated)
	}
	given := []byte(strings.TrimSpace(token))
	match := subtle.ConstantTimeCompare(given, []byte(a.adminToken))
	if need == accessLedger && a.ledgerToken != "" {
		// Both comparisons run whichever matches, each in constant time.
		match |= subtle.ConstantTimeCompare(given, []byte(a.ledgerToken))
	}
	if match != 1 {
		if need == accessLedger {
			return fmt.Errorf("%w: neither the ledger token nor the admin token", ErrPermissionDenied)
		}
		return fmt.Errorf("%w: wrong admin token (a ledger token opens LoadService only)", ErrPermissionDenied)
	}
	return nil
}

// dumpSlot admits one Dump at a time: a dump walks the whole index and holds
// a copy of it, so concurrent dumps are how one client could exhaust memory.
type dumpSlot chan struct{}

func newDumpSlot() dumpSlot { return make(dumpSlot, 1) }

// acquire takes the slot or fails at once with ErrTooMany; release gives it back.
func (s dumpSlot) acquire() (release func(), err error) {
	select {
	case s <- struct{}{}:
		return func() { <-s }, nil
	default:
		return nil, fmt.Errorf("%w: another Dump is running and one runs at a time; try again when it ends", ErrTooMany)
	}
}

// streamLimit bounds the streams of one kind open at once (Watch): each holds
// a buffer of changes, so their number is memory one client could take.
type streamLimit struct {
	max  int64
	open atomic.Int64
}

// acquire admits one more stream or fails at once with ErrTooMany.
func (l *streamLimit) acquire(what string) (release func(), err error) {
	if l.open.Add(1) > l.max {
		l.open.Add(-1)
		return nil, fmt.Errorf("%w: %d %s streams are open, the most this node serves at once (--max-watch-streams); close one or try another member", ErrTooMany, l.max, what)
	}
	return func() { l.open.Add(-1) }, nil
}

// isLoopback reports whether the listen address hostport only accepts local
// connections (an empty host or 0.0.0.0 accept every interface).
func isLoopback(hostport string) bool {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
