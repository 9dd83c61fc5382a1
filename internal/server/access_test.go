package server

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/logbuf"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"
)

// wantProbe are the only routes --probe-addr may serve: plain HTTP, without
// TLS or a token, beyond loopback.
var wantProbe = map[string]bool{"GET /healthz": true, "GET /readyz": true, "GET /metrics": true}

// wantAccess is the credential each served gRPC method and REST route must
// require. A method or route that is served but not listed here fails the
// test: whoever adds one decides here, knowingly, that it may be public.
var wantAccess = map[string]access{
	"/kvindex.v1.IndexService/Score":                                 accessPublic,
	"/kvindex.v1.IndexService/QueryByHash":                           accessPublic,
	"/kvindex.v1.IndexService/Workers":                               accessPublic,
	"/kvindex.v1.IndexService/Stats":                                 accessPublic,
	"/kvindex.v1.IndexService/Watch":                                 accessPublic,
	"/kvindex.v1.IndexService/Dump":                                  accessPublic, // one at a time
	"/kvindex.v1.AdminService/Cluster":                               accessPublic,
	"/kvindex.v1.AdminService/RegisterWorker":                        accessAdmin,
	"/kvindex.v1.AdminService/UnregisterWorker":                      accessAdmin,
	"/kvindex.v1.AdminService/Join":                                  accessAdmin,
	"/kvindex.v1.AdminService/Leave":                                 accessAdmin,
	"/kvindex.v1.AdminService/Snapshot":                              accessAdmin,
	"/kvindex.v1.LoadService/Report":                                 accessLedger, // reported load steers every router; routers hold the ledger token
	"/kvindex.v1.MemberService/ForwardEvents":                        accessAdmin,  // member to member: what it carries goes into the index
	"/indexer.v1.IndexerService/GetPodScores":                        accessPublic,
	"/grpc.health.v1.Health/Check":                                   accessPublic,
	"/grpc.health.v1.Health/List":                                    accessPublic,
	"/grpc.health.v1.Health/Watch":                                   accessPublic,
	"/grpc.reflection.v1.ServerReflection/ServerReflectionInfo":      accessPublic,
	"/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo": accessPublic,

	"GET /healthz":            accessPublic,
	"GET /readyz":             accessPublic,
	"GET /metrics":            accessPublic,
	"GET /workers":            accessPublic,
	"GET /cluster":            accessPublic,
	"GET /dump":               accessPublic, // one at a time
	"GET /v1/stats":           accessPublic,
	"POST /v1/score":          accessPublic,
	"POST /v1/query_by_hash":  accessPublic,
	"POST /kv-cache/hit-rate": accessPublic,
	"POST /query":             accessPublic,
	"POST /query_by_hash":     accessPublic,
	"POST /register":          accessAdmin,
	"POST /unregister":        accessAdmin,
	// The console (ui.go): read-only views; its admin actions call /unregister.
	"GET /ui":               accessPublic,
	"GET /ui/assets/{file}": accessPublic,
	"GET /ui/api/state":     accessPublic,
	"GET /ui/api/events":    accessPublic,
	"POST /ui/api/try":      accessPublic,
}

// ledgerToken is the --ledger-token of the tests: it opens LoadService only.
const ledgerToken = "l3dger-token"

