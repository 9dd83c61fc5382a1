package server

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	kvindexv1 "github.com/kvindex/kvindex/api/proto/kvindex/v1"
	"github.com/kvindex/kvindex/internal/raftstore"
)

// testPKI is the user CA with a server, a member and a client certificate, and
// the raft CA with a member's raft certificate, as PEM files.
type testPKI struct {
	dir                  string
	caFile               string
	serverCert, serverKy string
	// peerCert is valid for server and client authentication: a cluster
	// member's, which members also present when they dial each other.
	peerCert, peerKey string
	clientCert        tls.Certificate
	pool              *x509.CertPool
	// raftCA signs raftCert only (--raft-tls-ca, --raft-tls-cert).
	raftCAFile, raftCert, raftKey string
	raftPeer                      tls.Certificate
}

func newTestPKI(t *testing.T) *testPKI {
	t.Helper()
	dir := t.TempDir()
	newCA := func(name string) (*x509.Certificate, *ecdsa.PrivateKey, []byte) {
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			IsCA: true, KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true,
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
		if err != nil {
			t.Fatal(err)
		}
		ca, _ := x509.ParseCertificate(der)
		return ca, key, der
	}
	ca, caKey, caDER := newCA("kvindex test CA")
	raftCA, raftCAKey, raftCADER := newCA("kvindex test raft CA")
	issue := func(ca *x509.Certificate, caKey *ecdsa.PrivateKey, serial int64, name string, usage ...x509.ExtKeyUsage) ([]byte, *ecdsa.PrivateKey) {
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: usage,
			IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		return der, key
	}
	write := func(name, kind string, der []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	keyDER := func(k *ecdsa.PrivateKey) []byte {
		der, err := x509.MarshalECPrivateKey(k)
		if err != nil {
			t.Fatal(err)
		}
		return der
	}
	pair := func(der []byte, key *ecdsa.PrivateKey) tls.Certificate {
		c, err := tls.X509KeyPair(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
			pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER(key)}))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	p := &testPKI{dir: dir, caFile: write("ca.pem", "CERTIFICATE", caDER), pool: x509.NewCertPool(),
		raftCAFile: write("raft-ca.pem", "CERTIFICATE", raftCADER)}
	p.pool.AddCert(ca)
	sDER, sKey := issue(ca, caKey, 2, "indexer", x509.ExtKeyUsageServerAuth)
	p.serverCert, p.serverKy = write("server.pem", "CERTIFICATE", sDER), write("server-key.pem", "EC PRIVATE KEY", keyDER(sKey))
	pDER, pKey := issue(ca, caKey, 4, "indexer-peer", x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth)
	p.peerCert, p.peerKey = write("peer.pem", "CERTIFICATE", pDER), write("peer-key.pem", "EC PRIVATE KEY", keyDER(pKey))
	cDER, cKey := issue(ca, caKey, 3, "client", x509.ExtKeyUsageClientAuth)
	p.clientCert = pair(cDER, cKey)
	rDER, rKey := issue(raftCA, raftCAKey, 5, "indexer-raft", x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth)
	p.raftCert, p.raftKey = write("raft.pem", "CERTIFICATE", rDER), write("raft-key.pem", "EC PRIVATE KEY", keyDER(rKey))
	p.raftPeer = pair(rDER, rKey)
	return p
}

// newMutualTLSFixture serves one engine's worker with --tls-cert, --tls-key,
// --tls-client-ca and the raft CA and certificate; its clients present the
// client certificate. more adjusts the configuration further.
func newMutualTLSFixture(t *testing.T, pki *testPKI, more ...func(*Config)) *fixture {
	clientTLS := &tls.Config{RootCAs: pki.pool, Certificates: []tls.Certificate{pki.clientCert}, ServerName: "127.0.0.1"}
	return newFixture(t, fixtureOptions{engines: defaultEngines[:1], clientTLS: clientTLS, configure: func(c *Config) {
		c.TLSCert, c.TLSKey, c.TLSClientCA = pki.serverCert, pki.serverKy, pki.caFile
		c.RaftTLSCA, c.RaftTLSCert, c.RaftTLSKey = pki.raftCAFile, pki.raftCert, pki.raftKey
		for _, m := range more {
			m(c)
		}
	}})
}

