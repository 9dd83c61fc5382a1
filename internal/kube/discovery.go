// Package kube discovers inference engine pods on Kubernetes and turns each ready
// pod into a worker spec (internal/workerspec), for the router's fleet and the
// indexer's worker registry (internal/server/kubeworkers.go).
//
// A Discovery watches the pods matching a label selector in one namespace (or
// all) with a client-go shared informer. After every add, update or delete it
// recomputes the list of ready pods and hands it, whole and sorted by worker id,
// to the update callback, so a consumer replaces its list and never patches it.
// Run reports the ready pods only (the router's view); Watch reports a Fleet,
// which also names the pods that exist but are not ready, for a consumer that
// keeps a worker through a short unready spell (the indexer's registry).
//
// Concurrency: Run and Watch own the informer and call update from a single
// goroutine, never concurrently with itself; update must not block for long.
// Config is read only. Values passed to update are fresh; the consumer may keep
// them.
//
// The labels and annotations read (Kubernetes and llm-d spellings), documented in
// docs/deploy.md:
//
//	kvindex.io/model, llm-d.ai/model (label or annotation)   served model (else Config.DefaultModel)
//	kvindex.io/role, llm-d.ai/role                           prefill | decode | both (default both)
//	kvindex.io/worker-id (annotation)                        worker id (default: the pod name)
//	kvindex.io/http-port (annotation)                        engine HTTP port (default Config.HTTPPort)
//	kvindex.io/dp-size (annotation)                          data-parallel ranks (default 1)
//	kvindex.io/block-size (annotation)                       tokens per KV block (default: the consumer's)
//	kvindex.io/kv-events-port (annotation)                   ZMQ PUB port: endpoint tcp://<pod IP>:<port>
//	kvindex.io/kv-events-topic (annotation)                  ZMQ topic prefix
//	kvindex.io/kv-replay-port (annotation)                   ZMQ replay (ROUTER) port
//
// A pod counts while it is Running, its Ready condition is True, it has a pod IP
// and it is not being deleted.
package kube

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kvindex/kvindex/internal/workerspec"
)

// Label and annotation keys.
const (
	KeyModel        = "kvindex.io/model"
	KeyRole         = "kvindex.io/role"
	KeyWorkerID     = "kvindex.io/worker-id"
	KeyHTTPPort     = "kvindex.io/http-port"
	KeyDPSize       = "kvindex.io/dp-size"
	KeyBlockSize    = "kvindex.io/block-size"
	KeyEventsPort   = "kvindex.io/kv-events-port"
	KeyEventsTopic  = "kvindex.io/kv-events-topic"
	KeyReplayPort   = "kvindex.io/kv-replay-port"
	KeyLLMDRole     = "llm-d.ai/role"
	KeyLLMDModel    = "llm-d.ai/model"
	labelPrefixCopy = "kvindex.io/label."
)

// ErrInvalidConfig is wrapped by every configuration error.
var ErrInvalidConfig = errors.New("invalid Kubernetes discovery configuration")

// Config says which pods to watch and how to read them.
type Config struct {
	// Selector is a label selector (`app=vllm,tier in (a,b)`); empty: discovery off.
	Selector string
	// Namespace to watch; empty: the pod's own namespace when in a cluster
	// (from the service account), else every namespace.
	Namespace string
	// Kubeconfig is a kubeconfig file; empty: the in-cluster configuration.
	Kubeconfig string
	// HTTPPort is the engine HTTP port of pods without kvindex.io/http-port.
	HTTPPort int
	// DefaultModel is the model of pods that name none.
	DefaultModel string
	// Resync is the informer's full resync period.
	Resync time.Duration
}

// DefaultConfig: off, port 8000 (vLLM's), resync every 10 minutes.
func DefaultConfig() Config {
	return Config{HTTPPort: 8000, Resync: 10 * time.Minute}
}

// Validate names the bad value; flag is the flag prefix ("--kube-").
func (c *Config) Validate() error {
	if c.Selector != "" {
		if _, err := labels.Parse(c.Selector); err != nil {
			return fmt.Errorf("%w: --kube-selector=%q: %v", ErrInvalidConfig, c.Selector, err)
		}
	}
	if c.HTTPPort < 1 || c.HTTPPort > 65535 {
		return fmt.Errorf("%w: --kube-http-port=%d must be a port (1-65535)", ErrInvalidConfig, c.HTTPPort)
	}
	if c.Resync <= 0 {
		return fmt.Errorf("%w: --kube-resync=%s must be positive", ErrInvalidConfig, c.Resync)
	}
	return nil
}

