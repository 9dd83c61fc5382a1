package raftstore

import (
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