// TestProbeListenerUnderMutualTLS: with --tls-client-ca the HTTP listener
// refuses a client without a certificate, as the kubelet's probes are; the
// --probe-addr listener answers that client /healthz, /readyz and /metrics in
// plain HTTP, and nothing else (data API, dump, admin calls, console: 404).
func TestProbeListenerUnderMutualTLS(t *testing.T) {
	pki := newTestPKI(t)
	f := newMutualTLSFixture(t, pki, func(c *Config) { c.ProbeAddr = "127.0.0.1:0" })
	f.generate("e0", 0, tokens(0, 8), "")

	noCert := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pki.pool}}}
	if _, err := noCert.Get(f.base + "/readyz"); err == nil {
		t.Fatal("the HTTP listener answered /readyz to a client without a certificate: nothing to test")
	}
	plain := &http.Client{Timeout: 10 * time.Second} // the kubelet's httpGet probe: no TLS, no certificate
	probe := "http://" + f.srv.ProbeAddr()
	get := func(method, path string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(method, probe+path, strings.NewReader("{}"))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := plain.Do(req)
		if err != nil {
			t.Fatalf("%s %s on the probe listener: %v", method, path, err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	for path, want := range map[string]string{"/healthz": "ok\n", "/readyz": "ready\n", "/metrics": "kvindex_index_nodes "} {
		if code, body := get(http.MethodGet, path); code != http.StatusOK || !strings.Contains(body, want) {
			t.Errorf("GET %s on the probe listener = %d %.200q, want 200 with %q", path, code, body, want)
		}
	}
	for _, c := range []struct{ method, path string }{
		{"GET", "/dump"}, {"GET", "/workers"}, {"GET", "/cluster"}, {"GET", "/v1/stats"}, {"POST", "/v1/score"},
		{"POST", "/kv-cache/hit-rate"}, {"POST", "/query"}, {"POST", "/register"}, {"POST", "/unregister"}, {"GET", "/ui"},
	} {
		if code, body := get(c.method, c.path); code != http.StatusNotFound {
			t.Errorf("%s %s on the probe listener = %d %.200s, want 404", c.method, c.path, code, body)
		}
	}
}

// TestMutualTLS serves gRPC and REST with --tls-cert/--tls-key/--tls-client-ca:
// a client with a certificate from the CA gets answers; one without, or one
// speaking plaintext, is refused.
func TestMutualTLS(t *testing.T) {
	pki := newTestPKI(t)
	f := newMutualTLSFixture(t, pki)
	ctx := context.Background()
	f.generate("e0", 0, tokens(0, 8), "")
	resp, err := f.index.Score(ctx, &kvindexv1.ScoreRequest{Model: testModel, TokenIds: tokens(0, 8)})
	if err != nil || resp.Scores[0].MatchedBlocks != 2 {
		t.Fatalf("Score over mTLS = %v, %v", resp, err)
	}
	if code, body := f.postJSON("/kv-cache/hit-rate", map[string]any{"model": testModel, "token_ids": tokens(0, 8)}); code != 200 {
		t.Errorf("REST over mTLS = %d %s", code, body)
	}

	refused := func(name string, creds credentials.TransportCredentials) {
		t.Helper()
		conn, err := grpc.NewClient(f.srv.GRPCAddr(), grpc.WithTransportCredentials(creds))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if _, err := kvindexv1.NewIndexServiceClient(conn).Stats(cctx, &kvindexv1.StatsRequest{}); err == nil {
			t.Errorf("gRPC %s was served", name)
		}
	}
	refused("without a client certificate", credentials.NewTLS(&tls.Config{RootCAs: pki.pool, ServerName: "127.0.0.1"}))
	refused("in plaintext", insecure.NewCredentials())

	noCert := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pki.pool}}}
	if _, err := noCert.Get(f.base + "/healthz"); err == nil {
		t.Error("HTTPS without a client certificate was served")
	}
	// Go's TLS server answers a plaintext request with a 400 of its own.
	if resp, err := http.Get("http://" + f.srv.HTTPAddr() + "/healthz"); err == nil && resp.StatusCode == http.StatusOK {
		t.Error("plain HTTP was served")
	}
}

