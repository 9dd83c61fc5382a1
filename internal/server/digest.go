package server

import (
	"encoding/hex"
	"sync"
	"time"

	"github.com/kvindex/kvindex/internal/radix"
)

// digests computes the index digest (radix's canonical SHA-256) at an applied
// index, from one copy of the index taken between two applied entries, so the
// digest and its applied index describe the same state. Replicas at the same
// applied index must have the same digest: that is how operators and tests
// compare them. A digest copies and hashes the whole index, and the apply
// loop waits for the copy, so one is computed at a time and at most every
// minDigestInterval: within it, the last digest is answered with its own
// (older) applied index. Stats and Cluster are public; this is what keeps a
// client that polls them from stalling the apply loop.
type digests struct {
	copyIndex func() (*radix.Snapshot, uint64)
	applied   func() uint64
	// interval is minDigestInterval, shorter in tests.
	interval time.Duration

	mu     sync.Mutex
	valid  bool      // guarded by mu
	at     uint64    // guarded by mu
	taken  time.Time // guarded by mu
	digest string    // guarded by mu
}

// minDigestInterval bounds how often the index is copied for a digest.
const minDigestInterval = time.Second

// get returns the digest (hex) and the applied index it was taken at.
func (d *digests) get() (string, uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.valid && (d.at == d.applied() || time.Since(d.taken) < d.interval) {
		return d.digest, d.at
	}
	snap, at := d.copyIndex()
	sum := snap.Digest()
	d.valid, d.at, d.taken, d.digest = true, at, time.Now(), hex.EncodeToString(sum[:])
	return d.digest, d.at
}
