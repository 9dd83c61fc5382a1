package server

import (
	"crypto/tls"
	"crypto/x509"
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
		pem, err := os.ReadFile(c.TLSClientCA)
		if err != nil {
			return nil, invalid("--tls-client-ca: %v", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, invalid("--tls-client-ca %s: no PEM certificate in it", c.TLSClientCA)
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return cfg, nil
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