func TestTLSConfigErrors(t *testing.T) {
	pki := newTestPKI(t)
	// A raft CA bundle that also holds the API clients' CA.
	bundle := filepath.Join(pki.dir, "raft-bundle.pem")
	raftPEM, _ := os.ReadFile(pki.raftCAFile)
	userPEM, _ := os.ReadFile(pki.caFile)
	if err := os.WriteFile(bundle, append(raftPEM, userPEM...), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		configure func(*Config)
		want      string
	}{
		{func(c *Config) { c.TLSCert = pki.serverCert }, "--tls-cert and --tls-key go together"},
		{func(c *Config) { c.TLSCert, c.TLSKey = pki.serverCert, pki.serverKy }, "--raft-tls-ca is not"},
		{func(c *Config) { c.RaftTLSCA = pki.raftCAFile }, "need --tls-cert"},
		{func(c *Config) {
			c.TLSCert, c.TLSKey, c.RaftTLSCA, c.RaftTLSCert = pki.serverCert, pki.serverKy, pki.raftCAFile, pki.raftCert
		}, "--raft-tls-cert and --raft-tls-key go together"},
		{func(c *Config) { c.TLSCert, c.TLSKey, c.RaftTLSCA = pki.serverCert, pki.serverKy, pki.raftKey }, "--raft-tls-ca"},
		{func(c *Config) { c.TLSClientCA = pki.caFile }, "--tls-client-ca needs"},
		{func(c *Config) { c.TLSCert, c.TLSKey, c.RaftTLSCA = pki.serverCert, pki.caFile, pki.raftCAFile }, "--tls-cert/--tls-key"},
		{func(c *Config) {
			c.TLSCert, c.TLSKey, c.TLSClientCA, c.RaftTLSCA = pki.serverCert, pki.serverKy, pki.serverKy, pki.raftCAFile
		}, "no PEM certificate"},
		{func(c *Config) {
			c.TLSCert, c.TLSKey, c.TLSClientCA, c.RaftTLSCA = pki.serverCert, pki.serverKy, pki.caFile, pki.caFile
		}, "--raft-tls-ca=" + pki.caFile + " and --tls-client-ca=" + pki.caFile + " both trust"},
		{func(c *Config) {
			c.TLSCert, c.TLSKey, c.TLSClientCA, c.RaftTLSCA = pki.serverCert, pki.serverKy, pki.caFile, bundle
		}, "any API client certificate it signs could speak raft"},
		{func(c *Config) { c.Tokenizers[0].Dir = filepath.Join(pki.dir, "missing") }, "--tokenizer=" + testModel},
		{func(c *Config) { c.FallbackTokenizer = "gpt2" }, "--fallback-tokenizer"},
	} {
		cfg := testConfig(t)
		c.configure(&cfg)
		if _, err := New(cfg, nil); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("New = %v, want an error mentioning %q", err, c.want)
		}
	}
}

// TestRaftTransportAuthenticatesPeers dials the raft port of a node with TLS as
// raft itself would: in plaintext, with the API client certificate (from the
// user CA) and with the member certificate of the user CA it is refused; with
// a certificate of --raft-tls-ca it is answered.
func TestRaftTransportAuthenticatesPeers(t *testing.T) {
	pki := newTestPKI(t)
	f := newMutualTLSFixture(t, pki)
	peerCert, err := tls.LoadX509KeyPair(pki.peerCert, pki.peerKey)
	if err != nil {
		t.Fatal(err)
	}
	raftPool := x509.NewCertPool()
	raftPEM, _ := os.ReadFile(pki.raftCAFile)
	raftPool.AppendCertsFromPEM(raftPEM)
	for _, c := range []struct {
		name   string
		client *tls.Config // nil: plaintext
		served bool
	}{
		{"plaintext", nil, false},
		{"API client certificate", &tls.Config{RootCAs: raftPool, Certificates: []tls.Certificate{pki.clientCert}}, false},
		{"member certificate of the user CA", &tls.Config{RootCAs: raftPool, Certificates: []tls.Certificate{peerCert}}, false},
		{"no certificate", &tls.Config{RootCAs: raftPool}, false},
		{"raft certificate", &tls.Config{RootCAs: raftPool, Certificates: []tls.Certificate{pki.raftPeer}}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			var layer raft.StreamLayer
			var err error
			if c.client == nil {
				layer, err = raftstore.NewTCPStreamLayer("127.0.0.1:0", "")
			} else {
				layer, err = raftstore.NewTLSStreamLayer("127.0.0.1:0", "", &tls.Config{Certificates: []tls.Certificate{pki.raftPeer}}, c.client)
			}
			if err != nil {
				t.Fatal(err)
			}
			tr := raft.NewNetworkTransport(layer, 1, 2*time.Second, io.Discard)
			defer tr.Close()
			var resp raft.RequestVoteResponse
			err = tr.RequestVote("node-a", raft.ServerAddress(f.srv.RaftAddr()), &raft.RequestVoteRequest{
				RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte("intruder"), Addr: []byte(layer.Addr().String())},
				Term:      1, LastLogIndex: 0, LastLogTerm: 0,
			}, &resp)
			if served := err == nil; served != c.served {
				t.Errorf("RequestVote over %s: err = %v, want served=%v", c.name, err, c.served)
			}
		})
	}
}
