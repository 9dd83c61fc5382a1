package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	kvindexv1 "github.com/kvindex/kvindex/api/proto/kvindex/v1"
	"github.com/kvindex/kvindex/internal/ledgerq"
)

// loadLedger is the shared load ledger of the routers (kvindex.v1.LoadService):
// soft state held in memory by the leader, never written to the raft log, since
// it changes with every request. Each router session reports its own load per
// worker rank (absolute values, so a repeated or lost report cannot drift the
// sums); the ledger keeps the per-target total over every live router and pushes
// each router the total minus its own, at most once per push interval and at
// least once a second. Decisions (predicted prefixes) and session bindings a
// router reports are queued for every other router, bounded per router. A
// report or push whose loads are more than a message carries goes as several
// messages (ledgerq.SplitReport, SplitPush), whose loads the receiver applies
// together (ledgerq.Parts).
//
// Guarantees, written down for routers (docs/router.md): a router sees the other
// routers' load as of at most one report interval + one push interval ago
// (plus the network); while leadership moves, the stream ends with a not-leader
// error and the router routes on its own load until the new leader has its full
// report back, one round trip after it reconnects; a router that vanishes keeps
// its load counted for the lease, then it is dropped.
//
// Concurrency: one mutex guards every router's state; each stream has a sender
// goroutine that takes it briefly per push. Nothing blocks on a slow router but
// its own stream.
type loadLedger struct {
	lease      time.Duration
	push       time.Duration
	maxRouters int
	now        func() time.Time
	log        *slog.Logger
	metrics    *ledgerMetrics

	mu      sync.Mutex
	routers map[string]*ledgerRouter    // guarded by mu
	total   map[ledgerTarget]ledgerLoad // guarded by mu; sum over routers
	// changed is closed and replaced whenever total or a queue changes, waking
	// the senders.
	changed chan struct{} // guarded by mu
}

type ledgerTarget struct {
	worker string
	rank   uint32
}

type ledgerLoad struct {
	inFlight              int64
	prefillTokens, blocks int64
}

func (l ledgerLoad) add(o ledgerLoad, sign int64) ledgerLoad {
	return ledgerLoad{l.inFlight + sign*o.inFlight, l.prefillTokens + sign*o.prefillTokens, l.blocks + sign*o.blocks}
}

// ledgerRouter is one router's state; guarded by loadLedger.mu.
type ledgerRouter struct {
	loads map[ledgerTarget]ledgerLoad
	// session is the live stream's token; 0 while disconnected.
	session    uint64
	leaseUntil time.Time
	// queue holds the other routers' decisions and bindings until the next
	// push, bounded, their TTLs cut by the wait (a router reconnecting within
	// its lease gets what is left of them).
	queue ledgerq.Queue
	// parts holds the loads of the live stream's report whose last message
	// has not come: until it does, the router's loads stay as they were.
	parts ledgerq.Parts
}

// Bounds of what one router can make the leader hold.
const (
	// maxLedgerTargetsPerReport bounds the targets of one report and those one
	// router holds: a router holding more could not report its whole state in
	// a full report, so partial reports may not add up to more either.
	maxLedgerTargetsPerReport = 1 << 16
	// The queues per router and the keys of one prediction are bounded by
	// kvindexv1.LedgerMaxQueued, LedgerMaxQueuedKeys (8 MiB: 4096 predictions of
	// a long prompt's keys would be gigabytes, held for a router whose stream is
	// slow or gone; ledgerq) and LedgerMaxPredictionKeys, which the routers keep to.
)

// ErrLedgerFull: more routers than --ledger-max-routers.
var errLedgerFull = fmt.Errorf("%w: too many routers on the load ledger", ErrTooMany)

type ledgerMetrics struct {
	routers prometheus.Gauge
	reports prometheus.Counter
	pushes  prometheus.Counter
	expired prometheus.Counter
}

func newLedgerMetrics(reg prometheus.Registerer) (*ledgerMetrics, error) {
	m := &ledgerMetrics{
		routers: prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvindex_ledger_routers",
			Help: "Routers whose load the ledger counts (live stream or unexpired lease); 0 on followers."}),
		reports: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvindex_ledger_reports_total",
			Help: "Load reports received from routers."}),
		pushes: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvindex_ledger_pushes_total",
			Help: "Fleet views pushed to routers."}),
		expired: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvindex_ledger_leases_expired_total",
			Help: "Routers dropped because their stream was gone for the lease, or ended on a node that no longer leads."}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.routers, m.reports, m.pushes, m.expired} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}

func newLoadLedger(lease, push time.Duration, maxRouters int, m *ledgerMetrics, log *slog.Logger) *loadLedger {
	return &loadLedger{lease: lease, push: push, maxRouters: maxRouters, now: time.Now, log: log, metrics: m,
		routers: map[string]*ledgerRouter{}, total: map[ledgerTarget]ledgerLoad{}, changed: make(chan struct{})}
}

