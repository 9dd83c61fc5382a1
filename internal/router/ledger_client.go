package router

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	kvindexv1 "github.com/kvindex/kvindex/api/proto/kvindex/v1"
	kvindex "github.com/kvindex/kvindex/clients/go"
	"github.com/kvindex/kvindex/internal/ledgerq"
)

// fleetLedger is the router's side of the shared load ledger (--ledger): one
// Report stream to the indexer leader carrying this router's load per target
// (what changed, every --ledger-interval) and the decisions and session
// bindings it made; back come the other routers' summed loads and decisions.
// A decision then sees local + remote load, so N routers route as one would
// (the busy thresholds included: a view showing the others' load going down
// wakes the requests queued for it, as a local release does), and the other
// routers' predicted prefixes enter this router's overlay, so a burst split
// over routers still co-locates.
//
// While the stream is down (no indexer, an election, a network fault, a leader
// that has pushed nothing for ledgerSilence) the remote view is empty: the router routes on its own load, and
// kvindex_router_ledger_connected says so. It re-opens the stream on the leader
// (following not-leader answers) and re-sends its full state, which rebuilds the
// leader's view within one round trip.
//
// Concurrency: remote is replaced whole (atomic pointer); the outbox has its own
// mutex; one goroutine runs the stream.
type fleetLedger struct {
	r        *Router
	id       string
	addrs    []string
	token    string
	interval time.Duration
	tls      *tls.Config // nil: plaintext

	remote    atomic.Pointer[map[Target]Load] // nil while disconnected
	connected atomic.Bool
	lastPush  atomic.Int64 // unix nanoseconds of the last view received
	downSince atomic.Int64 // unix nanoseconds the stream was lost; 0 while up or never up

	// others remembers the other routers' recent decisions per deciding router.
	others *OtherRouters

	mu sync.Mutex
	// outbox holds the decisions and bindings waiting to be reported, bounded
	// as the leader bounds its queue per router (ledgerq), so a router cut off
	// from the indexer holds a bounded amount whatever its prompts.
	outbox ledgerq.Queue               // guarded by mu
	conns  map[string]*grpc.ClientConn // guarded by mu
}

// remoteLoad is the other routers' load on t (zero without the ledger).
func (f *fleetLedger) remoteLoad(t Target) Load {
	if f == nil {
		return Load{}
	}
	if m := f.remote.Load(); m != nil {
		return (*m)[t]
	}
	return Load{}
}

// AddLoad is a + b (this router's load plus the others').
func AddLoad(a, b Load) Load {
	return Load{InFlight: a.InFlight + b.InFlight, PrefillTokens: a.PrefillTokens + b.PrefillTokens, DecodeBlocks: a.DecodeBlocks + b.DecodeBlocks}
}

// sharedByOthers is how many of keys' leading blocks the other routers' recent
// decisions sent to t, summed over the routers (OtherRouters.Shared).
func (f *fleetLedger) sharedByOthers(keys []uint64, t Target) int {
	if f == nil {
		return 0
	}
	return f.others.Shared(keys, t, f.r.now())
}

// queue records a decision and a session binding for the other routers.
func (f *fleetLedger) queue(keys []uint64, t Target, sessionKey string, predictedTTL, sessionTTL time.Duration) {
	if f == nil {
		return
	}
	now := f.r.now()
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(keys) > 0 {
		// The leader refuses a report with a longer prediction (and the stream
		// with it); the leading blocks are the ones other prompts share.
		keys = keys[:min(len(keys), kvindexv1.LedgerMaxPredictionKeys)]
		f.outbox.AddPredicted(now, &kvindexv1.PredictedPrefix{
			Worker: t.Worker, DpRank: t.Rank, Keys: keys, TtlMs: ledgerq.TTLMs(predictedTTL), RouterId: f.id})
	}
	if sessionKey != "" {
		f.outbox.AddSessions(now, &kvindexv1.SessionBinding{Key: sessionKey, Worker: t.Worker, TtlMs: ledgerq.TTLMs(sessionTTL)})
	}
}

// takeOutbox takes from the outbox what one report carries, the oldest first
// (ledgerq.Take: the rest goes with the next reports, one a --ledger-interval),
// with each entry's TTL cut by the time it waited; entries whose TTL ran out
// meanwhile are dropped.
func (f *fleetLedger) takeOutbox() ([]*kvindexv1.PredictedPrefix, []*kvindexv1.SessionBinding) {
	now := f.r.now()
	f.mu.Lock()
	defer f.mu.Unlock()
	pred, sess, _ := f.outbox.Take(now)
	return pred, sess
}

