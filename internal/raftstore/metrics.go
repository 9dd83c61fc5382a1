package raftstore

import (
	"errors"
	"fmt"
	"time"

	gometrics "github.com/hashicorp/go-metrics/compat"
	gmprometheus "github.com/hashicorp/go-metrics/compat/prometheus"
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are this package's own Prometheus metrics, one set per Node. They are
// registered only when Config.Registerer is set (so that tests may run several
// nodes in one process).
type metrics struct {
	proposedEntries  prometheus.Counter
	proposedBatches  prometheus.Counter
	proposedEvents   prometheus.Counter
	proposedBytes    prometheus.Counter
	proposalFailures prometheus.Counter
	commitSeconds    prometheus.Histogram
	inflight         prometheus.Gauge

	batchesApplied       prometheus.Counter
	batchesDuplicate     prometheus.Counter
	batchesRemovedWorker prometheus.Counter
	batchesFenced        prometheus.Counter
	opErrors             prometheus.Counter
	workerDeaths         prometheus.Counter
	ignoredEntries       prometheus.Counter

	leaderSessions prometheus.Counter
}

func newMetrics() *metrics {
	c := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: "kvindex", Subsystem: "raft", Name: name, Help: help})
	}
	return &metrics{
		proposedEntries:  c("proposed_entries_total", "Log entries of stream batches this node proposed as leader."),
		proposedBatches:  c("proposed_batches_total", "Stream batches this node proposed as leader."),
		proposedEvents:   c("proposed_events_total", "Block events in the stream batches this node proposed as leader."),
		proposedBytes:    c("proposed_bytes_total", "Bytes of the log entries this node proposed as leader."),
		proposalFailures: c("proposal_failures_total", "Proposed entries whose commit failed (leadership lost, shutdown)."),
		commitSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "kvindex", Subsystem: "raft", Name: "commit_seconds",
			Help:    "Time from proposing an entry of stream batches to its being applied on the leader.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}),
		inflight: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "kvindex", Subsystem: "raft", Name: "inflight_entries",
			Help: "Proposed entries not yet committed.",
		}),
		batchesApplied:       c("applied_batches_total", "Stream batches applied to the index."),
		batchesDuplicate:     c("duplicate_batches_total", "Committed stream batches dropped because their stream had already applied them."),
		batchesRemovedWorker: c("removed_worker_batches_total", "Committed stream batches dropped because their worker was unregistered."),
		batchesFenced:        c("fenced_batches_total", "Committed stream batches dropped because their worker was declared dead and they do not start a fresh stream."),
		opErrors:             c("apply_op_errors_total", "Ops of applied stream batches that the index refused."),
		ignoredEntries:       c("ignored_entries_total", "Log entries of an unknown type marked ignorable, skipped."),
		leaderSessions:       c("leader_sessions_total", "Times this node started proposing as leader (after a barrier)."),
		// Named for what it counts, beside kvindex_worker_dead (server), not for raft.
		workerDeaths: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvindex_worker_deaths_total",
			Help: "Times a worker was declared dead (its health endpoint failed for --worker-dead-after) and its blocks dropped, as applied on this replica."}),
	}
}

func (m *metrics) register(reg prometheus.Registerer) error {
	var errs []error
	for _, c := range []prometheus.Collector{
		m.proposedEntries, m.proposedBatches, m.proposedEvents, m.proposedBytes, m.proposalFailures,
		m.commitSeconds, m.inflight, m.batchesApplied, m.batchesDuplicate, m.batchesRemovedWorker,
		m.batchesFenced, m.opErrors, m.workerDeaths, m.ignoredEntries, m.leaderSessions,
	} {
		errs = append(errs, reg.Register(c))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("raftstore: registering metrics: %w", err)
	}
	return nil
}

// ExportRaftMetrics sends the metrics hashicorp/raft and raft-boltdb emit (commit
// and apply times, replication, elections, bolt store timings; names prefixed
// "kvindex_raft_", "kvindex_raftboltdb_"...) to reg, through go-metrics' Prometheus
// sink. raft emits them through go-metrics' process-wide default, so this installs
// a process-wide sink: call it once, from main; with several nodes in one process
// their raft metrics are summed. Metrics not updated for expiry are dropped.
func ExportRaftMetrics(reg prometheus.Registerer, expiry time.Duration) error {
	sink, err := gmprometheus.NewPrometheusSinkFrom(gmprometheus.PrometheusOpts{Registerer: reg, Expiration: expiry})
	if err != nil {
		return fmt.Errorf("raftstore: raft metrics sink: %w", err)
	}
	cfg := gometrics.DefaultConfig("kvindex")
	cfg.EnableHostname = false
	cfg.EnableRuntimeMetrics = false // the Prometheus Go collector covers these
	if _, err := gometrics.NewGlobal(cfg, sink); err != nil {
		return fmt.Errorf("raftstore: raft metrics: %w", err)
	}
	return nil
}