func (l *loadLedger) wakeLocked() {
	close(l.changed)
	l.changed = make(chan struct{})
}

// setLoadLocked sets one router's load on t, keeping the total in step.
func (l *loadLedger) setLoadLocked(r *ledgerRouter, t ledgerTarget, v ledgerLoad) {
	old := r.loads[t]
	if old == v {
		return
	}
	sum := l.total[t].add(old, -1).add(v, 1)
	if sum == (ledgerLoad{}) {
		delete(l.total, t)
	} else {
		l.total[t] = sum
	}
	if v == (ledgerLoad{}) {
		delete(r.loads, t)
	} else {
		r.loads[t] = v
	}
}

// dropLocked removes a router and its load.
func (l *loadLedger) dropLocked(id string) {
	r := l.routers[id]
	for t := range r.loads {
		l.setLoadLocked(r, t, ledgerLoad{})
	}
	delete(l.routers, id)
	l.metrics.routers.Set(float64(len(l.routers)))
	l.wakeLocked()
}

// expireLocked drops routers whose lease ran out.
func (l *loadLedger) expireLocked(now time.Time) {
	for id, r := range l.routers {
		if r.session == 0 && !now.Before(r.leaseUntil) {
			l.log.Info("router lease expired; its load no longer counts", "router", id)
			l.dropLocked(id)
			l.metrics.expired.Inc()
		}
	}
}

// ledgerLeaderCheck is how often a stream, and the sweep, check that this node
// still leads.
const ledgerLeaderCheck = 250 * time.Millisecond

// run sweeps the ledger every ledgerLeaderCheck until ctx ends: streams call
// open and view, which expire leases too, but a leader whose routers are all
// gone, and a node that lost leadership (whose streams all end), has none.
func (l *loadLedger) run(ctx context.Context, leading func() bool) {
	t := time.NewTicker(ledgerLeaderCheck)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		l.sweep(leading())
	}
}

// sweep drops the routers whose lease ran out; on a node that does not lead,
// every router whose stream ended, lease or not, since only the leader counts
// load (a stream still open ends with a not-leader error within
// ledgerLeaderCheck, and the next sweep drops its router).
func (l *loadLedger) sweep(leading bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if leading {
		l.expireLocked(l.now())
		return
	}
	for id, r := range l.routers {
		if r.session == 0 {
			l.log.Info("this node does not lead; a router's load and queue are dropped", "router", id)
			l.dropLocked(id)
			l.metrics.expired.Inc()
		}
	}
}

// open starts a router session from its first (full) report.
func (l *loadLedger) open(first *kvindexv1.ReportRequest, session uint64) error {
	if first.RouterId == "" || !first.Full {
		return invalidArg("the first load report must name router_id and have full set")
	}
	if len(first.RouterId) > MaxNameBytes {
		return invalidArg("a router_id of %d bytes, more than %d", len(first.RouterId), MaxNameBytes)
	}
	// Checked before the router is created: a refused first report must not
	// leave a router behind (it would hold a --ledger-max-routers slot with no
	// stream to close it and so no lease to expire it).
	if err := validateReport(first); err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.expireLocked(l.now())
	r := l.routers[first.RouterId]
	if r == nil {
		if len(l.routers) >= l.maxRouters {
			return fmt.Errorf("%w (%d)", errLedgerFull, l.maxRouters)
		}
		r = &ledgerRouter{loads: map[ledgerTarget]ledgerLoad{}}
		l.routers[first.RouterId] = r
		l.metrics.routers.Set(float64(len(l.routers)))
	}
	r.session = session // a reconnect replaces the old stream
	r.parts.Reset()     // and a report the old one left unfinished
	return l.receiveLocked(first.RouterId, r, first)
}

// report takes a message of a router's report; it fails when the session was
// replaced.
func (l *loadLedger) report(id string, session uint64, rep *kvindexv1.ReportRequest) error {
	if err := validateReport(rep); err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.routers[id]
	if r == nil || r.session != session {
		return errReplaced(id)
	}
	return l.receiveLocked(id, r, rep)
}

