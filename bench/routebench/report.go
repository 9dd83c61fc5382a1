package routebench

import (
	"encoding/csv"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"text/tabwriter"
	"time"
)

// outcome is what one request measured.
type outcome struct {
	arrival                    time.Duration
	workerID                   string
	promptTokens, outputTokens int
	cachedTokens               int
	ttft, e2e                  time.Duration
	failed                     bool
	decision                   time.Duration
	// decisionCPU is the CPU time the deciding thread spent on the decision
	// (offline only; -1 when unknown): unlike decision, it excludes the time the
	// thread was descheduled, so it shows the decision's cost on a busy machine.
	decisionCPU time.Duration
	// available and captured are, in blocks, the longest prefix any worker truly
	// cached at decision time and the chosen worker's (when truthKnown).
	available, captured int
	truthKnown          bool
}

// Row is one (trace, policy, rate) line of the report and of results.csv.
type Row struct {
	Trace, Policy             string
	Mode                      string
	Workers                   int
	Rate                      float64
	Requests, Failed          int
	HitRate, OracleHitRate    float64
	AvailableHit, CapturedHit float64
	TTFTP50, TTFTP95, TTFTP99 float64 // ms
	E2EP50, E2EP99            float64 // ms
	OutputTokS                float64
	Goodput                   float64 // requests/s meeting the TTFT SLO
	SLOAttainment             float64
	Imbalance                 float64 // max/mean busy time
	DecisionP50, DecisionP99  float64 // µs, wall clock
	// DecisionCPUP50 and DecisionCPUP99 are the decision's CPU time in µs (offline
	// only; NaN live).
	DecisionCPUP50, DecisionCPUP99 float64
	Makespan                       float64 // s
	WallSeconds                    float64
	// IndexerCPUMs is the indexer process's CPU time per request in ms over the
	// run (live only; NaN offline), which is also its CPU-seconds per second at
	// 1k requests/s: scoring, event ingestion and, with --routers and --ledger,
	// the shared ledger.
	IndexerCPUMs float64
	// TTFTs are every successful request's TTFT in ms, sorted (for the CDF plot).
	TTFTs []float64 `csv:"-"`
}

// quantile of sorted xs (nearest rank); NaN when empty.
func quantile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// summarize turns outcomes into a row. busy is per-worker busy time (nil when
// unknown: the imbalance is then computed from requests served per worker).
func summarize(trace, policy, mode string, workers, blockSize int, rate float64, outs []outcome, busy map[string]time.Duration, slo time.Duration) Row {
	row := Row{Trace: trace, Policy: policy, Mode: mode, Workers: workers, Rate: rate, Requests: len(outs), OracleHitRate: math.NaN(),
		IndexerCPUMs: math.NaN()}
	var ttft, e2e, dec, decCPU []float64
	var prompt, cached, outTok, avail, capt, truthPrompt int
	var first, last time.Duration = math.MaxInt64, 0
	good := 0
	for _, o := range outs {
		first = min(first, o.arrival)
		if o.failed {
			row.Failed++
			continue
		}
		last = max(last, o.arrival+o.e2e)
		prompt += o.promptTokens
		cached += o.cachedTokens
		outTok += o.outputTokens
		ms := float64(o.ttft) / float64(time.Millisecond)
		ttft = append(ttft, ms)
		e2e = append(e2e, float64(o.e2e)/float64(time.Millisecond))
		dec = append(dec, float64(o.decision)/float64(time.Microsecond))
		if o.decisionCPU >= 0 {
			decCPU = append(decCPU, float64(o.decisionCPU)/float64(time.Microsecond))
		}
		if o.ttft <= slo {
			good++
		}
		if o.truthKnown {
			avail += o.available
			capt += o.captured
			truthPrompt += o.promptTokens
		}
	}
	slices.Sort(ttft)
	slices.Sort(e2e)
	slices.Sort(dec)
	slices.Sort(decCPU)
	row.TTFTs = ttft
	if prompt > 0 {
		row.HitRate = float64(cached) / float64(prompt)
	}
	row.AvailableHit, row.CapturedHit = math.NaN(), math.NaN()
	if truthPrompt > 0 {
		row.AvailableHit = float64(avail*blockSize) / float64(truthPrompt)
		row.CapturedHit = float64(capt*blockSize) / float64(truthPrompt)
	}
	row.TTFTP50, row.TTFTP95, row.TTFTP99 = quantile(ttft, .5), quantile(ttft, .95), quantile(ttft, .99)
	row.E2EP50, row.E2EP99 = quantile(e2e, .5), quantile(e2e, .99)
	row.DecisionP50, row.DecisionP99 = quantile(dec, .5), quantile(dec, .99)
	row.DecisionCPUP50, row.DecisionCPUP99 = quantile(decCPU, .5), quantile(decCPU, .99)
	if span := (last - first).Seconds(); span > 0 {
		row.Makespan = span
		row.OutputTokS = float64(outTok) / span
		row.Goodput = float64(good) / span
	}
	if n := len(outs) - row.Failed; n > 0 {
		row.SLOAttainment = float64(good) / float64(n)
	}
	var maxB, sumB time.Duration // integers: the sum does not depend on the map's order
	for _, b := range busy {
		maxB = max(maxB, b)
		sumB += b
	}
	if sumB > 0 {
		row.Imbalance = maxB.Seconds() / (sumB.Seconds() / float64(workers))
	}
	return row
}

