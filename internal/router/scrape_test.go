package router

import (
	"maps"
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// The label rules of the engine scrape: a series counts for the rank its
// engine label names (rank 0 without one; ranks the worker does not have are
// ignored), and vllm:cache_config_info's capacity holds for its own rank, or
// for every rank when it has no engine label. Series without a # TYPE line
// (untyped) count as gauges.
func TestEngineLoadsFollowTheEngineLabel(t *testing.T) {
	for _, tc := range []struct {
		name    string
		metrics string
		ranks   uint32
		want    map[uint32]EngineLoad
	}{
		{"per rank, capacity per rank", `
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0"} 2
vllm:num_requests_running{engine="1"} 3
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="1"} 1
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0"} 0.25
vllm:kv_cache_usage_perc{engine="1"} 0.5
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="1000"} 1
vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="2000"} 1
`, 2, map[uint32]EngineLoad{
			0: {Running: 2, KVUsage: 0.25, GPUBlocks: 1000},
			1: {Running: 3, Waiting: 1, KVUsage: 0.5, GPUBlocks: 2000},
		}},
		{"capacity without an engine label holds for every rank", `
vllm:kv_cache_usage_perc{engine="0"} 0.1
vllm:kv_cache_usage_perc{engine="1"} 0.2
vllm:cache_config_info{block_size="16",num_gpu_blocks="500"} 1
`, 2, map[uint32]EngineLoad{0: {KVUsage: 0.1, GPUBlocks: 500}, 1: {KVUsage: 0.2, GPUBlocks: 500}}},
		{"no engine label is rank 0; a rank the worker lacks is ignored", `
vllm:num_requests_running 4
vllm:num_requests_running{engine="7"} 9
`, 1, map[uint32]EngineLoad{0: {Running: 4}}},
		{"no capacity or a bad one: usage only", `
vllm:kv_cache_usage_perc 0.3
vllm:cache_config_info{num_gpu_blocks="many"} 1
`, 1, map[uint32]EngineLoad{0: {KVUsage: 0.3}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			parser := expfmt.NewTextParser(model.UTF8Validation)
			families, err := parser.TextToMetricFamilies(strings.NewReader(tc.metrics))
			if err != nil {
				t.Fatal(err)
			}
			if got := engineLoads(families, tc.ranks); !maps.Equal(got, tc.want) {
				t.Errorf("loads %+v, want %+v", got, tc.want)
			}
		})
	}
}
