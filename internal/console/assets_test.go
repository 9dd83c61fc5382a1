package console

import (
	"io/fs"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
)

// TestAssetsAreSelfContained: the pages load nothing from another origin (no
// CDN, no web fonts), so the consoles work offline.
func TestAssetsAreSelfContained(t *testing.T) {
	external := regexp.MustCompile(`(?i)(src|href)\s*=\s*["']?(https?:)?//|@import|url\(\s*["']?(https?:)?//|fonts\.`)
	n := 0
	err := fs.WalkDir(Assets(), ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		n++
		b, err := fs.ReadFile(Assets(), path)
		if err != nil {
			return err
		}
		if m := external.Find(b); m != nil {
			t.Errorf("%s refers to another origin: %q", path, m)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n < 6 {
		t.Errorf("%d assets embedded, want the 6 of the two consoles", n)
	}
}

func TestAssetHandler(t *testing.T) {
	h := AssetHandler("/ui/assets/")
	for _, tc := range []struct {
		path, wantType string
		wantCode       int
	}{
		{"/ui/assets/console.css", "text/css", 200},
		{"/ui/assets/console.js", "javascript", 200},
		{"/ui/assets/missing.js", "", 404},
		{"/ui/assets/", "", 404},
	} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, tc.path, nil))
		if rec.Code != tc.wantCode || !strings.Contains(rec.Header().Get("Content-Type"), tc.wantType) {
			t.Errorf("%s: %d %q, want %d %q", tc.path, rec.Code, rec.Header().Get("Content-Type"), tc.wantCode, tc.wantType)
		}
		if tc.wantCode == 200 && !strings.Contains(rec.Header().Get("Content-Security-Policy"), "default-src 'self'") {
			t.Errorf("%s: no self-only Content-Security-Policy", tc.path)
		}
	}
	for _, page := range []string{"indexer.html", "router.html"} {
		rec := httptest.NewRecorder()
		ServePage(rec, page)
		if rec.Code != 200 || !strings.Contains(rec.Body.String(), `<html lang="en">`) {
			t.Errorf("%s: %d", page, rec.Code)
		}
	}
}
