package server

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvindex/kvindex/internal/ingest"
	"github.com/kvindex/kvindex/internal/kube"
	"github.com/kvindex/kvindex/internal/retry"
	"github.com/kvindex/kvindex/internal/workerspec"
)

// Kubernetes discovery for the worker registry (--kube-selector). While a node
// leads, it watches the engine pods (internal/kube, the router's pod → worker
// mapping) and keeps the replicated registry equal to them: a ready pod is
// registered, with the KubeSourceLabel label that marks it as the pods' own;
// a marked worker whose pod is gone (deleted, terminating, finished, or no
// longer matching the selector) is unregistered at once, and its blocks leave
// every replica; one whose pod is still there but not ready stays registered
// for --kube-unready-grace, then goes too. The mark is in the registry, so the
// next leader, once its own watch has synced, removes what the last one left
// behind: it reconciles the whole registry with the pod list, never patches it.
//
// Unready is not gone: a readiness probe that fails for a few seconds (a busy
// engine, a slow health endpoint) must not cost the index the engine's whole
// cache, which the engine still holds. An engine that really restarted
// (container restart within the pod) is caught by ingest's restart detection,
// which drops its blocks when its sequence numbers start again.
//
// Workers of the node's configuration (--worker, --workers-file) and workers
// registered by hand win over pods with the same worker id (refused, counted,
// logged once); a worker only discovered on --zmq-bind or NATS is taken over by
// its pod's spec, keeping its blocks (the pod adds its replay and HTTP
// endpoints). New pods are registered while the registry holds fewer than
// --max-discovered-workers workers that the configuration does not declare,
// in worker id order; the others are refused (reason "limit") until room is
// made.

// KubeSourceLabel is the worker label (label.kvindex.io/source=kubernetes) that
// marks the registry entries Kubernetes discovery owns. It is reserved: a worker
// registered with it is unregistered by the leader when no pod backs it.
const KubeSourceLabel = "kvindex.io/source"

const kubeSourceValue = "kubernetes"

// kubeDiscoveryBackoff paces restarts of a watch that failed.
var kubeDiscoveryBackoff = retry.Backoff{Initial: time.Second, Max: 30 * time.Second}

// kubeSyncWarnAfter is how long a new leader's watch may go without its first
// pod list before the leader says so: client-go retries an unreachable API
// server or a missing RBAC grant quietly.
const kubeSyncWarnAfter = 30 * time.Second

// isKubeWorker reports whether a registry entry is Kubernetes discovery's.
func isKubeWorker(s workerspec.Spec) bool { return s.Labels[KubeSourceLabel] == kubeSourceValue }

// kubeSpec is a pod's worker spec as registered: marked as discovery's.
func kubeSpec(s workerspec.Spec) workerspec.Spec {
	s.Labels = maps.Clone(s.Labels)
	if s.Labels == nil {
		s.Labels = map[string]string{}
	}
	s.Labels[KubeSourceLabel] = kubeSourceValue
	return s
}

// sameEngine reports whether two specs of one worker id follow the same engine
// streams, so that the worker's blocks and cursors stay valid across the change
// (a label or role edited on the pod); otherwise (a new pod IP, other ports) the
// worker is registered anew and its blocks dropped.
func sameEngine(a, b workerspec.Spec) bool {
	return a.Model == b.Model && a.BlockSize == b.BlockSize && a.Ranks() == b.Ranks() && a.Endpoint == b.Endpoint &&
		a.Topic == b.Topic && a.Replay == b.Replay && a.HTTP == b.HTTP
}

type kubeOp int

const (
	kubeRegister kubeOp = iota
	kubeReplace
	kubeUnregister
)

// kubeAction is one registry write of a reconciliation.
type kubeAction struct {
	op      kubeOp
	spec    workerspec.Spec // register: the new spec; replace: the new spec; unregister: the spec removed
	current workerspec.Spec // replace: the spec expected in the registry
	why     string
}

// kubePlan is what a reconciliation does: writes, and the pods it refused
// (worker id -> reason: "conflict" or "limit").
type kubePlan struct {
	actions []kubeAction
	refused map[string]string
}

