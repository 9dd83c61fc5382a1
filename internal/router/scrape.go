package router

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// maxMetricsBody bounds what the router reads of an engine's /metrics.
const maxMetricsBody = 8 << 20

// engineScraper reads vLLM's load gauges from every worker's /metrics
// (--scrape-engine-metrics). Engines label their series per dp rank with
// engine="<rank>"; a series without it counts for rank 0. Safe for concurrent use.
type engineScraper struct {
	mu    sync.Mutex
	loads map[Target]EngineLoad // guarded by mu
}

func (s *engineScraper) get(t Target) EngineLoad {
	if s == nil {
		return EngineLoad{}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.loads[t]
}

// engineLoad is the scraped load of t (zero when scraping is off).
func (r *Router) engineLoad(t Target) EngineLoad { return r.scraper.get(t) }

// scrapeOnce reads one worker's /metrics into per-rank loads.
func scrapeOnce(ctx context.Context, hc *http.Client, w *Worker) (map[uint32]EngineLoad, error) {
	var families map[string]*dto.MetricFamily
	err := getFromWorker(ctx, hc, w, "/metrics", time.Second, maxMetricsBody, func(r io.Reader) (err error) {
		parser := expfmt.NewTextParser(model.UTF8Validation)
		families, err = parser.TextToMetricFamilies(r)
		return err
	})
	if err != nil {
		return nil, err
	}
	return engineLoads(families, w.Ranks), nil
}

// engineLoads reads the per-rank loads of a worker with ranks dp ranks out of
// its parsed /metrics.
func engineLoads(families map[string]*dto.MetricFamily, ranks uint32) map[uint32]EngineLoad {
	out := map[uint32]EngineLoad{}
	for name, set := range map[string]func(*EngineLoad, float64){
		"vllm:num_requests_waiting": func(l *EngineLoad, v float64) { l.Waiting += int(v) },
		"vllm:num_requests_running": func(l *EngineLoad, v float64) { l.Running += int(v) },
		"vllm:kv_cache_usage_perc":  func(l *EngineLoad, v float64) { l.KVUsage = max(l.KVUsage, v) },
	} {
		for _, m := range families[name].GetMetric() {
			if rank, _ := seriesRank(m); rank < ranks {
				l := out[rank]
				set(&l, gaugeValue(m))
				out[rank] = l
			}
		}
	}
	// vLLM's cache_config_info carries the configuration in labels (its value is
	// 1); without an engine label it holds for every rank.
	for _, m := range families["vllm:cache_config_info"].GetMetric() {
		blocks := 0
		for _, lp := range m.GetLabel() {
			if lp.GetName() == "num_gpu_blocks" {
				blocks, _ = strconv.Atoi(lp.GetValue())
			}
		}
		if blocks <= 0 {
			continue
		}
		rank, ranked := seriesRank(m)
		for r := range ranks {
			if l, ok := out[r]; ok && (r == rank || !ranked) {
				l.GPUBlocks = blocks
				out[r] = l
			}
		}
	}
	return out
}

// gaugeValue is a gauge's value; a series exposed without a # TYPE line parses
// as untyped, and its value counts the same.
func gaugeValue(m *dto.Metric) float64 {
	if m.Untyped != nil {
		return m.GetUntyped().GetValue()
	}
	return m.GetGauge().GetValue()
}

// seriesRank is the dp rank a series is labelled with (engine="<rank>"), and
// whether it has one; a series without it counts for rank 0.
func seriesRank(m *dto.Metric) (uint32, bool) {
	for _, lp := range m.GetLabel() {
		if lp.GetName() == "engine" {
			rank, err := strconv.ParseUint(lp.GetValue(), 10, 32)
			return uint32(rank), err == nil
		}
	}
	return 0, false
}

// run scrapes every worker each interval until ctx ends. A worker that does not
// answer keeps no engine load (the router's own count then rules).
func (s *engineScraper) run(ctx context.Context, hc *http.Client, fleet *Fleet, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		next := map[Target]EngineLoad{}
		for _, w := range fleet.Workers() {
			ranks, err := scrapeOnce(ctx, hc, w)
			if err != nil {
				continue
			}
			for r, l := range ranks {
				next[Target{Worker: w.ID, Rank: r}] = l
			}
		}
		s.mu.Lock()
		s.loads = next
		s.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
