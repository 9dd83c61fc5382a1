package router

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/workerspec"
)

// A Kubernetes source feeds the fleet: its lists replace each other (a deleted
// pod's worker goes away), --worker wins on equal ids, and requests are routed to
// the discovered workers.
func TestKubeSourceFeedsTheFleet(t *testing.T) {
	f := startFleet(t, 2, nil)
	specs := f.specs(t)
	cfg := testConfig(t, f)
	cfg.Workers = nil
	lists := make(chan []workerspec.Spec)
	rt := startRouterWith(t, cfg, func(r *Router) {
		r.SetKubeSource(func(ctx context.Context, update func([]workerspec.Spec)) error {
			for {
				select {
				case <-ctx.Done():
					return nil
				case l := <-lists:
					update(l)
				}
			}
		})
	})
	r, url := rt.Router, rt.url
	ids := func() string {
		var out []string
		for _, w := range r.fleet.Workers() {
			out = append(out, w.ID)
		}
		return strings.Join(out, ",")
	}

	resp, err := http.Get(url + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("readyz before discovery: %d, want 503", resp.StatusCode)
	}
	for _, step := range []struct {
		list []workerspec.Spec
		want string
	}{
		{specs, "w0,w1"},
		{specs[1:], "w1"}, // w0's pod deleted
		{nil, ""},
		{specs[:1], "w0"},
	} {
		lists <- step.list
		waitFor(t, 10*time.Second, "the fleet to be "+step.want, func() bool { return ids() == step.want })
	}
	if code, _, raw := post(t, url, "/v1/completions", completionBody("kube", 2)); code != http.StatusOK {
		t.Fatalf("routing to a discovered worker: %d %s", code, raw)
	}
	if got := rt.servedCount("w0"); got != 1 {
		t.Errorf("w0 served %d requests, want 1", got)
	}
}

// --kube-selector without a discovery (a binary built without internal/kube)
// is refused, naming the flag.
func TestKubeSelectorNeedsDiscovery(t *testing.T) {
	err := Main(context.Background(), []string{"--kube-selector", "app=vllm", "--listen", "127.0.0.1:0"}, &strings.Builder{})
	if err == nil || !strings.Contains(err.Error(), "--kube-selector") {
		t.Fatalf("Main = %v, want an error naming --kube-selector", err)
	}
}