var csvHeader = []string{"trace", "policy", "mode", "workers", "rate", "requests", "failed", "hit_rate", "oracle_hit_rate",
	"available_hit", "captured_hit", "ttft_p50_ms", "ttft_p95_ms", "ttft_p99_ms", "e2e_p50_ms", "e2e_p99_ms",
	"output_tok_s", "goodput_rps", "slo_attainment", "imbalance", "decision_p50_us", "decision_p99_us", "makespan_s", "wall_s",
	"decision_cpu_p50_us", "decision_cpu_p99_us", "indexer_cpu_ms_per_req"}

func f(x float64) string {
	if math.IsNaN(x) {
		return ""
	}
	return strconv.FormatFloat(x, 'f', 4, 64)
}

func (r Row) record() []string {
	return []string{r.Trace, r.Policy, r.Mode, strconv.Itoa(r.Workers), f(r.Rate), strconv.Itoa(r.Requests), strconv.Itoa(r.Failed),
		f(r.HitRate), f(r.OracleHitRate), f(r.AvailableHit), f(r.CapturedHit), f(r.TTFTP50), f(r.TTFTP95), f(r.TTFTP99),
		f(r.E2EP50), f(r.E2EP99), f(r.OutputTokS), f(r.Goodput), f(r.SLOAttainment), f(r.Imbalance),
		f(r.DecisionP50), f(r.DecisionP99), f(r.Makespan), f(r.WallSeconds), f(r.DecisionCPUP50), f(r.DecisionCPUP99),
		f(r.IndexerCPUMs)}
}

// WriteCSV writes rows to dir/results.csv.
func WriteCSV(dir string, rows []Row) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	fh, err := os.Create(filepath.Join(dir, "results.csv"))
	if err != nil {
		return err
	}
	w := csv.NewWriter(fh)
	w.Write(csvHeader)
	for _, r := range rows {
		w.Write(r.record())
	}
	w.Flush()
	if err := w.Error(); err != nil {
		fh.Close()
		return err
	}
	return fh.Close()
}

// fillOracle sets every row's OracleHitRate from the oracle row of its trace and rate.
func fillOracle(rows []Row) {
	for i := range rows {
		for _, o := range rows {
			if o.Policy == PolicyOracle && o.Trace == rows[i].Trace && o.Rate == rows[i].Rate {
				rows[i].OracleHitRate = o.HitRate
			}
		}
	}
}

// PrintTable writes rows as an aligned table.
func PrintTable(w io.Writer, rows []Row) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "trace\tpolicy\trate\treq\tfail\thit%\toracle%\tavail%\tcapt%\tttft p50\tp95\tp99 ms\te2e p50 ms\tout tok/s\tgoodput\timbal\tdec p50\tp99 µs\tcpu p50\tp99 µs\tidx cpu ms/req\t")
	pct := func(x float64) string {
		if math.IsNaN(x) {
			return "-"
		}
		return strconv.FormatFloat(100*x, 'f', 1, 64)
	}
	num := func(x float64, prec int) string {
		if math.IsNaN(x) {
			return "-"
		}
		return strconv.FormatFloat(x, 'f', prec, 64)
	}
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", r.Trace, r.Policy, num(r.Rate, 0),
			r.Requests, r.Failed, pct(r.HitRate), pct(r.OracleHitRate), pct(r.AvailableHit), pct(r.CapturedHit),
			num(r.TTFTP50, 0), num(r.TTFTP95, 0), num(r.TTFTP99, 0), num(r.E2EP50, 0), num(r.OutputTokS, 0),
			num(r.Goodput, 2), num(r.Imbalance, 2), num(r.DecisionP50, 1), num(r.DecisionP99, 1),
			num(r.DecisionCPUP50, 1), num(r.DecisionCPUP99, 1), num(r.IndexerCPUMs, 3))
	}
	tw.Flush()
}
