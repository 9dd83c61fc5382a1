package server

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests when a goroutine they started outlives
// them: every goroutine of the package (and of the raft node, ingest Manager
// and change feed a Server starts) must end when the Server stops. The idle
// keep-alive connections of the tests' own HTTP clients belong to net/http's
// pool, not to the server, and are left out.
func TestMain(m *testing.M) {
	if jobFile := os.Getenv(benchClientEnv); jobFile != "" {
		if err := runBenchClient(jobFile); err != nil {
			fmt.Fprintln(os.Stderr, "bench client:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	goleak.VerifyTestMain(stopBenchServer{m},
		goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"))
}

// stopBenchServer stops the server the benchmarks share (started once, on first
// use) when the tests and benchmarks are done, before the leak check.
type stopBenchServer struct{ m *testing.M }

func (s stopBenchServer) Run() int {
	code := s.m.Run()
	if bench != nil {
		bench.conn.Close()
		bench.stop()
	}
	return code
}