func (f *fleetLedger) conn(addr string) (*grpc.ClientConn, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if cc := f.conns[addr]; cc != nil {
		return cc, nil
	}
	creds := insecure.NewCredentials()
	if f.tls != nil {
		creds = credentials.NewTLS(f.tls)
	}
	cc, err := grpc.NewClient(addr, append(kvindexv1.FlowControlDialOptions(), grpc.WithTransportCredentials(creds),
		grpc.WithKeepaliveParams(ledgerKeepalive))...)
	if err != nil {
		return nil, err
	}
	f.conns[addr] = cc
	return cc, nil
}

// ledgerSilence is how long a session waits for the leader's next push before
// it takes the leader as gone: a few of its heartbeats, so a push delayed by a
// busy leader or network does not end a live stream. Without it a hung leader,
// or a partition that drops packets (no FIN or RST ever arrives), would leave
// its last view counting for as long as the kernel keeps the connection.
const ledgerSilence = 3 * kvindexv1.LedgerHeartbeat

// ledgerKeepalive pings a connection with nothing to read, as no slower than
// the servers permit (kvindexv1.KeepaliveMinTime, with a margin so a ping
// that arrives early is no strike), and closes it when the answer does not
// come: a dead connection to an indexer is found before a session needs it.
var ledgerKeepalive = keepalive.ClientParameters{
	Time: 2 * kvindexv1.KeepaliveMinTime, Timeout: kvindexv1.KeepaliveMinTime, PermitWithoutStream: true}

// errSilentLeader ends a session whose leader stopped pushing.
var errSilentLeader = errors.New("the load ledger's leader pushed nothing for " + ledgerSilence.String())

func (f *fleetLedger) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, cc := range f.conns {
		cc.Close()
	}
}

// run keeps a stream to the leader open until ctx ends.
func (f *fleetLedger) run(ctx context.Context) {
	m := f.r.metrics
	next := 0
	addr := f.addrs[0]
	backoff := 50 * time.Millisecond
	for ctx.Err() == nil {
		err := f.session(ctx, addr)
		if f.connected.Swap(false) {
			f.downSince.Store(f.r.now().UnixNano())
			backoff = 50 * time.Millisecond // it was up: reconnect at once
		}
		if f.remote.Swap(nil) != nil {
			f.r.ledger.wake() // the others' load no longer counts: waiters may fit now
		}
		m.ledgerConnected.Set(0)
		if ctx.Err() != nil {
			return
		}
		if leader, ok := kvindex.NotLeader(err); ok && leader != "" {
			addr = leader // follow the leader at once
			continue
		}
		f.r.log.Debug("load ledger stream ended; routing on this router's own load", "indexer", addr, "err", err)
		next = (next + 1) % len(f.addrs)
		addr = f.addrs[next]
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// session runs one stream until it fails or ctx ends.
func (f *fleetLedger) session(ctx context.Context, addr string) error {
	cc, err := f.conn(addr)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if f.token != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+f.token)
	}
	stream, err := kvindexv1.NewLoadServiceClient(cc).Report(ctx)
	if err != nil {
		return err
	}
	m := f.r.metrics
	// send sends a report, as several messages when its loads are more than
	// one carries (a fleet of many targets with long names).
	send := func(rep *kvindexv1.ReportRequest) error {
		for _, part := range ledgerq.SplitReport(rep) {
			m.ledgerMessages.WithLabelValues("sent").Inc()
			m.ledgerBytes.WithLabelValues("sent").Add(float64(proto.Size(part)))
			if err := stream.Send(part); err != nil {
				return err
			}
		}
		return nil
	}
	sent := f.r.ledger.Loads()
	if err := send(&kvindexv1.ReportRequest{RouterId: f.id, Full: true, Loads: targetLoads(sent, nil)}); err != nil {
		return recvErr(stream, err)
	}
	recvDone := make(chan error, 1)
	start := time.Now()
	var lastPush atomic.Int64 // time.Since(start) at the last push, monotonic
	go func() { recvDone <- f.receive(stream, func() { lastPush.Store(int64(time.Since(start))) }) }()
	defer func() {
		cancel()
		<-recvDone // the stream's context ended: Recv returns
	}()
	tick := time.NewTicker(f.interval)
	defer tick.Stop()
	silence := time.NewTimer(ledgerSilence)
	defer silence.Stop()
	for {
		select {
		case err := <-recvDone:
			recvDone <- err // for the deferred wait
			return err
		case <-ctx.Done():
			return ctx.Err()
		case <-silence.C:
			if quiet := time.Since(start) - time.Duration(lastPush.Load()); quiet < ledgerSilence {
				silence.Reset(ledgerSilence - quiet)
				continue
			}
			return errSilentLeader
		case <-tick.C:
		}
		now := f.r.ledger.Loads()
		loads := targetLoads(now, sent)
		pred, sess := f.takeOutbox()
		if len(loads)+len(pred)+len(sess) == 0 {
			continue
		}
		if err := send(&kvindexv1.ReportRequest{RouterId: f.id, Loads: loads, Predicted: pred, Sessions: sess}); err != nil {
			if !errors.Is(err, io.EOF) {
				return err
			}
			// The stream ended: the receiving goroutine's Recv returns its real
			// error (recvErr's second Recv would race with it).
			err = <-recvDone
			recvDone <- err // for the deferred wait
			return err
		}
		sent = now
	}
}

