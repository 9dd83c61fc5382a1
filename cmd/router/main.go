// Command router is the kvindex router: a KV-aware OpenAI-compatible proxy in
// front of vLLM/SGLang engines (see internal/router), with Kubernetes pod
// discovery (internal/kube) behind --kube-selector.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/kvindex/kvindex/internal/kube"
	"github.com/kvindex/kvindex/internal/router"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := router.Main(ctx, os.Args[1:], os.Stderr, router.WithKubeDiscovery(kubeSource)); err != nil {
		fmt.Fprintln(os.Stderr, "router:", err)
		os.Exit(1)
	}
}

// kubeSource watches the pods --kube-selector matches.
func kubeSource(c router.KubeConfig, log *slog.Logger) (router.WorkerSource, error) {
	d, err := kube.New(kube.Config{Selector: c.Selector, Namespace: c.Namespace, Kubeconfig: c.Kubeconfig,
		HTTPPort: c.HTTPPort, DefaultModel: c.DefaultModel, Resync: c.Resync}, log)
	if err != nil {
		return nil, err
	}
	return d.Run, nil
}
