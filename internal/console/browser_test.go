package console_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"

	"github.com/kvindex/kvindex/internal/console"
	"github.com/kvindex/kvindex/internal/console/browsertest"
)

// TestBrowserHundredsOfWorkers serves the indexer page over a synthetic state
// of 300 workers: the table pages, sorts by keyboard and filters.
func TestBrowserHundredsOfWorkers(t *testing.T) {
	const n = 300
	workers := make([]map[string]any, n)
	for i := range workers {
		workers[i] = map[string]any{"id": fmt.Sprintf("w-%03d", i), "model": "m", "state": "live",
			"gpu_blocks": (i * 37) % 1000, "cpu_blocks": 0, "disk_blocks": 0, "last_seq": i, "event_rate": 0,
			"gaps": 0, "replayed": 0, "resets": 0, "lag_seconds": 0}
	}
	state := map[string]any{"node_id": "synthetic", "models": []string{"m"}, "workers": workers,
		"cluster": map[string]any{"leader": "synthetic", "term": 1, "members": []any{}}, "timeline": []any{},
		"index": map[string]any{"counters": map[string]int{}}}
	hub := console.NewHub(console.HubConfig{Snapshot: func(context.Context) (any, error) { return state, nil }})
	mux := http.NewServeMux()
	mux.HandleFunc("GET /ui", func(w http.ResponseWriter, _ *http.Request) { console.ServePage(w, "indexer.html") })
	mux.Handle("GET /ui/assets/{file}", console.AssetHandler("/ui/assets/"))
	mux.Handle("GET /ui/api/events", hub)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	ctx := browsertest.New(t, 2*time.Minute, false)
	if err := chromedp.Do(ctx, chromedp.Navigate(srv.URL+"/ui")); err != nil {
		t.Fatal(err)
	}
	eval := func(what, js string, want string) {
		t.Helper()
		browsertest.WaitText(t, ctx, what+" = "+want, js, func(s string) bool { return s == want })
	}
	count := `document.getElementById("workers-count").textContent + " | " + document.getElementById("workers-page").textContent + " | " +
	  document.querySelectorAll("#workers-table tbody tr").length + " | " + document.querySelector("#workers-table tbody tr").dataset.key`
	eval("the first page", count, "300 rows | page 1 of 12 | 25 | w-000")
	if err := chromedp.Do(ctx, chromedp.Click(`#workers .pager button:last-child`)); err != nil {
		t.Fatal(err)
	}
	eval("the second page", count, "300 rows | page 2 of 12 | 25 | w-025")

	// Sort by GPU blocks with the keyboard: focus the header button, press
	// Enter; a new sort starts again at page 1.
	if err := chromedp.Do(ctx, chromedp.Focus(`#workers-table th:nth-child(4) button`), chromedp.KeyEvent(kb.Enter)); err != nil {
		t.Fatal(err)
	}
	best := 0
	for i := range n {
		if (i*37)%1000 > (best*37)%1000 {
			best = i
		}
	}
	eval("sorted by GPU blocks, highest first", `document.querySelector("#workers-table th[aria-sort=descending]").textContent + " " +
	  document.querySelector("#workers-table tbody tr").dataset.key + " " + document.getElementById("workers-page").textContent`,
		"GPU blocks "+fmt.Sprintf("w-%03d", best)+" page 1 of 12")
	// Enter again: lowest first (the focus stayed on the redrawn header).
	eval("focus kept on the header", `document.activeElement.textContent`, "GPU blocks")
	if err := chromedp.Do(ctx, chromedp.KeyEvent(kb.Enter)); err != nil {
		t.Fatal(err)
	}
	eval("sorted by GPU blocks, lowest first", `document.querySelector("#workers-table th[aria-sort=ascending]").textContent + " " +
	  document.querySelector("#workers-table tbody tr").dataset.key`, "GPU blocks w-000")

	if err := chromedp.Do(ctx, chromedp.SendKeys("#workers-filter", "w-29")); err != nil {
		t.Fatal(err)
	}
	eval("the filter", `document.getElementById("workers-count").textContent + " | " + document.getElementById("workers-page").textContent`,
		strconv.Itoa(10)+" of 300 rows | page 1 of 1") // w-290 … w-299
	browsertest.Screenshot(t, ctx, "filtered")
}
