package raftstore

import (
	"crypto/tls"
	"fmt"
	"net"
	"time"

	"github.com/hashicorp/raft"
)

// tcpStreamLayer is raft's plain TCP stream layer, written out because raft's own
// is unexported and Config.StreamLayer needs something to wrap or replace.
type tcpStreamLayer struct {
	net.Listener
	advertise net.Addr
}

var _ raft.StreamLayer = (*tcpStreamLayer)(nil)

// NewTCPStreamLayer listens on bind and advertises advertise (the listener's
// address when empty), which must name a specific host that peers can dial.
func NewTCPStreamLayer(bind, advertise string) (raft.StreamLayer, error) {
	ln, err := net.Listen("tcp", bind)
	if err != nil {
		return nil, fmt.Errorf("raftstore: raft listener: %w", err)
	}
	var adv net.Addr = ln.Addr()
	if advertise != "" {
		if adv, err = net.ResolveTCPAddr("tcp", advertise); err != nil {
			ln.Close()
			return nil, fmt.Errorf("%w: RaftAdvertise %q: %w", ErrInvalidConfig, advertise, err)
		}
	}
	if tcp, ok := adv.(*net.TCPAddr); !ok || tcp.IP == nil || tcp.IP.IsUnspecified() {
		ln.Close()
		return nil, fmt.Errorf("%w: raft address %v cannot be dialled by peers; set RaftAdvertise", ErrInvalidConfig, adv)
	}
	return &tcpStreamLayer{Listener: ln, advertise: adv}, nil
}

func (t *tcpStreamLayer) Dial(addr raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	return (&net.Dialer{Timeout: timeout}).Dial("tcp", string(addr))
}

func (t *tcpStreamLayer) Addr() net.Addr { return t.advertise }

// tlsStreamLayer is the TCP stream layer with TLS on both ends.
type tlsStreamLayer struct {
	net.Listener
	advertise net.Addr
	client    *tls.Config
}

var _ raft.StreamLayer = (*tlsStreamLayer)(nil)

// NewTLSStreamLayer is NewTCPStreamLayer over TLS: it accepts connections with
// server and dials peers with client (the server name checked is the host of the
// address dialled, unless client sets one).
func NewTLSStreamLayer(bind, advertise string, server, client *tls.Config) (raft.StreamLayer, error) {
	l, err := NewTCPStreamLayer(bind, advertise)
	if err != nil {
		return nil, err
	}
	tcp := l.(*tcpStreamLayer)
	return &tlsStreamLayer{Listener: tls.NewListener(tcp.Listener, server), advertise: tcp.advertise, client: client}, nil
}

func (t *tlsStreamLayer) Dial(addr raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	return tls.DialWithDialer(&net.Dialer{Timeout: timeout}, "tcp", string(addr), t.client)
}

func (t *tlsStreamLayer) Addr() net.Addr { return t.advertise }
