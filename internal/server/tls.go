package server

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"

	"github.com/kvindex/kvindex/internal/tokenize"
)

// tlsConfig builds the servers' TLS configuration from --tls-cert, --tls-key and
// --tls-client-ca; nil when TLS is off.
func (c *Config) tlsConfig() (*tls.Config, error) {
	if c.TLSCert == "" {
		return nil, nil
	}
	cert, err := tls.LoadX509KeyPair(c.TLSCert, c.TLSKey)
	if err != nil {
		return nil, invalid("--tls-cert/--tls-key: %v", err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if c.TLSClientCA != "" {
		pool, err := loadCA("--tls-client-ca", c.TLSClientCA)
		if err != nil {
			return nil, err
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}

func loadCA(flag, path string) (*x509.CertPool, error) {
	certs, err := loadCerts(flag, path)
	if err != nil {
		return nil, err
	}
	return certPool(certs), nil
}

func certPool(certs []*x509.Certificate) *x509.CertPool {
	pool := x509.NewCertPool()
	for _, c := range certs {
		pool.AddCert(c)
	}
	return pool
}

// loadCerts reads the PEM certificates of the file path that flag names.
func loadCerts(flag, path string) ([]*x509.Certificate, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, invalid("%s: %v", flag, err)
	}
	var certs []*x509.Certificate
	for {
		var block *pem.Block
		if block, data = pem.Decode(data); block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, invalid("%s %s: %v", flag, path, err)
		}
		certs = append(certs, c)
	}
	if len(certs) == 0 {
		return nil, invalid("%s %s: no PEM certificate in it", flag, path)
	}
	return certs, nil
}

// raftCA loads --raft-tls-ca and refuses a CA that --tls-client-ca also
// trusts: a certificate issued to an API client could then speak raft.
func (c *Config) raftCA() (*x509.CertPool, error) {
	certs, err := loadCerts("--raft-tls-ca", c.RaftTLSCA)
	if err != nil {
		return nil, err
	}
	if c.TLSClientCA != "" {
		clientCAs, err := loadCerts("--tls-client-ca", c.TLSClientCA)
		if err != nil {
			return nil, err
		}
		for _, rc := range certs {
			for _, cc := range clientCAs {
				if rc.Equal(cc) {
					return nil, invalid("--raft-tls-ca=%s and --tls-client-ca=%s both trust %q: any API client certificate it signs could speak raft (append to the log, install a snapshot); give raft a CA of its own that signs member certificates only",
						c.RaftTLSCA, c.TLSClientCA, rc.Subject.String())
				}
			}
		}
	}
	return certPool(certs), nil
}

// raftTLS is how the raft transport accepts (server) and dials (client) when TLS
// is on; both nil otherwise. Peers authenticate each other: each presents
// --raft-tls-cert (default --tls-cert) and accepts only certificates signed by
// --raft-tls-ca. That CA is kept apart from --tls-client-ca on purpose (a
// node given the same CA for both refuses to start, raftCA): a certificate
// issued to an API client must not let it speak raft, where it could append
// to the log or install a snapshot. The raft CA should sign member
// certificates only.
func (c *Config) raftTLS() (server, client *tls.Config, err error) {
	if c.TLSCert == "" {
		return nil, nil, nil
	}
	certFile, keyFile, flag := c.TLSCert, c.TLSKey, "--tls-cert/--tls-key"
	if c.RaftTLSCert != "" {
		certFile, keyFile, flag = c.RaftTLSCert, c.RaftTLSKey, "--raft-tls-cert/--raft-tls-key"
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, nil, invalid("%s: %v", flag, err)
	}
	pool, err := c.raftCA()
	if err != nil {
		return nil, nil, err
	}
	server = &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert,
		MinVersion: tls.VersionTLS12}
	client = &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool, MinVersion: tls.VersionTLS12}
	return server, client, nil
}

// tokenizers loads the --tokenizer specs into a registry and returns it with the
// fallback tokenizer (nil when none).
func (c *Config) tokenizers() (*tokenize.Registry, tokenize.Tokenizer, error) {
	reg := tokenize.NewRegistry()
	for _, spec := range c.Tokenizers {
		if spec.Dir == BuiltinTokenizer {
			reg.Register(spec.Model, tokenize.NewBuiltin())
			continue
		}
		t, err := tokenize.Load(spec, tokenize.Options{})
		if err != nil {
			return nil, nil, fmt.Errorf("--tokenizer=%s: %w", spec, err)
		}
		reg.Register(spec.Model, t)
	}
	var fallback tokenize.Tokenizer
	if c.FallbackTokenizer == BuiltinTokenizer {
		fallback = tokenize.NewBuiltin()
	}
	return reg, fallback, nil
}

// peerTLS is how this node dials the other members (forwarded writes, joins,
// cluster progress, the raft transport) when TLS is on, nil otherwise. It
// trusts --tls-client-ca, the cluster's CA (the system roots when unset), and
// presents the node's own certificate, which must therefore also be valid for
// client authentication when --tls-client-ca asks clients for certificates.
func (c *Config) peerTLS(server *tls.Config) *tls.Config {
	if server == nil {
		return nil
	}
	return &tls.Config{Certificates: server.Certificates, RootCAs: server.ClientCAs, MinVersion: tls.VersionTLS12}
}
