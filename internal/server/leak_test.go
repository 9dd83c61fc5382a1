package server

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests when a goroutine they started outlives
// them: every goroutine of the package (and of the raft node, ingest Manager
// and change feed a Server starts) must end when the Server stops. The idle
// keep-alive connections of the tests' own HTTP clients belong to net/http's
// pool, not to the server, and are left out.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"))
}
