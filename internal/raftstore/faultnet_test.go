package raftstore

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

// faultNet injects network faults between the nodes of a test cluster. Every node
// talks through a faultLayer: a real TCP listener on 127.0.0.1 and real dialled
// connections, tracked so that a partition can refuse new connections across the
// cut and close the open ones.
type faultNet struct {
	mu     sync.Mutex
	side   map[string]int        // node id -> partition side; all 0 when healed
	byAddr map[string]string     // dialled connection's local address -> dialling node id
	conns  map[*faultConn]string // open connections -> owning node id
}

func newFaultNet() *faultNet {
	return &faultNet{side: map[string]int{}, byAddr: map[string]string{}, conns: map[*faultConn]string{}}
}

var errPartitioned = errors.New("faultnet: partitioned")

func (fn *faultNet) cutLocked(a, b string) bool { return fn.side[a] != fn.side[b] }

// partition puts ids on side 1, everyone else on side 0, and closes every open
// connection that crosses the cut.
func (fn *faultNet) partition(ids ...string) {
	fn.mu.Lock()
	for id := range fn.side {
		fn.side[id] = 0
	}
	for _, id := range ids {
		fn.side[id] = 1
	}
	var doomed []*faultConn
	for c := range fn.conns {
		if c.peer != "" && fn.cutLocked(c.local, c.peer) {
			doomed = append(doomed, c)
		}
	}
	fn.mu.Unlock()
	for _, c := range doomed {
		c.Close()
	}
}

func (fn *faultNet) heal() {
	fn.mu.Lock()
	defer fn.mu.Unlock()
	for id := range fn.side {
		fn.side[id] = 0
	}
}

// closeAll closes every connection of node id, as if its process died.
func (fn *faultNet) closeAll(id string) {
	fn.mu.Lock()
	var doomed []*faultConn
	for c, owner := range fn.conns {
		if owner == id {
			doomed = append(doomed, c)
		}
	}
	fn.mu.Unlock()
	for _, c := range doomed {
		c.Close()
	}
}

// faultLayer is the raft.StreamLayer of one node.
type faultLayer struct {
	net.Listener
	fn    *faultNet
	id    string
	addrs map[string]string // raft address -> node id, shared by the cluster
}

var _ raft.StreamLayer = (*faultLayer)(nil)

func (fn *faultNet) listen(id, addr string, addrs map[string]string) (*faultLayer, error) {
	var ln net.Listener
	var err error
	// A restarted node takes its old port back; retry briefly in case the old
	// listener is still being torn down.
	for range 50 {
		if ln, err = net.Listen("tcp", addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		return nil, err
	}
	fn.mu.Lock()
	if _, ok := fn.side[id]; !ok {
		fn.side[id] = 0
	}
	fn.mu.Unlock()
	return &faultLayer{Listener: ln, fn: fn, id: id, addrs: addrs}, nil
}

func (l *faultLayer) Dial(addr raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	l.fn.mu.Lock()
	peer := l.addrs[string(addr)]
	cut := l.fn.cutLocked(l.id, peer)
	l.fn.mu.Unlock()
	if cut {
		return nil, fmt.Errorf("dial %s from %s: %w", peer, l.id, errPartitioned)
	}
	c, err := net.DialTimeout("tcp", string(addr), timeout)
	if err != nil {
		return nil, err
	}
	fc := &faultConn{Conn: c, fn: l.fn, local: l.id, peer: peer}
	l.fn.mu.Lock()
	// Registered before raft writes anything on c, so before the acceptor's first
	// Read returns: that is when the acceptor looks its peer up.
	l.fn.byAddr[c.LocalAddr().String()] = l.id
	l.fn.conns[fc] = l.id
	l.fn.mu.Unlock()
	return fc, nil
}

func (l *faultLayer) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	fc := &faultConn{Conn: c, fn: l.fn, local: l.id}
	l.fn.mu.Lock()
	l.fn.conns[fc] = l.id
	l.fn.mu.Unlock()
	return fc, nil
}

// faultConn is a real connection that fails once its two ends are partitioned.
type faultConn struct {
	net.Conn
	fn          *faultNet
	local, peer string // peer is learnt on the first Read of an accepted connection
	closeOnce   sync.Once
}

func (c *faultConn) check() error {
	c.fn.mu.Lock()
	if c.peer == "" {
		c.peer = c.fn.byAddr[c.Conn.RemoteAddr().String()]
	}
	cut := c.peer != "" && c.fn.cutLocked(c.local, c.peer)
	c.fn.mu.Unlock()
	if cut {
		c.Close()
		return errPartitioned
	}
	return nil
}

func (c *faultConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if err == nil {
		err = c.check()
		if err != nil {
			n = 0
		}
	}
	return n, err
}

func (c *faultConn) Write(b []byte) (int, error) {
	if err := c.check(); err != nil {
		return 0, err
	}
	return c.Conn.Write(b)
}

func (c *faultConn) Close() error {
	var err error
	c.closeOnce.Do(func() {
		err = c.Conn.Close()
		c.fn.mu.Lock()
		delete(c.fn.conns, c)
		delete(c.fn.byAddr, c.Conn.LocalAddr().String())
		c.fn.mu.Unlock()
	})
	return err
}
