package routebench

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestFleetStartReportsAnEngineThatExits: an engine that dies before it is ready
// (as one does when its port was taken between picking and binding) ends the
// start at once with its log, after the bounded retries, instead of a minute of
// polling a dead address.
func TestFleetStartReportsAnEngineThatExits(t *testing.T) {
	bin := t.TempDir()
	script := "#!/bin/sh\necho \"bind: address already in use ($*)\" >&2\nexit 3\n"
	for _, name := range []string{"fakeengine", "indexer"} {
		if err := os.WriteFile(filepath.Join(bin, name), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cfg := DefaultConfig()
	cfg.ApplyQuick()
	cfg.Workers, cfg.BinDir = 2, bin
	var log strings.Builder
	f, err := startFleet(context.Background(), &cfg, &log)
	if err == nil {
		f.close()
		t.Fatal("a fleet whose engines exit started")
	}
	if !errors.Is(err, errExited) || !strings.Contains(err.Error(), "address already in use") {
		t.Fatalf("error %q: want errExited with the engine's log", err)
	}
	if got := strings.Count(log.String(), "retrying on fresh ports"); got != startAttempts-1 {
		t.Errorf("%d retries logged, want %d:\n%s", got, startAttempts-1, log.String())
	}
}
