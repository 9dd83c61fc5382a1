package logbuf

import (
	"fmt"
	"strings"
	"sync"
	"testing"
)

func TestConcurrentWritersAreAllKept(t *testing.T) {
	var b Buffer
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 100 {
				fmt.Fprintf(&b, "w%d-%d\n", w, i)
				_ = b.String()
			}
		}()
	}
	wg.Wait()
	lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	if len(lines) != 800 {
		t.Fatalf("%d lines kept, 800 written", len(lines))
	}
	seen := map[string]bool{}
	for _, l := range lines {
		seen[l] = true
	}
	if len(seen) != 800 {
		t.Fatalf("%d distinct lines, want 800 (writes interleaved)", len(seen))
	}
}
