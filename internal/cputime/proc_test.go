package cputime

import (
	"os"
	"testing"
	"time"
)

// Of reads this process's CPU time, which grows while it computes; a pid that
// does not exist is an error.
func TestOfGrowsWithWork(t *testing.T) {
	before, err := Of(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	x := uint64(1)
	for deadline := time.Now().Add(30 * time.Second); ; {
		for range 1 << 20 {
			x = x*6364136223846793005 + 1442695040888963407
		}
		now, err := Of(os.Getpid())
		if err != nil {
			t.Fatal(err)
		}
		if now < before {
			t.Fatalf("CPU time went back from %v to %v", before, now)
		}
		if now > before {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("CPU time stayed %v through 30s of computing (%d)", before, x)
		}
	}
	if _, err := Of(1 << 30); err == nil {
		t.Error("Of a pid that does not exist: no error")
	}
}
