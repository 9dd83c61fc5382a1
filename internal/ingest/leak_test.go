package ingest

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests when a goroutine they started outlives
// them: every goroutine of the package must end when what started it stops.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
