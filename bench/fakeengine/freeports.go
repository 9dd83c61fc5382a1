package fakeengine

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
)

// StartOnFreePorts creates and starts an engine from cfg for tests and benchmarks
// whose engine has several data-parallel ranks. Rank r must bind port+r (vLLM's rule,
// which the indexer's connect mode follows), so a wildcard port cannot serve; this
// picks 2×DataParallelSize consecutive free ports (events first, then replay), binds
// the engine on them, and tries other ports when another process takes one between
// the check and the bind. cfg's event and replay endpoints are replaced.
func StartOnFreePorts(cfg Config, log *slog.Logger) (*Engine, error) {
	dp := max(cfg.DataParallelSize, 1)
	var lastErr error
	for range 20 {
		base, err := freePortRange(2 * dp)
		if err != nil {
			return nil, err
		}
		cfg.KVEventsEndpoint = fmt.Sprintf("tcp://*:%d", base)
		cfg.KVEventsReplayEndpoint = fmt.Sprintf("tcp://*:%d", base+dp)
		e, err := New(cfg, log)
		if err != nil {
			return nil, err
		}
		if lastErr = e.Start(); lastErr == nil {
			return e, nil
		}
		e.Close()
		if !strings.Contains(lastErr.Error(), "address already in use") {
			return nil, lastErr
		}
	}
	return nil, fmt.Errorf("fakeengine: no free port range after 20 tries: %w", lastErr)
}

// freePortRange returns the first of n consecutive ports that were free on every
// interface a moment ago.
func freePortRange(n int) (int, error) {
	for range 100 {
		first, err := net.Listen("tcp", ":0")
		if err != nil {
			return 0, err
		}
		base := first.Addr().(*net.TCPAddr).Port
		held := []net.Listener{first}
		for i := 1; i < n && base+i <= 65535; i++ {
			l, err := net.Listen("tcp", fmt.Sprintf(":%d", base+i))
			if err != nil {
				break
			}
			held = append(held, l)
		}
		for _, l := range held {
			l.Close()
		}
		if len(held) == n {
			return base, nil
		}
	}
	return 0, errors.New("fakeengine: no range of free consecutive ports")
}