// Discovery watches pods and reports the ready ones as worker specs.
type Discovery struct {
	cfg    Config
	client kubernetes.Interface
	log    *slog.Logger
}

// New builds a Discovery on a client made from cfg (kubeconfig or in-cluster).
func New(cfg Config, log *slog.Logger) (*Discovery, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	var rc *rest.Config
	var err error
	if cfg.Kubeconfig != "" {
		rc, err = clientcmd.BuildConfigFromFlags("", cfg.Kubeconfig)
	} else {
		rc, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("kubernetes client configuration: %w", err)
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	if cfg.Namespace == "" && cfg.Kubeconfig == "" {
		cfg.Namespace = inClusterNamespace()
	}
	return NewWithClient(cfg, cs, log)
}

// NewWithClient builds a Discovery on a given client (tests use the fake clientset).
func NewWithClient(cfg Config, client kubernetes.Interface, log *slog.Logger) (*Discovery, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Discovery{cfg: cfg, client: client, log: log}, nil
}

// Fleet is one observation of the watched pods.
type Fleet struct {
	// Ready are the ready pods as worker specs, sorted by id.
	Ready []workerspec.Spec
	// NotReady are the worker ids of the other pods that are still there:
	// pending, or running but not ready, and not being deleted. Sorted.
	NotReady []string
}

// Equal reports whether two observations are the same.
func (f Fleet) Equal(o Fleet) bool {
	return slices.Equal(f.NotReady, o.NotReady) && slices.EqualFunc(f.Ready, o.Ready, workerspec.Spec.Equal)
}

// Run watches until ctx ends, calling update with the full list of ready
// workers after the initial sync and after every change to it.
func (d *Discovery) Run(ctx context.Context, update func([]workerspec.Spec)) error {
	var last []workerspec.Spec
	first := true
	return d.Watch(ctx, func(f Fleet) {
		if first || !slices.EqualFunc(f.Ready, last, workerspec.Spec.Equal) {
			update(f.Ready)
			last, first = f.Ready, false
		}
	})
}

// Watch watches until ctx ends, calling update with the whole Fleet after the
// initial sync (never before: an empty first Fleet means no pod matches) and
// after every change to it.
func (d *Discovery) Watch(ctx context.Context, update func(Fleet)) error {
	factory := informers.NewSharedInformerFactoryWithOptions(d.client, d.cfg.Resync,
		informers.WithNamespace(d.cfg.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = d.cfg.Selector }))
	inf := factory.Core().V1().Pods()
	changed := make(chan struct{}, 1)
	poke := func(any) {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	if _, err := inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    poke,
		UpdateFunc: func(_, n any) { poke(n) },
		DeleteFunc: poke,
	}); err != nil {
		return err
	}
	lister := inf.Lister()
	// The list and watch requests carry the selector; the lister applies it
	// again, so that a pod a server's watch delivers regardless (client-go's
	// fake clientset filters lists, not watches) is not taken for an engine.
	sel, err := labels.Parse(d.cfg.Selector)
	if err != nil {
		return err
	}
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), inf.Informer().HasSynced) {
		return ctx.Err()
	}
	d.log.Info("kubernetes discovery synced", "selector", d.cfg.Selector, "namespace", d.cfg.Namespace)
	var last Fleet
	first := true
	for {
		pods, err := lister.List(sel)
		if err != nil {
			return err
		}
		f := Fleet{Ready: d.Specs(pods), NotReady: notReady(pods)}
		if first || !f.Equal(last) {
			update(f)
			d.log.Info("kubernetes workers", "ready", len(f.Ready), "not_ready", len(f.NotReady), "pods", len(pods))
			last, first = f, false
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		}
	}
}

