package cputime

import (
	"testing"
	"time"
)

func TestProcessGrowsWithWork(t *testing.T) {
	before := Process()
	if before <= 0 {
		t.Fatalf("Process() = %v before any work; want > 0", before)
	}
	// Spin until the clock has moved by at least 20 ms of CPU (bounded by a
	// generous wall-clock deadline, so a starved machine fails clearly).
	deadline := time.Now().Add(time.Minute)
	x := uint64(1)
	for Process()-before < 20*time.Millisecond {
		for range 100000 {
			x = x*6364136223846793005 + 1442695040888963407
		}
		if time.Now().After(deadline) {
			t.Fatalf("CPU time moved by %v in a minute of spinning", Process()-before)
		}
	}
	if x == 0 {
		t.Log(x) // keeps the loop from being optimised away
	}
}
