package router

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvindex/kvindex/internal/console/browsertest"
)

// TestUIBrowserRouter loads the router console in headless Chromium over a
// router with an indexer and three engines: the numbers shown are the router's
// metrics, a decision's candidates are /ui/api/decisions', the dry-run form
// answers what POST /debug/route answers, and a new request shows up live.
func TestUIBrowserRouter(t *testing.T) {
	f := startFleet(t, 3, nil)
	ix := startIndexer(t, f)
	cfg := testConfig(t, f)
	cfg.Indexer = []string{ix.addr}
	r := startRouter(t, cfg)
	convA, convB := words("alpha", 60), words("beta", 50)
	for _, c := range []string{convA, convB, convA + " again"} {
		if code, _, body := post(t, r.url, "/v1/chat/completions", chatBody(c)); code != http.StatusOK {
			t.Fatalf("%d %s", code, body)
		}
		ix.caughtUp(t, f)
	}

	ctx := browsertest.New(t, 3*time.Minute, false)
	if err := chromedp.Do(ctx, chromedp.Navigate(r.url+"/ui")); err != nil {
		t.Fatal(err)
	}
	eval := func(what, js string, ok func(string) bool) string { return browsertest.WaitText(t, ctx, what, js, ok) }
	always := func(string) bool { return true }

	// Workers: served, trips and breaker state are the metrics'.
	// (read on each poll: a request's result is counted just after its last byte)
	wantWorkers := func() string {
		want := map[string]string{}
		for _, id := range f.ids {
			want[id] = fmt.Sprintf("closed %v %v",
				testutil.ToFloat64(r.metrics.breakerTrips.WithLabelValues(id)), testutil.ToFloat64(r.metrics.requests.WithLabelValues(PolicyKVAware, resultOK, id)))
		}
		b, _ := json.Marshal(want)
		return string(b)
	}
	eval("worker rows equal to the metrics", `JSON.stringify(Object.fromEntries([...document.querySelectorAll("#workers-table tbody tr")].map(tr => {
	  const c = (k) => tr.querySelector('[data-col="' + k + '"]').textContent;
	  return [tr.dataset.key, c("breaker") + " " + c("breaker_trips") + " " + c("served")];
	})))`, func(s string) bool {
		served := 0.0
		for _, id := range f.ids {
			served += testutil.ToFloat64(r.metrics.requests.WithLabelValues(PolicyKVAware, resultOK, id))
		}
		return served == 3 && s == wantWorkers()
	})

	// Decisions by policy and source, and the hit totals.
	// (every policy/source the metrics have, zeros included, and 3 in all)
	eval("decision counts equal to the metrics", `JSON.stringify(Object.fromEntries([...document.querySelectorAll("#decisions tbody tr")].map(tr =>
	  [tr.dataset.key, tr.querySelector('[data-col="count"]').textContent])))`, func(s string) bool {
		var shown map[string]string
		if json.Unmarshal([]byte(s), &shown) != nil {
			return false
		}
		total := 0.0
		for key, v := range shown {
			policy, source, _ := strings.Cut(key, "/")
			n := testutil.ToFloat64(r.metrics.decisions.WithLabelValues(policy, source))
			if v != strconv.FormatFloat(n, 'f', -1, 64) {
				return false
			}
			total += n
		}
		return total == 3
	})
	hits := fmt.Sprintf("%v %v", testutil.ToFloat64(r.metrics.hitAvailable), testutil.ToFloat64(r.metrics.hitCaptured))
	if got := eval("hit totals", `document.getElementById("hit-available").textContent.replaceAll(",", "") + " " + document.getElementById("hit-captured").textContent.replaceAll(",", "")`, always); got != hits {
		t.Errorf("hit totals shown %q, metrics %q", got, hits)
	}

	// The last decisions; the newest's details are /ui/api/decisions' candidates.
	eval("3 recent decisions", `document.getElementById("recent-count").textContent`, func(s string) bool { return s == "3 rows" })
	resp, err := http.Get(r.url + "/ui/api/decisions/3")
	if err != nil {
		t.Fatal(err)
	}
	var d3 uiDecision
	if err := json.NewDecoder(resp.Body).Decode(&d3); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if err := chromedp.Do(ctx, chromedp.Click(`#recent-table button[aria-label="Details of decision 3"]`)); err != nil {
		t.Fatal(err)
	}
	wantCands := []string{}
	for _, c := range d3.Candidates {
		wantCands = append(wantCands, fmt.Sprintf("%s/%d %.2f %.2f", c.Worker, c.DPRank, c.Cost, c.Terms.OverlapWeighted))
	}
	candsJSON, _ := json.Marshal(wantCands)
	eval("decision 3's candidates "+string(candsJSON), `JSON.stringify([...document.querySelectorAll("#decision-detail table.candidates tbody tr")].map(tr =>
	  tr.dataset.key + " " + tr.querySelector('[data-col="cost"]').textContent + " " + tr.querySelector('[data-col="term-overlap_weighted"]').textContent))`,
		func(s string) bool { return s == string(candsJSON) })
	if d3.Worker == "" || d3.OverlapBlocks == 0 {
		t.Errorf("the repeated conversation's decision %+v captured nothing", d3.decisionJSON)
	}

	// The dry run answers what POST /debug/route answers.
	if err := chromedp.Do(ctx, chromedp.SetValue("#dry-prompt", convA+" once more"), chromedp.Click("#dry-go")); err != nil {
		t.Fatal(err)
	}
	shown := eval("the dry-run decision", `(() => { const p = document.querySelector("#dry-result .decision-summary"); return p ? p.textContent : ""; })()`,
		func(s string) bool { return s != "" })
	resp, err = http.Post(r.url+"/debug/route", "application/json", strings.NewReader(
		fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%s}],"max_tokens":16}`, testModel, quote(convA+" once more"))))
	if err != nil {
		t.Fatal(err)
	}
	var dry decisionJSON
	if err := json.NewDecoder(resp.Body).Decode(&dry); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if want := fmt.Sprintf("%s → %s#%d", dry.Policy, dry.Worker, dry.DPRank); !strings.HasPrefix(shown, want) ||
		!strings.Contains(shown, fmt.Sprintf("%d of %d blocks captured", dry.OverlapBlocks, dry.PromptBlocks)) {
		t.Errorf("dry run shows %q; /debug/route: %+v", shown, dry)
	}
	browsertest.Screenshot(t, ctx, "light")

	// A live update: a new request appears without a reload.
	if code, _, body := post(t, r.url, "/v1/chat/completions", chatBody(convB+" again")); code != http.StatusOK {
		t.Fatalf("%d %s", code, body)
	}
	eval("the 4th decision", `document.getElementById("recent-count").textContent`, func(s string) bool { return s == "4 rows" })

	if err := chromedp.Do(ctx, chromedp.Click("#theme")); err != nil {
		t.Fatal(err)
	}
	eval("dark theme", `document.documentElement.dataset.theme || ""`, func(s string) bool { return s == "dark" })
	browsertest.Screenshot(t, ctx, "dark")
}
