// Package browsertest drives the consoles in a real headless Chromium (Debian's
// `chromium`, installed by scripts/deps.sh) through chromedp, for the
// end-to-end tests of internal/server and internal/router. A missing browser
// fails the test: it is never skipped.
//
// # Concurrency
//
// Each Browser belongs to one test; its context is cancelled (and the browser
// process ended) when the test ends. Screenshots go to ArtifactDir, outside the
// repository.
package browsertest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/chromedp"
)

// Executable finds the Chromium binary: $KVINDEX_CHROMIUM, else chromium or
// chromium-browser on PATH.
func Executable() (string, error) {
	if p := os.Getenv("KVINDEX_CHROMIUM"); p != "" {
		return p, nil
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("no chromium on PATH (make test installs it: scripts/deps.sh runs apt-get install chromium); set KVINDEX_CHROMIUM to use another")
}

// ArtifactDir is where screenshots go: $KVINDEX_ARTIFACTS, else
// $TMPDIR/kvindex-console-artifacts.
func ArtifactDir() string {
	if d := os.Getenv("KVINDEX_ARTIFACTS"); d != "" {
		return d
	}
	return filepath.Join(os.TempDir(), "kvindex-console-artifacts")
}

// New starts a headless Chromium for t and returns a tab's context, which
// expires after timeout. dark selects the dark color scheme.
func New(t *testing.T, timeout time.Duration, dark bool) context.Context {
	t.Helper()
	exe, err := Executable()
	if err != nil {
		t.Fatal(err)
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(exe),
		chromedp.Flag("headless", true),
		chromedp.Flag("no-sandbox", true), // root in CI containers
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("ignore-certificate-errors", true),
		chromedp.WindowSize(1400, 1000),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	tab, cancelTab := chromedp.NewContext(actx, chromedp.WithErrorf(t.Logf))
	t.Cleanup(func() { cancelTab(); cancelAlloc() })
	if err := chromedp.Do(tab); err != nil { // starts the browser, bound to tab (no timeout)
		t.Fatalf("starting %s: %v", exe, err)
	}
	ctx, cancelTimeout := context.WithTimeout(tab, timeout)
	t.Cleanup(cancelTimeout)
	scheme := "light"
	if dark {
		scheme = "dark"
	}
	if _, err := chromedp.Call(ctx, emulation.SetEmulatedMedia, emulation.SetEmulatedMediaParams{
		Features: []*emulation.MediaFeature{{Name: "prefers-color-scheme", Value: scheme}}}); err != nil {
		t.Fatalf("emulating prefers-color-scheme: %v", err)
	}
	return ctx
}

var unsafeName = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

// Screenshot saves a full-page PNG of the tab as <ArtifactDir>/<test>-<name>.png
// and returns its path.
func Screenshot(t *testing.T, ctx context.Context, name string) string {
	t.Helper()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	dir := ArtifactDir()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, unsafeName.ReplaceAllString(t.Name()+"-"+name, "_")+".png")
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", path)
	return path
}

// WaitText polls (every 50ms, until ctx's deadline) until the JavaScript
// expression js, evaluated in the page, returns a string for which ok is true,
// and returns it. It fails t with the last value otherwise.
func WaitText(t *testing.T, ctx context.Context, what, js string, ok func(string) bool) string {
	t.Helper()
	var last string
	var lastErr error
	for {
		var v string
		v, lastErr = chromedp.Run(ctx, chromedp.Evaluate[string](js))
		if lastErr == nil {
			last = v
			if ok(v) {
				return v
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: never happened (last value %q, last error %v)", what, last, lastErr)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