// receiveLocked takes one validated message of a report: its loads once the
// report's last message has come (all of its messages' together, checked
// first: a refused report applies none), its decisions and bindings at once.
func (l *loadLedger) receiveLocked(id string, r *ledgerRouter, rep *kvindexv1.ReportRequest) error {
	if n := r.parts.Len() + len(rep.Loads); n > maxLedgerTargetsPerReport {
		return invalidArg("a load report lists %d targets over its messages, more than %d", n, maxLedgerTargetsPerReport)
	}
	loads, full, done, err := r.parts.Add(rep.Full, rep.More, rep.Loads)
	if err != nil {
		return invalidArg("router %q: %v", id, err)
	}
	if done && !full {
		if n := heldAfter(r, loads); n > maxLedgerTargetsPerReport {
			return invalidArg("router %q would hold load on %d targets, more than %d (the most a full report lists)",
				id, n, maxLedgerTargetsPerReport)
		}
	}
	if !done && len(rep.Predicted)+len(rep.Sessions) == 0 {
		return nil // nothing for the others yet
	}
	if done {
		l.metrics.reports.Inc() // reports, not their messages
		l.applyLoadsLocked(r, loads, full)
	}
	if len(rep.Predicted)+len(rep.Sessions) > 0 {
		now := l.now()
		for other, o := range l.routers {
			if other != id {
				o.queue.AddPredicted(now, rep.Predicted...)
				o.queue.AddSessions(now, rep.Sessions...)
			}
		}
	}
	l.wakeLocked()
	return nil
}

// heldAfter is how many targets r holds load on once the partial report loads
// is applied (a full one holds what it lists, bounded by receiveLocked).
func heldAfter(r *ledgerRouter, loads []*kvindexv1.TargetLoad) int {
	if len(loads) == 0 {
		return len(r.loads)
	}
	holds := make(map[ledgerTarget]bool, len(loads)) // the last value listed wins
	for _, tl := range loads {
		holds[ledgerTarget{tl.Worker, tl.DpRank}] = tl.InFlight != 0 || tl.PrefillTokens != 0 || tl.DecodeBlocks != 0
	}
	n := len(r.loads)
	for t, h := range holds {
		_, held := r.loads[t]
		switch {
		case h && !held:
			n++
		case !h && held:
			n--
		}
	}
	return n
}

// errReplaced ends a stream whose router reconnected on another one.
func errReplaced(id string) error {
	return fmt.Errorf("%w: router %q reconnected on another stream", ErrFailedPrecondition, id)
}

// validateReport checks a whole report before any of it is applied, so a bad
// one changes nothing.
func validateReport(rep *kvindexv1.ReportRequest) error {
	if len(rep.Loads) > maxLedgerTargetsPerReport {
		return invalidArg("a load report lists %d targets, more than %d", len(rep.Loads), maxLedgerTargetsPerReport)
	}
	for _, tl := range rep.Loads {
		if tl.Worker == "" || len(tl.Worker) > MaxNameBytes {
			return invalidArg("a load report names a worker of %d bytes", len(tl.Worker))
		}
	}
	for _, p := range rep.Predicted {
		if len(p.Keys) > kvindexv1.LedgerMaxPredictionKeys || p.Worker == "" || len(p.Worker) > MaxNameBytes || len(p.RouterId) > MaxNameBytes {
			return invalidArg("a predicted prefix with %d keys for worker %q", len(p.Keys), p.Worker)
		}
	}
	for _, s := range rep.Sessions {
		if s.Key == "" || len(s.Key) > MaxNameBytes || s.Worker == "" || len(s.Worker) > MaxNameBytes {
			return invalidArg("a session binding with a key of %d bytes for worker %q", len(s.Key), s.Worker)
		}
	}
	return nil
}

// applyLoadsLocked applies a whole report's loads: with full, targets it does
// not list hold nothing.
func (l *loadLedger) applyLoadsLocked(r *ledgerRouter, loads []*kvindexv1.TargetLoad, full bool) {
	if full {
		listed := make(map[ledgerTarget]bool, len(loads))
		for _, tl := range loads {
			listed[ledgerTarget{tl.Worker, tl.DpRank}] = true
		}
		for t := range r.loads {
			if !listed[t] {
				l.setLoadLocked(r, t, ledgerLoad{})
			}
		}
	}
	for _, tl := range loads {
		l.setLoadLocked(r, ledgerTarget{tl.Worker, tl.DpRank},
			ledgerLoad{int64(tl.InFlight), int64(tl.PrefillTokens), int64(tl.DecodeBlocks)})
	}
}

// close ends a session; its load stays counted for the lease.
func (l *loadLedger) close(id string, session uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if r := l.routers[id]; r != nil && r.session == session {
		r.session = 0
		r.leaseUntil = l.now().Add(l.lease)
		r.parts.Reset() // a report the stream left unfinished: the loads stay as they were
		// The queue stays, as it fills on while the lease runs: a reconnect gets
		// what is left of each message (ledgerq).
	}
}

