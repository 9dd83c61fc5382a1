package server

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvindex/kvindex/internal/raftstore"
	"github.com/kvindex/kvindex/internal/workerspec"
)

// Worker health. An engine that is killed sends no last event: without a probe
// its blocks would stay in the index, and score, until it publishes again, which
// may be never. So the leader probes the health endpoint of every registered
// worker that has an HTTP URL (GET <http>/health, as vLLM and SGLang serve it;
// any 2xx is healthy), and once a worker's probes have failed, without a success
// in between, for --worker-dead-after, proposes EntryWorkerDead: every replica
// drops its blocks, fences its streams (no batch in flight brings them back) and
// leaves it out of scoring (registryview.go); /workers reports it dead. When its
// probe succeeds again the leader proposes EntryWorkerAlive; when it publishes
// again, its stream starts afresh (internal/raftstore/dead.go). A worker without
// an HTTP URL is never probed, so never declared dead.
//
// Concurrency: healthProber.run runs on one goroutine per leadership (the
// leader session's; followers never probe); each round probes at most
// healthProbeConcurrency workers at once, each probe bounded by the probe
// timeout. Its state (when each failing streak began) lives in that goroutine
// and starts empty on each new leader: a leader change can put a death off by
// up to --worker-dead-after, never bring one forward.

const (
	// healthProbeConcurrency bounds the probes in flight at once, so a large
	// fleet of hung engines costs bounded sockets and goroutines.
	healthProbeConcurrency = 32
	// maxHealthProbeTimeout bounds one probe (vLLM answers /health at once
	// unless its engine is dead: a slow answer is a failed probe). It does not
	// shrink with --worker-health-interval: an engine slowed down by a busy
	// host must not look dead; a round takes as long as its slowest probe.
	maxHealthProbeTimeout = 2 * time.Second
	// healthBodyLimit is what is read of a health answer, so that the
	// connection can be reused.
	healthBodyLimit = 4 << 10
)

// Defaults of --worker-dead-after and --worker-health-interval. Thirty seconds is
// what Kubernetes takes by default to pull a failing pod out of a Service
// (readiness probe every 10 s, 3 failures), so a router in front of the same
// engines stops sending there at about the same time the index stops scoring
// it; it rides out a restarting sidecar, a brief network partition or a long
// GC pause without throwing away a warm cache, and is still far shorter than a
// vLLM restart (minutes to load weights), so a killed engine's blocks do not
// score for long. Probing every 5 s gives at least six failed probes before a
// death.
const (
	DefaultWorkerDeadAfter      = 30 * time.Second
	DefaultWorkerHealthInterval = 5 * time.Second
)

// healthProber is the leader's worker health check (see above).
type healthProber struct {
	node      *raftstore.Node
	client    *http.Client
	interval  time.Duration
	deadAfter time.Duration
	log       *slog.Logger
	probes    *prometheus.CounterVec // result: ok, failed
}

// newHealthProber returns a prober, or nil when deadAfter is 0 (disabled). The
// metrics go to reg.
func newHealthProber(node *raftstore.Node, deadAfter, interval time.Duration, log *slog.Logger, reg prometheus.Registerer) (*healthProber, error) {
	if deadAfter <= 0 {
		return nil, nil
	}
	p := &healthProber{
		node: node, interval: interval, deadAfter: deadAfter, log: log,
		client: &http.Client{
			Timeout: maxHealthProbeTimeout,
			// Engines are dialled directly (no HTTP_PROXY), as the router does.
			Transport: &http.Transport{MaxIdleConnsPerHost: 1, IdleConnTimeout: 2 * interval},
			// A health endpoint that redirects is not one.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
		probes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvindex_worker_health_probes_total",
			Help: "Health probes of workers' HTTP endpoints (GET <http>/health) by the leader, by result (ok, failed)."}, []string{"result"}),
	}
	if err := reg.Register(p.probes); err != nil {
		return nil, fmt.Errorf("registering health metrics: %w", err)
	}
	return p, nil
}

// run probes every interval until ctx (the leadership) ends.
func (p *healthProber) run(ctx context.Context) {
	defer p.client.CloseIdleConnections()
	st := &probeState{failing: map[string]time.Time{}, badURL: map[string]string{}}
	t := time.NewTicker(p.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		p.round(ctx, st)
	}
}

// probeState is what a prober remembers between rounds of one leadership.
type probeState struct {
	failing map[string]time.Time // worker id -> first failed probe of its current streak
	badURL  map[string]string    // worker id -> the unusable http URL last logged
}

