package raftstore

import (
	"crypto/tls"
	"fmt"
	"net"
	"strconv"
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
// address when empty), which must name a specific host that peers can dial: an
// IP address, or a DNS name kept as a name. A name is what a StatefulSet gives a
// member (pod-0.svc-headless.ns.svc:7090): its pod IP changes when the pod is
// rescheduled, its name does not, and peers resolve it at every dial, so the
// member's address in the raft configuration stays right across restarts.
func NewTCPStreamLayer(bind, advertise string) (raft.StreamLayer, error) {
	var adv net.Addr
	if advertise != "" {
		var err error
		if adv, err = advertiseAddr(advertise); err != nil {
			return nil, err
		}
	}
	ln, err := net.Listen("tcp", bind)
	if err != nil {
		return nil, fmt.Errorf("raftstore: raft listener: %w", err)
	}
	if adv == nil {
		adv = ln.Addr()
		if tcp, ok := adv.(*net.TCPAddr); !ok || tcp.IP == nil || tcp.IP.IsUnspecified() {
			ln.Close()
			return nil, fmt.Errorf("%w: raft address %v cannot be dialled by peers; set RaftAdvertise", ErrInvalidConfig, adv)
		}
	}
	return &tcpStreamLayer{Listener: ln, advertise: adv}, nil
}

// hostAddr is an advertised address that is a DNS name and a port.
type hostAddr string

func (a hostAddr) Network() string { return "tcp" }
func (a hostAddr) String() string  { return string(a) }

// advertiseAddr checks an advertised host:port: a specific IP (not 0.0.0.0 or
// ::) or a DNS name, and a port.
func advertiseAddr(advertise string) (net.Addr, error) {
	host, portText, err := net.SplitHostPort(advertise)
	var port uint64
	if err == nil {
		port, err = strconv.ParseUint(portText, 10, 16)
	}
	if err != nil || host == "" {
		return nil, fmt.Errorf("%w: RaftAdvertise %q is not host:port", ErrInvalidConfig, advertise)
	}
	if ip := net.ParseIP(host); ip != nil {
		if ip.IsUnspecified() {
			return nil, fmt.Errorf("%w: RaftAdvertise %q cannot be dialled by peers (unspecified address)", ErrInvalidConfig, advertise)
		}
		return &net.TCPAddr{IP: ip, Port: int(port)}, nil
	}
	return hostAddr(net.JoinHostPort(host, portText)), nil
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
