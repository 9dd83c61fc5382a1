package fakeengine

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are one engine's Prometheus series, in its own registry. vllm:* names and
// their model_name/engine labels are vLLM's (engine is the data-parallel rank);
// fakeengine_* series describe the simulator itself.
type metrics struct {
	reg *prometheus.Registry

	running *prometheus.GaugeVec
	waiting *prometheus.GaugeVec
	kvUsage *prometheus.GaugeVec
	// cacheConfig is vLLM's vllm:cache_config_info: the cache configuration in
	// labels (block_size, num_gpu_blocks, engine), value 1.
	cacheConfig *prometheus.GaugeVec

	prefixQueries *prometheus.CounterVec
	prefixHits    *prometheus.CounterVec
	promptTokens  *prometheus.CounterVec
	genTokens     *prometheus.CounterVec
	success       *prometheus.CounterVec
	ttft          *prometheus.HistogramVec
	e2e           *prometheus.HistogramVec

	batches *prometheus.CounterVec
	replays *prometheus.CounterVec
	faults  *prometheus.CounterVec
}

func newMetrics() *metrics {
	vl := []string{"model_name", "engine"}
	latency := []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80}
	m := &metrics{
		reg: prometheus.NewRegistry(),
		running: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "vllm:num_requests_running",
			Help: "Number of requests in model execution batches."}, vl),
		waiting: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "vllm:num_requests_waiting",
			Help: "Number of requests waiting to be processed."}, vl),
		kvUsage: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "vllm:kv_cache_usage_perc",
			Help: "KV-cache usage. 1 means 100 percent usage."}, vl),
		cacheConfig: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "vllm:cache_config_info",
			Help: "Information of the LLMEngine CacheConfig"}, []string{"block_size", "num_gpu_blocks", "engine"}),
		prefixQueries: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vllm:prefix_cache_queries_total",
			Help: "Prefix cache queries, in terms of number of queried tokens."}, vl),
		prefixHits: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vllm:prefix_cache_hits_total",
			Help: "Prefix cache hits, in terms of number of cached tokens."}, vl),
		promptTokens: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vllm:prompt_tokens_total",
			Help: "Number of prefill tokens processed."}, vl),
		genTokens: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vllm:generation_tokens_total",
			Help: "Number of generation tokens processed."}, vl),
		success: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vllm:request_success_total",
			Help: "Count of successfully processed requests."}, append(vl, "finished_reason")),
		ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "vllm:time_to_first_token_seconds",
			Help: "Histogram of time to first token in seconds (simulated engine time).", Buckets: latency}, vl),
		e2e: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "vllm:e2e_request_latency_seconds",
			Help: "Histogram of end to end request latency in seconds (simulated engine time).", Buckets: latency}, vl),
		batches: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fakeengine_kv_event_batches_total",
			Help: "KV event batches by outcome: published, dropped (fault injection) or failed."}, []string{"engine", "outcome"}),
		replays: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fakeengine_kv_replay_requests_total",
			Help: "Replay requests by outcome: served or malformed."}, []string{"engine", "outcome"}),
		faults: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fakeengine_injected_faults_total",
			Help: "Injected faults by kind: fail_500, fail_429, hang, restart."}, []string{"kind"}),
	}
	m.reg.MustRegister(m.running, m.waiting, m.kvUsage, m.cacheConfig, m.prefixQueries, m.prefixHits, m.promptTokens,
		m.genTokens, m.success, m.ttft, m.e2e, m.batches, m.replays, m.faults)
	return m
}