// round probes every worker with an HTTP URL once and acts on the answers.
func (p *healthProber) round(ctx context.Context, st *probeState) {
	failing := st.failing
	var specs []workerspec.Spec
	registered := map[string]bool{}
	for _, w := range p.node.Workers() {
		registered[w.ID] = true
		switch u, err := url.Parse(w.HTTP); {
		case w.HTTP == "":
		case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "":
			// Not a URL we can probe: never declared dead for it.
			if st.badURL[w.ID] != w.HTTP {
				st.badURL[w.ID] = w.HTTP
				p.log.Warn("not probing the health of a worker whose http is not an http(s)://host URL: it is never declared dead", "worker", w.ID, "http", w.HTTP)
			}
		default:
			specs = append(specs, w)
		}
	}
	start := time.Now()
	healthy := make([]bool, len(specs))
	sem := make(chan struct{}, healthProbeConcurrency)
	var wg sync.WaitGroup
	for i, w := range specs {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			healthy[i] = p.probe(ctx, w.HTTP)
		}()
	}
	wg.Wait()
	if ctx.Err() != nil {
		return // the leadership ended mid-round: these answers prove nothing
	}
	dead := p.node.DeadWorkers()
	probed := make(map[string]bool, len(specs))
	for i, w := range specs {
		probed[w.ID] = true
		_, isDead := dead[w.ID]
		if healthy[i] {
			p.probes.WithLabelValues("ok").Inc()
			delete(failing, w.ID)
			if isDead {
				if index, ok := p.propose(ctx, w.ID, p.node.MarkWorkerAlive); ok {
					p.log.Info("dead worker answers its health endpoint again: it is scored again, and its stream starts afresh",
						"worker", w.ID, "log_index", index)
				}
			}
			continue
		}
		p.probes.WithLabelValues("failed").Inc()
		first, streak := failing[w.ID]
		if !streak {
			first = start
			failing[w.ID] = first
		}
		if failedFor := start.Sub(first); !isDead && failedFor >= p.deadAfter {
			if index, ok := p.propose(ctx, w.ID, p.node.MarkWorkerDead); ok {
				p.log.Warn("worker declared dead: its health endpoint failed; its blocks are dropped on every replica and it is not scored until it answers or publishes again",
					"worker", w.ID, "health", strings.TrimRight(w.HTTP, "/")+"/health", "failing_for", failedFor.Round(time.Millisecond), "log_index", index)
				// A worker that comes back by publishing while its health
				// endpoint still fails is given deadAfter again.
				delete(failing, w.ID)
			}
		}
	}
	for id := range failing {
		if !probed[id] {
			delete(failing, id) // unregistered, or its HTTP URL was removed
		}
	}
	for id := range st.badURL {
		if !registered[id] {
			delete(st.badURL, id)
		}
	}
}

// probe reports whether GET <base>/health answers 2xx within the timeout.
func (p *healthProber) probe(ctx context.Context, base string) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(base, "/")+"/health", nil)
	if err != nil {
		return false
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return false
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, healthBodyLimit))
	resp.Body.Close()
	return resp.StatusCode >= 200 && resp.StatusCode < 300
}

// propose writes a worker's new health through the log (MarkWorkerDead or
// MarkWorkerAlive) and returns the entry's log index; a failure is logged.
func (p *healthProber) propose(ctx context.Context, id string, write func(context.Context, string) (uint64, error)) (uint64, bool) {
	index, err := write(ctx, id)
	if err != nil {
		if ctx.Err() == nil {
			p.log.Warn("proposing a worker's health", "worker", id, "err", err)
		}
		return 0, false
	}
	return index, true
}

// deadCollector exports kvindex_worker_dead{worker}: 1 for each worker this
// replica holds dead (only those are listed).
type deadCollector struct{ node *raftstore.Node }

var workerDeadDesc = prometheus.NewDesc("kvindex_worker_dead",
	"1 for each registered worker declared dead (its health endpoint failed for --worker-dead-after; its blocks dropped, not scored). Only dead workers are listed.",
	[]string{"worker"}, nil)

func (c deadCollector) Describe(ch chan<- *prometheus.Desc) { ch <- workerDeadDesc }

func (c deadCollector) Collect(ch chan<- prometheus.Metric) {
	for id := range c.node.DeadWorkers() {
		ch <- prometheus.MustNewConstMetric(workerDeadDesc, prometheus.GaugeValue, 1, id)
	}
}