// recvErr is the stream's real error after a failed Send (which only says EOF),
// while nothing else receives on the stream.
func recvErr(stream kvindexv1.LoadService_ReportClient, err error) error {
	if errors.Is(err, io.EOF) {
		if _, rerr := stream.Recv(); rerr != nil {
			return rerr
		}
	}
	return err
}

// targetLoads lists the targets of now that differ from before (all of now when
// before is nil), and zero loads for targets of before that now lacks.
func targetLoads(now, before map[Target]Load) []*kvindexv1.TargetLoad {
	var out []*kvindexv1.TargetLoad
	for t, l := range now {
		if b, ok := before[t]; before == nil || !ok || b != l {
			out = append(out, &kvindexv1.TargetLoad{Worker: t.Worker, DpRank: t.Rank, InFlight: uint32(l.InFlight),
				PrefillTokens: uint64(l.PrefillTokens), DecodeBlocks: uint64(l.DecodeBlocks)})
		}
	}
	for t := range before {
		if _, ok := now[t]; !ok {
			out = append(out, &kvindexv1.TargetLoad{Worker: t.Worker, DpRank: t.Rank})
		}
	}
	return out
}

// receive applies the leader's views until the stream ends, calling pushed on
// each message. A view that came as several messages is applied once its last
// has: a part of the first, full, view is not the fleet's load, and the router
// is not connected before it has that.
func (f *fleetLedger) receive(stream kvindexv1.LoadService_ReportClient, pushed func()) error {
	m := f.r.metrics
	view := map[Target]Load{}
	var parts ledgerq.Parts
	for {
		resp, err := stream.Recv()
		if err != nil {
			return err
		}
		pushed()
		m.ledgerMessages.WithLabelValues("received").Inc()
		m.ledgerBytes.WithLabelValues("received").Add(float64(proto.Size(resp)))
		now := f.r.now()
		for _, p := range resp.Predicted {
			// The deciding router's TTL, not this one's: routers may be configured
			// differently (0 holds no longer).
			ttl := time.Duration(p.TtlMs) * time.Millisecond
			f.r.recent.RecordFor(p.Keys, Target{Worker: p.Worker, Rank: p.DpRank}, now, ttl)
			f.others.Record(p.RouterId, p.Keys, Target{Worker: p.Worker, Rank: p.DpRank}, now, ttl)
		}
		for _, s := range resp.Sessions {
			f.r.sessions.setFor(s.Key, s.Worker, now, time.Duration(s.TtlMs)*time.Millisecond)
		}
		loads, full, done, err := parts.Add(resp.Full, resp.More, resp.Loads)
		if err != nil {
			return err
		}
		if !done {
			continue
		}
		next := make(map[Target]Load, len(view)+len(loads))
		if !full {
			for t, l := range view {
				next[t] = l
			}
		}
		for _, tl := range loads {
			t := Target{Worker: tl.Worker, Rank: tl.DpRank}
			l := Load{InFlight: int(tl.InFlight), PrefillTokens: int(tl.PrefillTokens), DecodeBlocks: int(tl.DecodeBlocks)}
			if l == (Load{}) {
				delete(next, t)
			} else {
				next[t] = l
			}
		}
		down := wentDown(view, next)
		view = next
		f.remote.Store(&next)
		if down {
			// Requests queued because of the others' load decide again, as they
			// do when this router's own load goes down.
			f.r.ledger.wake()
		}
		f.lastPush.Store(now.UnixNano())
		m.ledgerRouters.Set(float64(resp.Routers))
		if !f.connected.Swap(true) {
			m.ledgerConnected.Set(1)
			if down := f.downSince.Swap(0); down != 0 {
				m.ledgerRebuild.Observe(now.Sub(time.Unix(0, down)).Seconds())
			}
		}
	}
}

// wentDown reports whether any target's load in after is below before's in any
// of its terms (a target missing from after has none).
func wentDown(before, after map[Target]Load) bool {
	for t, b := range before {
		a := after[t]
		if a.InFlight < b.InFlight || a.PrefillTokens < b.PrefillTokens || a.DecodeBlocks < b.DecodeBlocks {
			return true
		}
	}
	return false
}

// staleness is how old the remote view is; -1 while disconnected.
func (f *fleetLedger) staleness() float64 {
	if !f.connected.Load() {
		return -1
	}
	return f.r.now().Sub(time.Unix(0, f.lastPush.Load())).Seconds()
}

// String names the ledger's state for logs.
func (f *fleetLedger) String() string {
	return fmt.Sprintf("ledger(router %s, connected %v)", f.id, f.connected.Load())
}
