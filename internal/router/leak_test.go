package router

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests when a goroutine they started outlives
// them: every goroutine a Router starts (proxying, the ledger stream,
// discovery, scraping, breaker timers, the EPP) must end when it stops. The
// idle keep-alive connections of net/http's pool (the tests' clients and the
// router's upstream transport, closed by the tests' own cleanup order) are
// left out.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"))
}