// Specs converts the ready pods to worker specs, sorted by id; pods that do not
// yield a valid spec are logged and left out. When two pods map to one worker
// id (one name in two watched namespaces, one kvindex.io/worker-id in a
// Deployment's template) the older pod is the worker, whatever order the
// lister returns them in (a map's, new at every call): otherwise the worker
// would flip between two engines from one recomputation to the next, each
// flip dropping its blocks.
func (d *Discovery) Specs(pods []*corev1.Pod) []workerspec.Spec {
	pods = slices.Clone(pods)
	slices.SortFunc(pods, func(a, b *corev1.Pod) int {
		if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
			return c
		}
		return cmp.Or(strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.Name, b.Name))
	})
	var out []workerspec.Spec
	seen := map[string]bool{}
	for _, p := range pods {
		if !Ready(p) {
			continue
		}
		s, err := d.spec(p)
		if err == nil {
			err = s.Validate()
		}
		if err == nil && seen[s.ID] {
			err = fmt.Errorf("worker id %q used by another pod", s.ID)
		}
		if err != nil {
			d.log.Warn("pod skipped by discovery", "pod", p.Namespace+"/"+p.Name, "err", err)
			continue
		}
		seen[s.ID] = true
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b workerspec.Spec) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// notReady lists the worker ids of the pods that are neither ready nor gone:
// not being deleted and not finished (Succeeded or Failed: never ready again).
func notReady(pods []*corev1.Pod) []string {
	var out []string
	for _, p := range pods {
		if Ready(p) || p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		out = append(out, workerID(p))
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// Ready: running, Ready condition true, has an IP, not being deleted.
func Ready(p *corev1.Pod) bool {
	if p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodRunning || p.Status.PodIP == "" {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// lookup reads key from the pod's labels, then its annotations.
func lookup(p *corev1.Pod, keys ...string) string {
	for _, k := range keys {
		if v, ok := p.Labels[k]; ok && v != "" {
			return v
		}
		if v, ok := p.Annotations[k]; ok && v != "" {
			return v
		}
	}
	return ""
}

func port(p *corev1.Pod, key string) (int, error) {
	v := lookup(p, key)
	if v == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > 65535 {
		return 0, fmt.Errorf("%s=%q is not a port", key, v)
	}
	return n, nil
}

// workerID is the pod's kvindex.io/worker-id, else its name.
func workerID(p *corev1.Pod) string {
	if id := lookup(p, KeyWorkerID); id != "" {
		return id
	}
	return p.Name
}

func (d *Discovery) spec(p *corev1.Pod) (workerspec.Spec, error) {
	ip := p.Status.PodIP
	s := workerspec.Spec{ID: workerID(p), Model: lookup(p, KeyModel, KeyLLMDModel)}
	if s.Model == "" {
		s.Model = d.cfg.DefaultModel
	}
	if s.Model == "" {
		return s, fmt.Errorf("no model: set the %s label or annotation (or --kube-default-model)", KeyModel)
	}
	switch r := strings.ToLower(lookup(p, KeyRole, KeyLLMDRole)); r {
	case "prefill", "decode":
		s.Role = r
	case "", "both", "aggregated", "prefill-decode":
	default:
		return s, fmt.Errorf("role %q is not prefill, decode or both", r)
	}
	httpPort, err := port(p, KeyHTTPPort)
	if err != nil {
		return s, err
	}
	if httpPort == 0 {
		httpPort = d.cfg.HTTPPort
	}
	s.HTTP = "http://" + net.JoinHostPort(ip, strconv.Itoa(httpPort))
	for key, dst := range map[string]*int{KeyDPSize: &s.DPSize, KeyBlockSize: &s.BlockSize} {
		if v := lookup(p, key); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 {
				return s, fmt.Errorf("%s=%q is not a positive number", key, v)
			}
			*dst = n
		}
	}
	if ev, err := port(p, KeyEventsPort); err != nil {
		return s, err
	} else if ev != 0 {
		s.Endpoint = "tcp://" + net.JoinHostPort(ip, strconv.Itoa(ev))
		s.Topic = lookup(p, KeyEventsTopic)
	}
	if rp, err := port(p, KeyReplayPort); err != nil {
		return s, err
	} else if rp != 0 {
		s.Replay = "tcp://" + net.JoinHostPort(ip, strconv.Itoa(rp))
	}
	for k, v := range p.Annotations {
		if name, ok := strings.CutPrefix(k, labelPrefixCopy); ok {
			if s.Labels == nil {
				s.Labels = map[string]string{}
			}
			s.Labels[name] = v
		}
	}
	return s, nil
}

// inClusterNamespace is the namespace of the pod this runs in ("" outside a
// cluster: every namespace).
func inClusterNamespace() string {
	b, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}
