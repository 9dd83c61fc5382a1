package deploytest

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/bench/fakeengine/fakeenginetest"
	"github.com/kvindex/kvindex/internal/router"
	"github.com/kvindex/kvindex/internal/server"
	"github.com/kvindex/kvindex/internal/tokenize"
	"github.com/kvindex/kvindex/internal/workerspec"
	"sigs.k8s.io/yaml"
)

const model = "deploy/model"

// liveMetrics starts a fake engine, an indexer following it and a router in
// front of it, sends one request through the router, and returns the metric
// names both binaries expose (histograms and summaries with their _bucket,
// _sum and _count series).
func liveMetrics(t *testing.T) map[string]bool {
	t.Helper()
	ec := fakeenginetest.Config()
	ec.Model = model
	eng := fakeenginetest.Start(t, ec)
	spec := workerspec.Spec{ID: "e0", Model: model, BlockSize: ec.BlockSize, HTTP: eng.URL(),
		Endpoint: eng.EventEndpoints()[0], Replay: eng.ReplayEndpoints()[0]}

	icfg := server.DefaultConfig()
	icfg.NodeID, icfg.DataDir = "deploy-test", t.TempDir()
	icfg.HTTPAddr, icfg.GRPCAddr, icfg.Raft.RaftAddr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	icfg.Ingest.Workers = []workerspec.Spec{spec}
	icfg.Ingest.DefaultBlockSize = ec.BlockSize
	icfg.Tokenizers = tokenize.Specs{{Model: model, Dir: server.BuiltinTokenizer}}
	srv, err := server.New(icfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 2)
	go func() { done <- srv.Run(ctx) }()

	rcfg := router.DefaultConfig()
	rcfg.Listen = "127.0.0.1:0"
	rcfg.Indexer = []string{srv.GRPCAddr()}
	rcfg.Workers = []workerspec.Spec{spec}
	rcfg.BlockSize = ec.BlockSize
	rt, err := router.New(rcfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", rcfg.Listen)
	if err != nil {
		t.Fatal(err)
	}
	go func() { done <- rt.Run(ctx, l) }()
	t.Cleanup(func() {
		cancel()
		for range 2 {
			if err := <-done; err != nil {
				t.Errorf("stopping: %v", err)
			}
		}
	})
	waitOK(t, "http://"+srv.HTTPAddr()+"/readyz")
	routerURL := "http://" + l.Addr().String()
	waitOK(t, routerURL+"/readyz")
	body := fmt.Sprintf(`{"model":%q,"prompt":"metrics for the dashboard test, long enough for a few blocks","max_tokens":2}`, model)
	resp, err := http.Post(routerURL+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("request through the router: %s", resp.Status)
	}
	// The engine's events reach the indexer after the answer: wait for them, so
	// that the per-worker ingest series exist when the page is read.
	names := map[string]bool{}
	deadline := time.Now().Add(30 * time.Second)
	for !names["kvindex_ingest_events_total"] {
		if time.Now().After(deadline) {
			t.Fatal("the indexer applied no event of the request within 30s")
		}
		time.Sleep(20 * time.Millisecond)
		names = map[string]bool{}
		scrape(t, "http://"+srv.HTTPAddr()+"/metrics", names)
	}
	scrape(t, routerURL+"/metrics", names)
	return names
}

// faultOnly are labelled series that appear in /metrics only after their first
// fault (a retry, a 429, a reset, a bad frame, a dead worker); they are checked against the
// names the binaries' sources declare instead, which declared() reads.
var faultOnly = []string{"kvindex_router_retries_total", "kvindex_router_rejected_total", "kvindex_ingest_resets_total",
	"kvindex_ingest_decode_errors_total", "kvindex_worker_dead"}

// declared reports whether name is declared as a metric name in the sources of
// the packages that register the binaries' metrics.
func declared(t *testing.T, name string) bool {
	t.Helper()
	for _, dir := range []string{"internal/router", "internal/ingest", "internal/server", "internal/raftstore"} {
		files, err := filepath.Glob(filepath.Join("..", "..", dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(string(data), `"`+name+`"`) {
				return true
			}
		}
	}
	return false
}

func waitOK(t *testing.T, url string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not OK after 30s: %v", url, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// scrape adds the metric names of a /metrics page (the # TYPE lines, with the
// series suffixes of histograms and summaries) to names.
func scrape(t *testing.T, url string, names map[string]bool) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 4 && f[0] == "#" && f[1] == "TYPE" {
			names[f[2]] = true
			if f[3] == "histogram" || f[3] == "summary" {
				for _, s := range []string{"_bucket", "_sum", "_count"} {
					names[f[2]+s] = true
				}
			}
		}
	}
}

var metricName = regexp.MustCompile(`\b(kvindex|process|go)_[a-z0-9_]+\b`)

// dashboardExprs lists every query expression of the dashboard's panels.
func dashboardExprs(t *testing.T) map[string][]string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "grafana", "kvindex.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Type    string `json:"type"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for _, p := range d.Panels {
		if p.Type == "row" {
			continue
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q queries nothing", p.Title)
		}
		for _, tg := range p.Targets {
			out[p.Title] = append(out[p.Title], tg.Expr)
		}
	}
	return out
}

type ruleFile struct {
	Groups []struct {
		Name  string `json:"name"`
		Rules []struct {
			Alert string `json:"alert"`
			Expr  string `json:"expr"`
		} `json:"rules"`
	} `json:"groups"`
}