// kubeState is what a reconciliation reads: the registry, this node's ingest
// view of the same ids, the pods, and when each unready pod was first seen so.
type kubeState struct {
	registry     []workerspec.Spec
	configured   map[string]bool // ids of --worker / --workers-file workers
	discovered   map[string]bool // ids ingest only discovered (bind socket, NATS)
	fleet        kube.Fleet
	unreadySince map[string]time.Time
	now          time.Time
	grace        time.Duration
	limit        int // --max-discovered-workers
}

// planKube computes the registry writes that make the registry follow the pods.
// It is pure: the caller executes the actions.
func planKube(st kubeState) kubePlan {
	p := kubePlan{refused: map[string]string{}}
	ready := make(map[string]workerspec.Spec, len(st.fleet.Ready))
	for _, s := range st.fleet.Ready {
		ready[s.ID] = kubeSpec(s)
	}
	waiting := make(map[string]bool, len(st.fleet.NotReady))
	for _, id := range st.fleet.NotReady {
		waiting[id] = true
	}
	registered := make(map[string]workerspec.Spec, len(st.registry))
	unconfigured := 0 // registry entries the configuration does not declare, after this plan
	for _, cur := range st.registry {
		registered[cur.ID] = cur
		if !st.configured[cur.ID] {
			unconfigured++
		}
		if !isKubeWorker(cur) {
			continue
		}
		want, isReady := ready[cur.ID]
		switch {
		case isReady && cur.Equal(want):
		case isReady && sameEngine(cur, want):
			p.actions = append(p.actions, kubeAction{op: kubeReplace, spec: want, current: cur, why: "pod changed"})
		case isReady:
			p.actions = append(p.actions,
				kubeAction{op: kubeUnregister, spec: cur, why: "pod now serves another engine"},
				kubeAction{op: kubeRegister, spec: want, why: "pod now serves another engine"})
		case waiting[cur.ID] && st.now.Sub(st.unreadySince[cur.ID]) < st.grace:
		case waiting[cur.ID]:
			p.actions = append(p.actions, kubeAction{op: kubeUnregister, spec: cur, why: "pod not ready for --kube-unready-grace"})
			unconfigured--
		default:
			p.actions = append(p.actions, kubeAction{op: kubeUnregister, spec: cur, why: "pod gone"})
			unconfigured--
		}
	}
	for _, s := range st.fleet.Ready {
		want := ready[s.ID]
		cur, isRegistered := registered[s.ID]
		switch {
		case isRegistered && isKubeWorker(cur): // planned above
		case st.configured[s.ID]:
			p.refused[s.ID] = "conflict"
		case isRegistered && st.discovered[s.ID]:
			p.actions = append(p.actions, kubeAction{op: kubeReplace, spec: want, current: cur, why: "pod of a discovered worker"})
		case isRegistered:
			p.refused[s.ID] = "conflict"
		case unconfigured >= st.limit:
			p.refused[s.ID] = "limit"
		default:
			p.actions = append(p.actions, kubeAction{op: kubeRegister, spec: want, why: "pod ready"})
			unconfigured++
		}
	}
	return p
}

// kubeWorkers runs Kubernetes discovery on the leader and applies its plans.
type kubeWorkers struct {
	b       *raftBackend
	disc    *kube.Discovery
	grace   time.Duration
	limit   int
	log     *slog.Logger
	refused *prometheus.CounterVec
}

func newKubeWorkers(cfg Config, b *raftBackend, reg prometheus.Registerer, log *slog.Logger) (*kubeWorkers, error) {
	log = log.With("component", "kube")
	var disc *kube.Discovery
	var err error
	if cfg.KubeClient != nil {
		disc, err = kube.NewWithClient(cfg.Kube, cfg.KubeClient, log)
	} else {
		disc, err = kube.New(cfg.Kube, log)
	}
	if err != nil {
		return nil, invalid("--kube-selector: %v", err)
	}
	k := &kubeWorkers{
		b: b, disc: disc, grace: cfg.KubeUnreadyGrace, limit: cfg.Ingest.MaxDiscoveredWorkers, log: log,
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvindex_kube_refused_total",
			Help: "Ready pods the leader did not register, by reason: conflict (the worker id is another worker's), limit (--max-discovered-workers)."},
			[]string{"reason"}),
	}
	registered := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kvindex_kube_workers",
		Help: "Workers in this replica's registry that Kubernetes discovery registered."}, func() float64 {
		n := 0
		for _, s := range b.node.Workers() {
			if isKubeWorker(s) {
				n++
			}
		}
		return float64(n)
	})
	for _, c := range []prometheus.Collector{k.refused, registered} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return k, nil
}

