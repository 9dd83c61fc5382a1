package routebench

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestQuickLive is `routebench --quick`: the live fleet (fake engines, the
// indexer and the router as real processes) replays the chat trace through
// round-robin and kv-aware. It asserts only what holds on any machine: no request
// fails and kv-aware's engine-side hit rate exceeds round-robin's.
func TestQuickLive(t *testing.T) {
	bin := t.TempDir()
	gomod, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatalf("go env GOMOD: %v", err)
	}
	build := exec.Command("go", "build", "-o", bin+string(os.PathSeparator), "./cmd/fakeengine", "./cmd/indexer", "./cmd/router")
	build.Dir = filepath.Dir(strings.TrimSpace(string(gomod)))
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the fleet's binaries: %v\n%s", err, out)
	}
	cfg := DefaultConfig()
	cfg.ApplyQuick()
	cfg.BinDir, cfg.Out = bin, t.TempDir()
	cfg.Progress = false
	rows, err := Run(context.Background(), cfg, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	hit := map[string]float64{}
	for _, r := range rows {
		t.Logf("%s: %d requests, %d failed, hit rate %.3f, TTFT p50 %.1f ms", r.Policy, r.Requests, r.Failed, r.HitRate, r.TTFTP50)
		if r.Failed != 0 {
			t.Errorf("%s: %d of %d requests failed", r.Policy, r.Failed, r.Requests)
		}
		hit[r.Policy] = r.HitRate
	}
	if len(hit) != 2 || !(hit["kv-aware"] > hit["round-robin"]) {
		t.Errorf("kv-aware hit rate %.3f does not exceed round-robin's %.3f", hit["kv-aware"], hit["round-robin"])
	}
	if _, err := os.Stat(filepath.Join(cfg.Out, "results.csv")); err != nil {
		t.Error(err)
	}
}
