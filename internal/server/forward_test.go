package server

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvindex/kvindex/internal/ingest/wire"
)

// TestForwarderQueueIsBounded: while nothing sends (no leader), a member's
// queue of frames for the leader takes what its bounds allow and drops and
// counts the rest; a frame no ForwardEvents message could carry is dropped at
// once.
func TestForwarderQueueIsBounded(t *testing.T) {
	const maxMessage = 64 << 10
	for _, c := range []struct {
		name        string
		payload     int
		frames      int
		queued      int
		full, large float64
	}{
		{"small frames hit the frame bound", 10, forwardQueueFrames + 100, forwardQueueFrames, 100, 0},
		{"large frames hit the byte bound", maxMessage - 1024, 2000, forwardQueueBytes / (maxMessage - 1024 + 8 + forwardFrameOverhead), 2000 - forwardQueueBytes/(maxMessage-1024+8+forwardFrameOverhead), 0},
		{"a frame larger than a message", maxMessage, 3, 0, 0, 3},
	} {
		t.Run(c.name, func(t *testing.T) {
			f, err := newFrameForwarder(nil, nil, maxMessage, nil, prometheus.NewRegistry())
			if err != nil {
				t.Fatal(err)
			}
			fr := wire.Frame{Topic: "kv@pod@m" /* 8 bytes */, Seq: 1, Payload: make([]byte, c.payload)}
			for range c.frames {
				f.Forward(fr)
			}
			if got := len(f.queue); got != c.queued {
				t.Errorf("queued %d frames, want %d", got, c.queued)
			}
			if got := f.queued.Load(); got > forwardQueueBytes || got != int64(c.queued*frameSize(fr)) {
				t.Errorf("queued bytes %d, want %d (bound %d)", got, c.queued*frameSize(fr), forwardQueueBytes)
			}
			if got := testutil.ToFloat64(f.full); got != c.full {
				t.Errorf("counted full %v, want %v", got, c.full)
			}
			if got := testutil.ToFloat64(f.tooLarge); got != c.large {
				t.Errorf("counted too_large %v, want %v", got, c.large)
			}
		})
	}
	if _, err := newFrameForwarder(nil, nil, 1024, nil, nil); err != nil {
		t.Errorf("a forwarder without a registry: %v", err)
	}
	reg := prometheus.NewRegistry()
	newFrameForwarder(nil, nil, 1024, nil, reg)
	if _, err := newFrameForwarder(nil, nil, 1024, nil, reg); err == nil || !strings.Contains(err.Error(), "kvindex_ingest_forward_frames_total") {
		t.Errorf("a second forwarder on one registry = %v, want the duplicate metric named", err)
	}
}