// TestEveryEndpointHasItsAccessPolicy walks the services the gRPC server
// actually registered and the REST routes the handler actually serves, and
// calls each one without a token: an admin or ledger one must answer
// UNAUTHENTICATED / 401 before doing anything, a public one must not. Then it
// calls each one with the ledger token: an admin one must answer
// PERMISSION_DENIED / 403 before doing anything, the others must not refuse
// it. The probe listener
// (--probe-addr) serves wantProbe and nothing else: every other route of the
// HTTP listener is a 404 there.
func TestEveryEndpointHasItsAccessPolicy(t *testing.T) {
	f := newFixture(t, fixtureOptions{engines: defaultEngines[:1], configure: func(c *Config) {
		c.AdminToken, c.LedgerToken, c.ProbeAddr = adminToken, ledgerToken, "127.0.0.1:0"
	}})
	if methodAccess("/kvindex.v1.AdminService/SomethingNew") != accessAdmin {
		t.Error("a method nobody classified is not admin-only")
	}
	if (route{}).access != accessAdmin {
		t.Error("a route without an explicit access is not admin-only")
	}
	served := 0
	for svc, info := range f.srv.grpc.GetServiceInfo() {
		for _, m := range info.Methods {
			full := "/" + svc + "/" + m.Name
			served++
			want, listed := wantAccess[full]
			if !listed {
				t.Errorf("gRPC %s is served but has no access policy in wantAccess", full)
				continue
			}
			if got := methodAccess(full); got != want {
				t.Errorf("gRPC %s needs %v, want %v", full, got, want)
			}
			stream := m.IsClientStream || m.IsServerStream
			code := callWithToken(t, f.conn, full, stream, "")
			if refused := code == codes.Unauthenticated; refused != (want != accessPublic) {
				t.Errorf("gRPC %s without a token answered %v; its policy is %v", full, code, want)
			}
			code = callWithToken(t, f.conn, full, stream, ledgerToken)
			if refused := code == codes.PermissionDenied || code == codes.Unauthenticated; refused != (want == accessAdmin) {
				t.Errorf("gRPC %s with the ledger token answered %v; its policy is %v", full, code, want)
			}
		}
	}
	for _, rt := range f.srv.api.routes() {
		served++
		want, listed := wantAccess[rt.pattern]
		if !listed {
			t.Errorf("REST %s is served but has no access policy in wantAccess", rt.pattern)
			continue
		}
		if rt.access != want {
			t.Errorf("REST %s needs %v, want %v", rt.pattern, rt.access, want)
		}
		method, path, _ := strings.Cut(rt.pattern, " ")
		req, err := http.NewRequest(method, f.base+path, strings.NewReader("{}"))
		if err != nil {
			t.Fatal(err)
		}
		code, body := f.do(req)
		if refused := code == http.StatusUnauthorized; refused != (want != accessPublic) {
			t.Errorf("REST %s without a token = %d %s; its policy is %v", rt.pattern, code, body, want)
		}
		req, err = http.NewRequest(method, f.base+path, strings.NewReader("{}"))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+ledgerToken)
		code, body = f.do(req)
		if refused := code == http.StatusForbidden || code == http.StatusUnauthorized; refused != (want == accessAdmin) {
			t.Errorf("REST %s with the ledger token = %d %s; its policy is %v", rt.pattern, code, body, want)
		}
	}
	if served != len(wantAccess) {
		t.Errorf("%d endpoints served, %d in wantAccess: remove the ones that no longer exist", served, len(wantAccess))
	}

	probed := 0
	for _, rt := range f.srv.api.probeRoutes() {
		probed++
		if !wantProbe[rt.pattern] || rt.access != accessPublic {
			t.Errorf("the probe listener serves %s (%v); it may serve only public health and metrics routes %v", rt.pattern, rt.access, wantProbe)
		}
	}
	if probed != len(wantProbe) {
		t.Errorf("the probe listener serves %d routes, want the %d of wantProbe", probed, len(wantProbe))
	}
	probe := "http://" + f.srv.ProbeAddr()
	for _, rt := range f.srv.api.routes() {
		method, path, _ := strings.Cut(rt.pattern, " ")
		req, err := http.NewRequest(method, probe+path, strings.NewReader("{}"))
		if err != nil {
			t.Fatal(err)
		}
		code, body := f.do(req)
		if want := map[bool]int{true: http.StatusOK, false: http.StatusNotFound}[wantProbe[rt.pattern]]; code != want {
			t.Errorf("probe listener %s = %d %.200s, want %d", rt.pattern, code, body, want)
		}
	}
}

// callWithToken calls a gRPC method with an empty request, with token as its
// bearer token unless it is empty, and returns the code it answers with (for
// a stream, of its first message).
func callWithToken(t *testing.T, cc *grpc.ClientConn, method string, stream bool, token string) codes.Code {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if token != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
	}
	if !stream {
		return status.Code(cc.Invoke(ctx, method, &emptypb.Empty{}, &emptypb.Empty{}))
	}
	s, err := cc.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, method)
	if err != nil {
		return status.Code(err)
	}
	// io.EOF: the server ended the stream already (a refusal); RecvMsg says how.
	if err := s.SendMsg(&emptypb.Empty{}); err != nil && !errors.Is(err, io.EOF) {
		return status.Code(err)
	}
	s.CloseSend()
	return status.Code(s.RecvMsg(&emptypb.Empty{}))
}

// TestListenersBeyondLoopbackWithoutTLSAreWarnedAbout: a node whose raft,
// gRPC or HTTP listener is not loopback and has no TLS logs a loud warning
// naming that listener at start; its loopback listeners are not named, nor is
// a --probe-addr beyond loopback (plain HTTP by design, health and metrics only).
func TestListenersBeyondLoopbackWithoutTLSAreWarnedAbout(t *testing.T) {
	flags := []string{"--raft-addr", "--grpc-addr", "--http-addr"}
	for _, exposed := range flags {
		t.Run(exposed, func(t *testing.T) {
			cfg := testConfig(t)
			cfg.AdminToken, cfg.ProbeAddr = adminToken, "0.0.0.0:0"
			switch exposed {
			case "--raft-addr":
				cfg.Raft.RaftAddr, cfg.Raft.RaftAdvertise = "0.0.0.0:0", "127.0.0.1:7000"
			case "--grpc-addr":
				cfg.GRPCAddr, cfg.GRPCAdvertise = "0.0.0.0:0", "127.0.0.1:7070"
			case "--http-addr":
				cfg.HTTPAddr = "0.0.0.0:0"
			}
			logs := &logbuf.Buffer{}
			srv, err := New(cfg, slog.New(slog.NewTextHandler(logs, nil)))
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			if err := srv.Run(ctx); err != nil {
				t.Fatal(err)
			}
			out := logs.String()
			if !strings.Contains(out, "level=WARN msg=\"INSECURE") || !strings.Contains(out, "flag="+exposed) {
				t.Errorf("no INSECURE warning naming %s in:\n%s", exposed, out)
			}
			for _, quiet := range append(flags, "--probe-addr") {
				if quiet != exposed && strings.Contains(out, "flag="+quiet) {
					t.Errorf("a loopback listener is warned about (%s):\n%s", quiet, out)
				}
			}
		})
	}
}
