package router

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/kvindex/kvindex/internal/logbuf"
	"github.com/kvindex/kvindex/internal/workerspec"
)

var (
	// descPattern reads a prometheus.Desc's String(): name, const and variable labels.
	descPattern = regexp.MustCompile(`^Desc\{fqName: "([^"]*)", help: .*, constLabels: \{(.*)\}, variableLabels: \{(.*)\}\}$`)
	// docMetric is a metric name as docs/router.md writes it: braces for
	// alternatives (kvindex_tokenize_cache_{hits,misses}_total) or, at the end,
	// for labels (kvindex_router_token_parity{model}, …_inflight{scope="fleet"}).
	docMetric = regexp.MustCompile("`(kvindex_(?:router|tokenize)_[a-z_{},=\"]+)")
	// labelSuffix is a trailing label selector: one name, or name="value".
	labelSuffix = regexp.MustCompile(`\{\w+(="\w*")?\}$`)
)

// registeredMetrics is every metric the router's registry describes, by name,
// with its label names (variable and constant), sorted.
func registeredMetrics(t *testing.T, reg *prometheus.Registry) map[string][]string {
	t.Helper()
	ch := make(chan *prometheus.Desc)
	go func() { reg.Describe(ch); close(ch) }()
	out := map[string][]string{}
	for d := range ch {
		m := descPattern.FindStringSubmatch(d.String())
		if m == nil {
			t.Fatalf("cannot read descriptor %s", d)
		}
		var labels []string
		for _, cl := range regexp.MustCompile(`(\w+)=`).FindAllStringSubmatch(m[2], -1) {
			labels = append(labels, cl[1])
		}
		if m[3] != "" {
			labels = append(labels, strings.Split(m[3], ",")...)
		}
		slices.Sort(labels)
		out[m[1]] = slices.Compact(labels)
	}
	return out
}

// expandBraces turns a{b,c}d into abd and acd, after dropping a trailing label
// selector.
func expandBraces(s string) []string {
	s = labelSuffix.ReplaceAllString(s, "")
	i, j := strings.IndexByte(s, '{'), strings.IndexByte(s, '}')
	if i < 0 || j < i {
		return []string{s}
	}
	var out []string
	for _, alt := range strings.Split(s[i+1:j], ",") {
		out = append(out, expandBraces(s[:i]+alt+s[j+1:])...)
	}
	return out
}

// The metric names and labels docs/router.md promises are the ones the router
// registers, and every kvindex_router_* metric it registers is documented: the
// names are public API (dashboards and alerts use them).
func TestDocumentedMetricsAreRegistered(t *testing.T) {
	doc, err := os.ReadFile("../../docs/router.md")
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Workers = []workerspec.Spec{{ID: "w0", Model: testModel, HTTP: "http://127.0.0.1:1"}}
	cfg.Indexer = []string{"127.0.0.1:1"} // the ledger's metrics exist only with an indexer
	r, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.close()
	got := registeredMetrics(t, r.reg)

	documented := map[string]bool{}
	for _, m := range docMetric.FindAllStringSubmatch(string(doc), -1) {
		for _, name := range expandBraces(m[1]) {
			documented[name] = true
			if _, ok := got[name]; !ok {
				t.Errorf("docs/router.md names %s; the router does not register it", name)
			}
		}
	}
	for name := range got {
		if strings.HasPrefix(name, "kvindex_router_") && !documented[name] {
			t.Errorf("the router registers %s; docs/router.md does not document it", name)
		}
	}

	// The metrics table's label column is what the series carry.
	rows := 0
	for _, line := range strings.Split(string(doc), "\n") {
		cells := strings.Split(line, "|")
		if len(cells) != 5 || !strings.HasPrefix(strings.TrimSpace(cells[1]), "`kvindex_") {
			continue
		}
		rows++
		var want []string
		for _, l := range strings.Split(cells[2], ",") {
			if l = strings.TrimSpace(l); l != "" {
				want = append(want, l)
			}
		}
		slices.Sort(want)
		for _, m := range docMetric.FindAllStringSubmatch(cells[1], -1) {
			for _, name := range expandBraces(m[1]) {
				if labels, ok := got[name]; ok && !slices.Equal(labels, want) {
					t.Errorf("%s has labels %v; docs/router.md's table says %v", name, labels, want)
				}
			}
		}
	}
	if rows < 15 {
		t.Fatalf("found %d rows of the metrics table in docs/router.md; has its layout changed?", rows)
	}
}

// Every routed request is explained and measured: with --log-level debug one
// RouteDecision line names the worker that served it and every candidate's
// cost terms, the overhead histogram counts it once, and /healthz answers.
func TestDecisionIsLoggedAndMeasured(t *testing.T) {
	f := startFleet(t, 2, nil)
	var logs logbuf.Buffer
	rt := startRouterWith(t, testConfig(t, f), func(r *Router) {
		r.log = slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})

	resp, err := http.Get(rt.url + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || strings.TrimSpace(string(body)) != "ok" {
		t.Fatalf("/healthz: %d %q", resp.StatusCode, body)
	}

	resp, _ = send(t, rt.url, "/v1/completions", completionBody(words("explain", 40), 2))
	served := resp.Header.Get(HeaderServedBy)
	if resp.StatusCode != http.StatusOK || served == "" {
		t.Fatalf("status %d, served by %q", resp.StatusCode, served)
	}

	var decisions []decisionJSON
	for _, line := range strings.Split(logs.String(), "\n") {
		var rec struct {
			Msg      string `json:"msg"`
			Decision string `json:"decision"`
		}
		if json.Unmarshal([]byte(line), &rec) != nil || rec.Msg != "RouteDecision" {
			continue
		}
		var d decisionJSON
		if err := json.Unmarshal([]byte(rec.Decision), &d); err != nil {
			t.Fatalf("RouteDecision %q: %v", rec.Decision, err)
		}
		decisions = append(decisions, d)
	}
	if len(decisions) != 1 {
		t.Fatalf("%d RouteDecision log lines for one request, want 1; log:\n%s", len(decisions), logs.String())
	}
	d := decisions[0]
	if d.Worker != served || d.Policy != PolicyKVAware || d.PromptBlocks == 0 || len(d.Candidates) != 2 {
		t.Fatalf("RouteDecision %+v; the request was served by %s", d, served)
	}
	for _, c := range d.Candidates {
		if c.Terms.PromptBlocks == 0 || c.Terms.ActiveDecodeBlocks == 0 || c.Cost <= 0 {
			t.Errorf("candidate %s: cost %v, terms %+v: the cost terms are missing", c.Worker, c.Cost, c.Terms)
		}
	}

	if got := histogramCount(t, rt.metrics.overhead); got != 1 {
		t.Errorf("kvindex_router_overhead_seconds counted %d requests, want 1", got)
	}
	rt.assertNoLoad(t, f.ids)
}

// histogramCount is a histogram's sample count.
func histogramCount(t *testing.T, h prometheus.Histogram) uint64 {
	t.Helper()
	ch := make(chan prometheus.Metric, 1)
	h.Collect(ch)
	var m dto.Metric
	if err := (<-ch).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetHistogram().GetSampleCount()
}
