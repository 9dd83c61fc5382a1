package server

import (
	"crypto/tls"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/kvindex/kvindex/internal/console/browsertest"
)

// pageRow is a row of the console's workers table as the page shows it.
type pageRow struct {
	ID, State                     string
	GPU, CPU, Disk, LastSeq, Gaps string
}

const readWorkersJS = `JSON.stringify([...document.querySelectorAll("#workers-table tbody tr")].map(tr => {
  const c = (k) => tr.querySelector('[data-col="' + k + '"]').textContent;
  return {ID: tr.dataset.key, State: c("state"), GPU: c("gpu_blocks"), CPU: c("cpu_blocks"), Disk: c("disk_blocks"), LastSeq: c("last_seq"), Gaps: c("gaps")};
}))`

func atoiPage(t *testing.T, s string) uint64 {
	t.Helper()
	n, err := strconv.ParseUint(strings.ReplaceAll(s, ",", ""), 10, 64)
	if err != nil {
		t.Fatalf("the page shows %q, not a number", s)
	}
	return n
}

// TestUIBrowserIndexer loads the indexer console over TLS, with an admin token
// set, in headless Chromium: the numbers shown are the APIs', the try panel's
// bars are hit-rate's, and a live update arrives after new events.
func TestUIBrowserIndexer(t *testing.T) {
	pki := newTestPKI(t)
	f := newFixture(t, fixtureOptions{clientTLS: &tls.Config{RootCAs: pki.pool, ServerName: "127.0.0.1"}, configure: func(c *Config) {
		c.TLSCert, c.TLSKey = pki.serverCert, pki.serverKy
		c.RaftTLSCA, c.RaftTLSCert, c.RaftTLSKey = pki.raftCAFile, pki.raftCert, pki.raftKey
		c.AdminToken = adminToken
	}})
	shared := tokens(0, 24)
	f.generate("e0", 0, concat(shared, tokens(50, 16)), "")
	f.generate("e1", 0, shared, "")
	f.generate("e2", 1, tokens(120, 20), "")

	ctx := browsertest.New(t, 3*time.Minute, false)
	if err := chromedp.Do(ctx, chromedp.Navigate(f.base+"/ui")); err != nil {
		t.Fatal(err)
	}
	eval := func(what, js string, ok func(string) bool) string { return browsertest.WaitText(t, ctx, what, js, ok) }
	eval("the first state", `document.body.dataset.updates || ""`, func(s string) bool { return s != "" })

	// Workers: the rows show GET /workers' numbers (the page may be one
	// snapshot behind, so wait for them; they do not change meanwhile). The
	// state flips between live and replaying (idle replays): any is fine.
	var want []pageRow
	for _, w := range f.workersNow().Workers {
		var lastSeq uint64
		for _, r := range w.DpRanks {
			lastSeq = max(lastSeq, r.LastSeq)
		}
		want = append(want, pageRow{ID: w.Spec.Id, GPU: strconv.FormatUint(w.GpuBlocks, 10), CPU: strconv.FormatUint(w.CpuBlocks, 10),
			Disk: strconv.FormatUint(w.DiskBlocks, 10), LastSeq: strconv.FormatUint(lastSeq, 10), Gaps: "0"})
	}
	var rows []pageRow
	eval(fmt.Sprintf("the worker rows of /workers %+v", want), readWorkersJS, func(s string) bool {
		if json.Unmarshal([]byte(s), &rows) != nil || len(rows) != len(want) {
			return false
		}
		for i := range rows {
			r := rows[i]
			r.State = ""
			r.GPU, r.CPU, r.Disk = strings.ReplaceAll(r.GPU, ",", ""), strings.ReplaceAll(r.CPU, ",", ""), strings.ReplaceAll(r.Disk, ",", "")
			if r != want[i] {
				return false
			}
		}
		return true
	})
	for _, r := range rows {
		if r.State != "live" && r.State != "replaying" && r.State != "connecting" {
			t.Errorf("%s: state %q", r.ID, r.State)
		}
	}
	// Cluster and index: equal to GET /cluster and the stats.
	var cluster clusterJSON
	_, body := f.get("/cluster")
	decodeInto(t, body, &cluster)
	text := func(id string) string {
		return eval(id, fmt.Sprintf(`document.getElementById(%q).textContent`, id), func(string) bool { return true })
	}
	if got := text("c-leader"); got != cluster.Leader {
		t.Errorf("leader shown %q, /cluster %q", got, cluster.Leader)
	}
	if got := text("c-term"); got != strconv.FormatUint(cluster.Term, 10) {
		t.Errorf("term shown %q, /cluster %d", got, cluster.Term)
	}
	stats := f.srv.api.stats()
	if got := atoiPage(t, text("i-nodes")); got != stats.Nodes {
		t.Errorf("nodes shown %d, stats %d", got, stats.Nodes)
	}
	if got := atoiPage(t, text("i-residencies")); got != stats.Residencies {
		t.Errorf("residencies shown %d, stats %d", got, stats.Residencies)
	}

	// The admin token: no admin action without it; typing it shows them.
	if n := eval("buttons", `String(document.querySelectorAll("#workers-table button[aria-label^=Unregister]").length)`, func(string) bool { return true }); n != "0" {
		t.Errorf("%s unregister buttons without the admin token", n)
	}
	if err := chromedp.Do(ctx, chromedp.SendKeys("#token", adminToken+"\t")); err != nil {
		t.Fatal(err)
	}
	eval("unregister buttons with the token", `String(document.querySelectorAll("#workers-table button[aria-label^=Unregister]").length)`,
		func(s string) bool { return s == "3" })

	// Filter by keyboard.
	if err := chromedp.Do(ctx, chromedp.SendKeys("#workers-filter", "e1")); err != nil {
		t.Fatal(err)
	}
	eval("the filter", `document.getElementById("workers-count").textContent`, func(s string) bool { return s == "1 of 3 rows" })

	// Try a prompt: token ids; the bars are hit-rate's.
	prompt := concat(shared, tokens(50, 16), tokens(200, 8))
	ids := make([]string, len(prompt))
	for i, id := range prompt {
		ids[i] = strconv.Itoa(int(id))
	}
	if err := chromedp.Do(ctx,
		chromedp.Click("#kind-tokens"),
		chromedp.SetValue("#try-prompt", strings.Join(ids, " ")),
		chromedp.Click("#try-go"),
	); err != nil {
		t.Fatal(err)
	}
	var bars []struct {
		Worker, Matched string
		Bars            []struct {
			Frac  string  // the data-frac of the segment
			Width float64 // its CSS width, in percent
		}
	}
	eval("the try table", `JSON.stringify([...document.querySelectorAll("#try-table tbody tr")].map(tr => ({Worker: tr.dataset.key,
	  Matched: tr.querySelector('[data-col="matched_blocks"]').textContent,
	  Bars: [...tr.querySelectorAll(".bar span")].map(s => ({Frac: s.dataset.frac, Width: parseFloat(s.style.width)}))})))`,
		func(s string) bool { return json.Unmarshal([]byte(s), &bars) == nil && len(bars) == 3 })
	var hit hitRateResponse
	_, body = f.postJSON("/kv-cache/hit-rate", map[string]any{"model": testModel, "token_ids": prompt})
	decodeInto(t, body, &hit)
	for i, p := range hit.Pods {
		b := bars[i]
		if b.Worker != p.Pod || b.Matched != strconv.Itoa(p.MatchedBlocks) || len(b.Bars) != 3 {
			t.Fatalf("row %d: %+v; hit-rate %+v", i, b, p)
		}
		for tier, frac := range []float64{p.GPUHitRate, p.CPUHitRate, p.DiskHitRate} {
			got := b.Bars[tier]
			if got.Frac != strconv.FormatFloat(frac, 'f', -1, 64) || math.Abs(got.Width-frac*100) > 0.006 {
				t.Errorf("%s tier %d: bar %+v, hit-rate %v", p.Pod, tier, got, frac)
			}
		}
	}
	if p := hit.Pods[0]; p.Pod != "e0" || p.MatchedBlocks != 10 {
		t.Errorf("hit-rate's best worker %+v, want e0 with 10 blocks", p)
	}
	path := eval("the block path", `String(document.querySelectorAll("ol.path li").length) + " " + String(document.querySelectorAll("ol.path li.held").length)`,
		func(s string) bool { return s != "0 0" })
	if want := fmt.Sprintf("%d %d", hit.TotalBlocks, hit.Pods[0].MatchedBlocks); path != want {
		t.Errorf("block path: %s blocks/held, want %s", path, want)
	}
	browsertest.Screenshot(t, ctx, "light")

	// A live update: new events on e0 reach the page without a reload.
	setFilter := func(v string) {
		t.Helper()
		js := fmt.Sprintf(`(() => { const e = document.getElementById("workers-filter"); e.value = %q; e.dispatchEvent(new Event("input")); return "ok"; })()`, v)
		eval("setting the filter", js, func(string) bool { return true })
	}
	setFilter("e0")
	before := f.workersNow().Workers[0].GpuBlocks
	f.generate("e0", 0, tokens(150, 32), "")
	after := f.workersNow().Workers[0]
	if after.GpuBlocks == before {
		t.Fatalf("e0 still holds %d blocks after generating", before)
	}
	eval("e0's new block count", readWorkersJS, func(s string) bool {
		var rows []pageRow
		return json.Unmarshal([]byte(s), &rows) == nil && len(rows) == 1 && strings.ReplaceAll(rows[0].GPU, ",", "") == strconv.FormatUint(after.GpuBlocks, 10)
	})

	// Dark mode by the keyboard-reachable toggle.
	setFilter("")
	if err := chromedp.Do(ctx, chromedp.Click("#theme")); err != nil {
		t.Fatal(err)
	}
	eval("dark theme", `document.documentElement.dataset.theme || ""`, func(s string) bool { return s == "dark" })
	browsertest.Screenshot(t, ctx, "dark")
}
