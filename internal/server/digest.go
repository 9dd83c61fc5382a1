package server

import (
	"encoding/hex"
	"sync"

	"github.com/kvindex/kvindex/internal/radix"
)

// digests computes the index digest (radix's canonical SHA-256) at an applied
// index, from one copy of the index taken between two applied entries, so the
// digest and its applied index describe the same state. Replicas at the same
// applied index must have the same digest: that is how operators and tests
// compare them. A digest copies and hashes the whole index, so one is computed
// at a time, and an answer is reused while the applied index has not moved.
type digests struct {
	copyIndex func() (*radix.Snapshot, uint64)
	applied   func() uint64

	mu     sync.Mutex
	valid  bool   // guarded by mu
	at     uint64 // guarded by mu
	digest string // guarded by mu
}

// get returns the digest (hex) and the applied index it was taken at.
func (d *digests) get() (string, uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.valid && d.at == d.applied() {
		return d.digest, d.at
	}
	snap, at := d.copyIndex()
	sum := snap.Digest()
	d.valid, d.at, d.digest = true, at, hex.EncodeToString(sum[:])
	return d.digest, d.at
}