// view returns what router id should see on its stream session: the total
// minus its own load, as the changes against last (or whole, when last is nil),
// plus its queued messages, as many as one push carries (ledgerq.Take). It
// also returns the channel that the next change closes (closed already when
// messages are left for the next push). It fails when the router reconnected on another stream, which must
// not take the new stream's messages (a partitioned router's old stream lives
// on until keepalive ends it).
func (l *loadLedger) view(id string, session uint64, last map[ledgerTarget]ledgerLoad) (*kvindexv1.ReportResponse, map[ledgerTarget]ledgerLoad, <-chan struct{}, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	l.expireLocked(now)
	r := l.routers[id]
	if r != nil && r.session != session {
		return nil, nil, nil, errReplaced(id)
	}
	resp := &kvindexv1.ReportResponse{Routers: uint32(len(l.routers)), Full: last == nil}
	next := make(map[ledgerTarget]ledgerLoad, len(l.total))
	for t, sum := range l.total {
		if r != nil {
			sum = sum.add(r.loads[t], -1)
		}
		if sum != (ledgerLoad{}) {
			next[t] = sum
		}
	}
	for t, v := range next {
		if last == nil || last[t] != v {
			resp.Loads = append(resp.Loads, &kvindexv1.TargetLoad{Worker: t.worker, DpRank: t.rank,
				InFlight: uint32(v.inFlight), PrefillTokens: uint64(v.prefillTokens), DecodeBlocks: uint64(v.blocks)})
		}
	}
	for t := range last {
		if _, still := next[t]; !still {
			resp.Loads = append(resp.Loads, &kvindexv1.TargetLoad{Worker: t.worker, DpRank: t.rank})
		}
	}
	changed := l.changed
	if r != nil {
		var more bool
		resp.Predicted, resp.Sessions, more = r.queue.Take(now)
		if more { // a message's worth taken: the rest goes with the next push
			changed = alreadyChanged
		}
	}
	return resp, next, changed, nil
}

// alreadyChanged is the channel view returns when a router's queue holds more
// than one push carries: the next push is due at once.
var alreadyChanged = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

// loadService implements kvindex.v1.LoadService.
type loadService struct {
	kvindexv1.UnimplementedLoadServiceServer
	a *API
}

var ledgerSessions struct {
	mu   sync.Mutex
	next uint64
}

func nextLedgerSession() uint64 {
	ledgerSessions.mu.Lock()
	defer ledgerSessions.mu.Unlock()
	ledgerSessions.next++
	return ledgerSessions.next
}

// Report runs one router session; it ends with a not-leader error as soon as
// this node is not (or no longer) the leader.
func (s loadService) Report(stream kvindexv1.LoadService_ReportServer) error {
	a := s.a
	ctx := stream.Context()
	if err := a.leaderOnly(); err != nil {
		return err
	}
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	l := a.ledger
	session := nextLedgerSession()
	if err := l.open(first, session); err != nil {
		return err
	}
	id := first.RouterId
	defer l.close(id, session)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() { // the reports
		for {
			rep, err := stream.Recv()
			if err == nil {
				err = l.report(id, session, rep)
			}
			if err != nil {
				cancel(err)
				return
			}
		}
	}()
	var last map[ledgerTarget]ledgerLoad
	var version uint64
	leaderCheck := time.NewTicker(ledgerLeaderCheck)
	defer leaderCheck.Stop()
	for {
		resp, next, changed, err := l.view(id, session, last)
		if err != nil {
			return err
		}
		// A view of many targets goes as several messages, which the router
		// applies together.
		for _, part := range ledgerq.SplitPush(resp) {
			version++
			part.Version = version
			if err := stream.Send(part); err != nil {
				return err
			}
		}
		l.metrics.pushes.Inc()
		last = next
		// Wait for a change (or the heartbeat), then at least the push interval.
		heartbeat := time.NewTimer(kvindexv1.LedgerHeartbeat)
		select {
		case <-changed:
		case <-heartbeat.C:
		case <-leaderCheck.C:
			if err := a.leaderOnly(); err != nil {
				heartbeat.Stop()
				return err
			}
		case <-ctx.Done():
			heartbeat.Stop()
			return ledgerEnd(ctx)
		}
		heartbeat.Stop()
		select {
		case <-time.After(l.push):
		case <-ctx.Done():
			return ledgerEnd(ctx)
		}
	}
}

// ledgerEnd is how a session ends when its context does: the reports' error,
// nil when the router closed its side.
func ledgerEnd(ctx context.Context) error {
	err := context.Cause(ctx)
	if errors.Is(err, context.Canceled) {
		return nil
	}
	if errors.Is(err, io.EOF) {
		return nil
	}
	return err
}

// leaderOnly fails with a not-leader error naming the leader on a follower. It
// asks no other member: the ledger checks it every leaderCheck per router.
func (a *API) leaderOnly() error {
	id, addr, self := a.backend.Leader()
	if self {
		return nil
	}
	return &NotLeaderError{LeaderID: id, LeaderAddr: addr}
}