func readRules(t *testing.T) ruleFile {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "prometheus", "kvindex-alerts.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var f ruleFile
	if err := yaml.Unmarshal(data, &f); err != nil {
		t.Fatal(err)
	}
	return f
}

func alertExprs(t *testing.T) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, g := range readRules(t).Groups {
		for _, r := range g.Rules {
			out[r.Alert] = append(out[r.Alert], r.Expr)
		}
	}
	return out
}

// Every metric a dashboard panel or an alert queries exists in the binaries'
// /metrics; the dashboard covers the four areas.
func TestDashboardAndAlertMetricsExist(t *testing.T) {
	names := liveMetrics(t)
	for _, n := range faultOnly {
		if names[n] {
			continue // exposed already: checked live
		}
		if !declared(t, n) {
			t.Errorf("%s is neither exposed nor declared by the binaries", n)
		}
		names[n] = true
	}
	for what, exprs := range map[string]map[string][]string{"panel": dashboardExprs(t), "alert": alertExprs(t)} {
		if len(exprs) == 0 {
			t.Fatalf("no %s found", what)
		}
		for title, list := range exprs {
			for _, e := range list {
				used := metricName.FindAllString(e, -1)
				if len(used) == 0 {
					t.Errorf("%s %q: %q queries no kvindex metric", what, title, e)
				}
				for _, m := range used {
					if !names[m] {
						t.Errorf("%s %q queries %s, which neither binary exposes", what, title, m)
					}
				}
			}
		}
	}
	titles := slices.Collect(func(yield func(string) bool) {
		for k := range dashboardExprs(t) {
			if !yield(k) {
				return
			}
		}
	})
	all := strings.ToLower(strings.Join(titles, " | "))
	for _, want := range []string{"leader", "term", "applied", "events/s", "gaps", "replays", "resets", "blocks", "residencies",
		"requests", "decision source", "captured", "overhead p99", "breaker", "retries", "429", "queue"} {
		if !strings.Contains(all, want) {
			t.Errorf("no dashboard panel about %q (titles: %s)", want, all)
		}
	}
}

// The alert rules pass Prometheus' own rule checker (promtool check rules).
func TestAlertRulesParse(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool not found: scripts/deps.sh installs it (Debian package prometheus)")
	}
	rules := filepath.Join("..", "prometheus", "kvindex-alerts.yaml")
	out, err := exec.Command(promtool, "check", "rules", rules).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
	// The checker must be able to fail: a broken copy is refused.
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("groups:\n- name: x\n  rules:\n  - alert: Broken\n    expr: rate(kvindex_router_requests_total[5m]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(promtool, "check", "rules", bad).CombinedOutput(); err == nil {
		t.Fatalf("promtool accepted a broken rule:\n%s", out)
	}
	want := []string{"KvindexNoLeader", "KvindexMultipleLeaders", "KvindexReplicaLag", "KvindexFollowerNoContact",
		"KvindexElectionStorm", "KvindexIngestGaps", "KvindexIngestResets", "KvindexWorkerSilent",
		"KvindexBreakerOnReadyWorker", "KvindexLowCaptureRatio", "KvindexTokenParityFailing", "KvindexRouter429Rate"}
	got := alertExprs(t)
	for _, a := range want {
		if _, ok := got[a]; !ok {
			t.Errorf("alert %s missing", a)
		}
	}
}

// The raft cluster alerts fire when they should and not before, per
// promtool's unit tests (deploy/prometheus/kvindex-alerts_test.yaml), which
// cover every alert of the kvindex-cluster group.
func TestAlertRulesUnitTests(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool not found: scripts/deps.sh installs it (Debian package prometheus)")
	}
	tests := filepath.Join("..", "prometheus", "kvindex-alerts_test.yaml")
	if out, err := exec.Command(promtool, "test", "rules", tests).CombinedOutput(); err != nil {
		t.Fatalf("promtool test rules: %v\n%s", err, out)
	}
	data, err := os.ReadFile(tests)
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Tests []struct {
			AlertRuleTest []struct {
				AlertName string `json:"alertname"`
			} `json:"alert_rule_test"`
		} `json:"tests"`
	}
	if err := yaml.Unmarshal(data, &f); err != nil {
		t.Fatal(err)
	}
	tested := map[string]bool{}
	for _, tc := range f.Tests {
		for _, a := range tc.AlertRuleTest {
			tested[a.AlertName] = true
		}
	}
	for _, g := range readRules(t).Groups {
		if g.Name != "kvindex-cluster" {
			continue
		}
		for _, r := range g.Rules {
			if !tested[r.Alert] {
				t.Errorf("alert %s has no promtool unit test", r.Alert)
			}
		}
	}
}

// Every dashboard query is valid PromQL: promtool checks them as recording rules.
func TestDashboardQueriesParse(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool not found: scripts/deps.sh installs it (Debian package prometheus)")
	}
	type rule struct {
		Record string `json:"record"`
		Expr   string `json:"expr"`
	}
	var rules []rule
	for _, exprs := range dashboardExprs(t) {
		for _, e := range exprs {
			rules = append(rules, rule{Record: fmt.Sprintf("panel:%d", len(rules)), Expr: e})
		}
	}
	data, err := yaml.Marshal(map[string]any{"groups": []any{map[string]any{"name": "dashboard", "rules": rules}}})
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "dashboard.yaml")
	if err := os.WriteFile(file, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(promtool, "check", "rules", file).CombinedOutput(); err != nil {
		t.Fatalf("promtool check rules on the dashboard's queries: %v\n%s\n%s", err, out, data)
	}
}
