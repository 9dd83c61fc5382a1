package server

import (
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/radix"
)

// TestDigestsCopyTheIndexAtMostOncePerInterval: while the applied index moves,
// a digest asked for again within the interval is the last one, with its own
// applied index; past the interval it is taken again.
func TestDigestsCopyTheIndexAtMostOncePerInterval(t *testing.T) {
	ix := radix.New(radix.Config{})
	applied, copies := uint64(0), 0
	d := digests{
		copyIndex: func() (*radix.Snapshot, uint64) { copies++; return ix.Snapshot(), applied },
		applied:   func() uint64 { return applied },
		interval:  time.Hour,
	}
	applied = 5
	if _, at := d.get(); at != 5 || copies != 1 {
		t.Fatalf("first digest at %d after %d copies", at, copies)
	}
	applied = 6
	if _, at := d.get(); at != 5 || copies != 1 {
		t.Errorf("a digest within the interval: at %d after %d copies, want the last one (5) and no copy", at, copies)
	}
	d.interval = 0
	if _, at := d.get(); at != 6 || copies != 2 {
		t.Errorf("a digest past the interval: at %d after %d copies, want 6 and a new copy", at, copies)
	}
	if _, at := d.get(); at != 6 || copies != 2 {
		t.Errorf("the applied index did not move: at %d after %d copies, want the same digest", at, copies)
	}
}
