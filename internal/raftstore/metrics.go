package raftstore

import (
	"errors"
	"fmt"
	"time"

	gometrics "github.com/hashicorp/go-metrics/compat"
	gmprometheus "github.com/hashicorp/go-metrics/compat/prometheus"
	"github.com/hashicorp/raft"
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
	refusedEntries       prometheus.Counter

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
		batchesFenced:        c("fenced_batches_total", "Committed stream batches dropped because their stream is fenced (its worker was declared dead, or unregistered since they were submitted) and they do not start a fresh stream."),
		opErrors:             c("apply_op_errors_total", "Ops of applied stream batches that the index refused."),
		ignoredEntries:       c("ignored_entries_total", "Log entries of an unknown type marked ignorable, skipped."),
		refusedEntries:       c("refused_entries_total", "Committed log entries applied as no-ops because a value breaks the log format's limits (an empty or over-long id, an over-long address: written by a version that did not check them)."),
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
		m.batchesFenced, m.opErrors, m.workerDeaths, m.ignoredEntries, m.refusedEntries, m.leaderSessions,
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

// stateCollector reports a node's raft state (leadership, term, log indexes,
// contact with the leader, membership) computed when /metrics is scraped, so
// the values are those of the scrape, with no refresh period and no goroutine.
// Each read is an atomic load or a short read lock in hashicorp/raft
// (GetConfiguration reads the latest configuration without going through
// raft's main loop), so a scrape never waits for raft; Stats() is not used
// because it does go through the main loop.
type stateCollector struct {
	n                                                         *Node
	isLeader, term, applied, commit, lastContact, membersDesc *prometheus.Desc
}

func newStateCollector(n *Node) *stateCollector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName("kvindex", "raft", name), help+" As of the scrape.", labels, nil)
	}
	return &stateCollector{
		n:        n,
		isLeader: d("is_leader", "1 when this member is the raft leader, else 0; summed over the members it should be 1."),
		term:     d("term", "The raft term this member is in; its growth counts elections."),
		applied:  d("applied_index", "The raft log index of the last entry this member's index has applied (what its reads see)."),
		commit:   d("commit_index", "The raft log index this member knows to be committed."),
		lastContact: d("last_contact_seconds", "Seconds since this member last heard from the leader: 0 on the leader; "+
			"since the node started when it never has."),
		membersDesc: d("members", "Servers in the raft configuration as this member knows it, by suffrage (voter, nonvoter).", "suffrage"),
	}
}

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.isLeader, c.term, c.applied, c.commit, c.lastContact, c.membersDesc} {
		ch <- d
	}
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	r := c.n.raft
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	leader, contact := 0.0, 0.0
	if r.State() == raft.Leader {
		leader = 1
	} else {
		last := r.LastContact()
		if last.IsZero() {
			last = c.n.started
		}
		contact = time.Since(last).Seconds()
	}
	gauge(c.isLeader, leader)
	gauge(c.lastContact, contact)
	gauge(c.term, float64(r.CurrentTerm()))
	gauge(c.applied, float64(c.n.AppliedIndex()))
	gauge(c.commit, float64(r.CommitIndex()))
	// staging is deprecated in hashicorp/raft: its series appears only if one shows up.
	count := map[string]int{SuffrageVoter: 0, SuffrageNonvoter: 0}
	if f := r.GetConfiguration(); f.Error() == nil {
		for _, s := range f.Configuration().Servers {
			count[suffrageName(s.Suffrage)]++
		}
	}
	for s, k := range count {
		gauge(c.membersDesc, float64(k), s)
	}
}