// run watches the pods and reconciles the registry with them until ctx (the
// leadership) ends: after every change and every publishInterval (so that an
// unready pod's grace ends, a failed write is tried again and a worker
// unregistered by hand comes back). Nothing is written before the watch has
// synced once: an empty list then means no pod, not "not known yet".
func (k *kubeWorkers) run(ctx context.Context) {
	fleets := make(chan kube.Fleet, 1) // the latest observation; Watch is its only sender
	done := make(chan struct{})
	go func() {
		defer close(done)
		for attempt := 0; ctx.Err() == nil; attempt++ {
			err := k.disc.Watch(ctx, func(f kube.Fleet) {
				select {
				case <-fleets:
				default:
				}
				fleets <- f
				attempt = 0
			})
			if ctx.Err() != nil {
				return
			}
			k.log.Warn("kubernetes discovery failed; the registry keeps its workers, watching again", "err", err)
			if kubeDiscoveryBackoff.Wait(ctx, attempt) != nil {
				return
			}
		}
	}()
	defer func() { <-done }()
	t := time.NewTicker(publishInterval)
	defer t.Stop()
	syncWarn := time.NewTimer(kubeSyncWarnAfter)
	defer syncWarn.Stop()
	var fleet *kube.Fleet
	unreadySince := map[string]time.Time{}
	refused := map[string]string{}
	for {
		select {
		case <-ctx.Done():
			return
		case f := <-fleets:
			fleet = &f
		case <-t.C:
		case <-syncWarn.C:
			if fleet == nil {
				k.log.Warn("kubernetes discovery has not listed the pods yet: check the API server access (--kubeconfig or the in-cluster service account) and the RBAC grant (get, list, watch pods); the registry keeps its workers meanwhile",
					"after", kubeSyncWarnAfter)
			}
		}
		if fleet == nil {
			continue
		}
		now := time.Now()
		for id := range unreadySince {
			if !slices.Contains(fleet.NotReady, id) {
				delete(unreadySince, id)
			}
		}
		for _, id := range fleet.NotReady {
			if _, ok := unreadySince[id]; !ok {
				unreadySince[id] = now
			}
		}
		st := kubeState{registry: k.b.node.Workers(), configured: map[string]bool{}, discovered: map[string]bool{},
			fleet: *fleet, unreadySince: unreadySince, now: now, grace: k.grace, limit: k.limit}
		for _, ws := range k.b.ingest.Workers() {
			switch ws.Source {
			case ingest.SourceFlag, ingest.SourceFile:
				st.configured[ws.Spec.ID] = true
			case ingest.SourceDiscover:
				st.discovered[ws.Spec.ID] = true
			}
		}
		plan := planKube(st)
		for id, reason := range plan.refused {
			if refused[id] != reason {
				k.refused.WithLabelValues(reason).Inc()
				k.log.Warn("a ready pod is not registered", "worker", id, "reason", reason, "limit", k.limit)
			}
		}
		refused = plan.refused
		for _, a := range plan.actions {
			if err := k.apply(ctx, a); err != nil {
				if ctx.Err() == nil {
					k.log.Warn("kubernetes discovery: registry write failed; trying again", "worker", a.spec.ID, "why", a.why, "err", err)
				}
				break
			}
		}
	}
}

// apply executes one action on this node, the leader.
func (k *kubeWorkers) apply(ctx context.Context, a kubeAction) error {
	var err error
	switch a.op {
	case kubeRegister:
		_, err = k.b.node.RegisterWorker(ctx, a.spec)
	case kubeReplace:
		_, err = k.b.node.ReplaceWorker(ctx, a.current, a.spec)
	case kubeUnregister:
		_, err = k.b.node.UnregisterWorker(ctx, a.spec.ID)
	}
	if err != nil {
		return fromRaft(err)
	}
	k.log.Info("kubernetes discovery changed the registry", "worker", a.spec.ID, "op", [...]string{"register", "replace", "unregister"}[a.op],
		"why", a.why, "spec", a.spec.String())
	return nil
}

// errKubeWorker explains why a worker of Kubernetes discovery cannot be
// unregistered by hand.
var errKubeWorker = errors.New("the worker is registered by Kubernetes discovery (--kube-selector) from its pod: it is unregistered when the pod is deleted, stops matching the selector, or stays unready for --kube-unready-grace")
