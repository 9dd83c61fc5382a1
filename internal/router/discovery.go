package router

import (
	"context"
	"flag"
	"log/slog"
	"time"

	"github.com/kvindex/kvindex/internal/workerspec"
)

// Kubernetes discovery: the router's flags for it live here, the watching in
// internal/kube (client-go), which cmd/router hands to Main as a KubeDiscovery so
// that this package, and every test binary built from it, stays free of client-go.

// KubeConfig is the Kubernetes discovery part of the configuration; the fields
// mean what internal/kube.Config's do.
type KubeConfig struct {
	Selector     string
	Namespace    string
	Kubeconfig   string
	HTTPPort     int
	DefaultModel string
	Resync       time.Duration
}

// DefaultKubeConfig is off (no selector), port 8000, resync every 10 minutes.
func DefaultKubeConfig() KubeConfig {
	return KubeConfig{HTTPPort: 8000, Resync: 10 * time.Minute}
}

// Validate names the bad value (the selector's syntax is checked by the
// discovery itself when Main builds it).
func (c *KubeConfig) Validate() error {
	switch {
	case c.HTTPPort < 1 || c.HTTPPort > 65535:
		return invalid("--kube-http-port=%d must be a port (1-65535)", c.HTTPPort)
	case c.Resync <= 0:
		return invalid("--kube-resync=%s must be positive", c.Resync)
	}
	return nil
}

func registerKubeFlags(fs *flag.FlagSet, c *KubeConfig) {
	fs.StringVar(&c.Selector, "kube-selector", c.Selector, "Kubernetes discovery: label `selector` of the engine pods (e.g. app=vllm); ready pods become workers (docs/deploy.md lists the labels and annotations read); empty: off")
	fs.StringVar(&c.Namespace, "kube-namespace", c.Namespace, "Kubernetes discovery: namespace to watch; empty: the router's own namespace in a cluster, every namespace with --kubeconfig")
	fs.StringVar(&c.Kubeconfig, "kubeconfig", c.Kubeconfig, "Kubernetes discovery: kubeconfig `file`; empty: the in-cluster service account")
	fs.IntVar(&c.HTTPPort, "kube-http-port", c.HTTPPort, "Kubernetes discovery: engine HTTP port of pods without the kvindex.io/http-port annotation")
	fs.StringVar(&c.DefaultModel, "kube-default-model", c.DefaultModel, "Kubernetes discovery: model of pods without a kvindex.io/model or llm-d.ai/model label")
	fs.DurationVar(&c.Resync, "kube-resync", c.Resync, "Kubernetes discovery: the informer's full resync period")
}

// WorkerSource reports a whole worker list on every change until ctx ends.
type WorkerSource func(ctx context.Context, update func([]workerspec.Spec)) error

// KubeDiscovery builds the Kubernetes worker source from the configuration
// (internal/kube.Source).
type KubeDiscovery func(KubeConfig, *slog.Logger) (WorkerSource, error)

// Option adjusts Main.
type Option func(*mainOptions)

type mainOptions struct{ kube KubeDiscovery }

// WithKubeDiscovery enables --kube-selector.
func WithKubeDiscovery(k KubeDiscovery) Option { return func(o *mainOptions) { o.kube = k } }

// SetKubeSource makes src a source of workers (below the workers file and
// --worker on equal ids). Call before Run.
func (r *Router) SetKubeSource(src WorkerSource) { r.kubeSource = src }

// followKube runs the Kubernetes source, restarting it after an error, until
// ctx ends.
func (r *Router) followKube(ctx context.Context) {
	for ctx.Err() == nil {
		if err := r.kubeSource(ctx, r.fleet.setKube); err != nil && ctx.Err() == nil {
			r.log.Warn("kubernetes discovery failed; keeping the last worker list and retrying", "err", err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(r.cfg.WorkersRefresh):
		}
	}
}
