package kvindex_test

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	kvindexv1 "github.com/kvindex/kvindex/api/proto/kvindex/v1"
	kvindex "github.com/kvindex/kvindex/clients/go"
	"github.com/kvindex/kvindex/internal/kvblock"
)

// follower is a gRPC server that answers like a raft follower: writes are
// refused with the leader's address, reads with UNAVAILABLE (a node still
// catching up). It stands in for a second cluster member until the lead's raft
// integration makes real followers.
type follower struct {
	kvindexv1.UnimplementedAdminServiceServer
	kvindexv1.UnimplementedIndexServiceServer
	leaderAddr    string // "" when the follower knows no leader (an election)
	writes, reads atomic.Int32
	addr          string
}

func (f *follower) notLeader() error {
	st, _ := status.New(codes.Unavailable, "not the leader").WithDetails(&errdetails.ErrorInfo{Reason: "NOT_LEADER", Domain: "kvindex.io",
		Metadata: map[string]string{"leader_id": "leader", "leader_addr": f.leaderAddr}})
	return st.Err()
}

func (f *follower) RegisterWorker(context.Context, *kvindexv1.RegisterWorkerRequest) (*kvindexv1.RegisterWorkerResponse, error) {
	f.writes.Add(1)
	return nil, f.notLeader()
}

func (f *follower) UnregisterWorker(context.Context, *kvindexv1.UnregisterWorkerRequest) (*kvindexv1.UnregisterWorkerResponse, error) {
	f.writes.Add(1)
	return nil, f.notLeader()
}

func (f *follower) Score(context.Context, *kvindexv1.ScoreRequest) (*kvindexv1.ScoreResponse, error) {
	f.reads.Add(1)
	return nil, status.Error(codes.Unavailable, "catching up")
}

func startFollower(t *testing.T, leaderAddr string) *follower {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &follower{leaderAddr: leaderAddr, addr: ln.Addr().String()}
	s := grpc.NewServer()
	kvindexv1.RegisterAdminServiceServer(s, f)
	kvindexv1.RegisterIndexServiceServer(s, f)
	go s.Serve(ln)
	t.Cleanup(s.Stop)
	return f
}

// deadAddr is an address nothing listens on.
func deadAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

func TestReadsMoveOnToAnotherMember(t *testing.T) {
	f := startFollower(t, exampleAddr)
	c, err := kvindex.New(kvindex.Options{Addrs: []string{deadAddr(t), f.addr, exampleAddr}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := c.ScoreTokens(ctx, exampleModel, []uint32{256, 84, 104, 101})
	if err != nil || len(resp.Scores) != 1 || resp.Scores[0].MatchedBlocks != 1 {
		t.Fatalf("Score past a dead and a catching-up member = %v, %v", resp, err)
	}
	if f.reads.Load() != 1 {
		t.Errorf("the catching-up member got %d reads", f.reads.Load())
	}
	// The member that answered is tried first next time.
	if _, err := c.Stats(ctx); err != nil || f.reads.Load() != 1 {
		t.Errorf("Stats = %v; follower reads %d", err, f.reads.Load())
	}

	only, _ := kvindex.New(kvindex.Options{Addrs: []string{deadAddr(t)}, MaxAttempts: 2})
	defer only.Close()
	if _, err := only.Stats(ctx); status.Code(err) != codes.Unavailable {
		t.Errorf("Stats with no live member = %v", err)
	}
}

func TestWritesFollowTheLeader(t *testing.T) {
	f := startFollower(t, exampleAddr)
	c, err := kvindex.New(kvindex.Options{Addrs: []string{f.addr}, AdminToken: exampleToken})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	spec := &kvindexv1.WorkerSpec{Id: "w-follow", Model: exampleModel, BlockSize: 4}
	if _, err := c.RegisterWorker(ctx, spec); err != nil {
		t.Fatalf("RegisterWorker through a follower: %v", err)
	}
	if f.writes.Load() != 1 {
		t.Errorf("the follower got %d writes", f.writes.Load())
	}
	// The leader is remembered: the next write goes straight to it.
	if _, err := c.UnregisterWorker(ctx, "w-follow"); err != nil || f.writes.Load() != 1 {
		t.Errorf("UnregisterWorker = %v; follower writes %d", err, f.writes.Load())
	}
	if _, err := c.UnregisterWorker(ctx, "w-follow"); status.Code(err) != codes.NotFound {
		t.Errorf("unregistering twice = %v", err)
	}

	noToken, _ := kvindex.New(kvindex.Options{Addrs: []string{exampleAddr}})
	defer noToken.Close()
	if _, err := noToken.RegisterWorker(ctx, spec); status.Code(err) != codes.Unauthenticated {
		t.Errorf("RegisterWorker without the token = %v", err)
	}

	lost := startFollower(t, "")
	c2, _ := kvindex.New(kvindex.Options{Addrs: []string{lost.addr}, AdminToken: exampleToken, MaxAttempts: 3})
	defer c2.Close()
	_, err = c2.RegisterWorker(ctx, spec)
	if addr, ok := kvindex.NotLeader(err); !ok || addr != "" || lost.writes.Load() != 3 {
		t.Errorf("with no leader known: %v (%q, %v), %d tries", err, addr, ok, lost.writes.Load())
	}
	if _, ok := kvindex.NotLeader(errors.New("x")); ok {
		t.Error("NotLeader of a plain error")
	}
}

// TestWritesThatMustNotRunTwicePassOverADeadMember: UnregisterWorker (which
// must not be repeated after an ambiguous failure) goes to the next member
// when one cannot be reached, since nothing was sent to it; and once the
// remembered leader dies, the next writes find another member. Both used to
// fail with UNAVAILABLE, the second for good.
func TestWritesThatMustNotRunTwicePassOverADeadMember(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	direct, err := kvindex.New(kvindex.Options{Addrs: []string{exampleAddr}, AdminToken: exampleToken})
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	spec := &kvindexv1.WorkerSpec{Id: "w-dead-member", Model: exampleModel, BlockSize: 4}

	t.Run("first member down", func(t *testing.T) {
		if _, err := direct.RegisterWorker(ctx, spec); err != nil {
			t.Fatal(err)
		}
		c, err := kvindex.New(kvindex.Options{Addrs: []string{deadAddr(t), exampleAddr}, AdminToken: exampleToken})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := c.UnregisterWorker(ctx, spec.Id); err != nil {
			t.Errorf("UnregisterWorker with the first member down = %v; the live member is never asked", err)
		}
	})

	t.Run("remembered leader dies", func(t *testing.T) {
		proxy := startCutProxy(t, exampleAddr) // stands for the leader that will die
		c, err := kvindex.New(kvindex.Options{Addrs: []string{proxy.ln.Addr().String(), exampleAddr}, AdminToken: exampleToken})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := c.RegisterWorker(ctx, spec); err != nil { // remembers the proxy as the leader
			t.Fatal(err)
		}
		proxy.cut(true)
		proxy.ln.Close() // the old leader is gone for good
		// The first write may fail: it was sent to the leader as it died. The
		// next goes to another member.
		var errs []error
		for range 2 {
			if _, err = c.UnregisterWorker(ctx, spec.Id); err == nil {
				break
			}
			errs = append(errs, err)
		}
		if err != nil {
			t.Errorf("UnregisterWorker after the remembered leader died: %v", errs)
		}
	})
}

func TestDumpAndWatch(t *testing.T) {
	c, err := kvindex.New(kvindex.Options{Addrs: []string{exampleAddr}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	batches := make(chan []*kvindexv1.IndexChange, 16)
	watchDone := make(chan error, 1)
	go func() {
		watchDone <- c.Watch(ctx, &kvindexv1.WatchRequest{Model: exampleModel}, func(ch []*kvindexv1.IndexChange) error {
			batches <- ch
			return nil
		})
	}()
	// Watch subscribes asynchronously: send prompts until a change arrives.
	prompt := []uint32{7, 7, 7, 7, 8, 8, 8, 8}
	var got []*kvindexv1.IndexChange
	for i := uint32(0); got == nil; i++ {
		prompt[0] = 7 + i
		if err := generate(prompt); err != nil {
			t.Fatal(err)
		}
		select {
		case got = <-batches:
		case <-time.After(200 * time.Millisecond):
		}
		if i > 100 {
			t.Fatal("no change was watched")
		}
	}
	if got[0].Kind != kvindexv1.ChangeKind_CHANGE_KIND_STORED || got[0].Worker != "engine-0" {
		t.Errorf("watched %v", got)
	}
	cancel()
	if err := <-watchDone; err != nil {
		t.Errorf("Watch after cancel = %v", err)
	}

	seqs := map[uint64]bool{}
	applied, err := c.Dump(context.Background(), &kvindexv1.DumpRequest{}, func(ch *kvindexv1.IndexChange) error {
		seqs[ch.SequenceHashes[0]] = true
		return nil
	})
	if err != nil || applied == 0 {
		t.Fatalf("Dump = %d, %v", applied, err)
	}
	for _, seq := range kvblock.AppendChainHashes(nil, kvblock.AppendLocalHashes(nil, prompt, 4, "")) {
		if !seqs[seq] {
			t.Errorf("the dump lacks block %d", seq)
		}
	}
	stop := errors.New("enough")
	if _, err := c.Dump(context.Background(), &kvindexv1.DumpRequest{}, func(*kvindexv1.IndexChange) error { return stop }); !errors.Is(err, stop) {
		t.Errorf("Dump with a failing fn = %v", err)
	}
}

func TestNewNeedsAMember(t *testing.T) {
	if _, err := kvindex.New(kvindex.Options{}); !errors.Is(err, kvindex.ErrNoMembers) {
		t.Errorf("New without addresses = %v", err)
	}
}

// cutProxy forwards TCP connections to target until cut closes every one of
// them; while paused it refuses new ones (connections are closed at once).
type cutProxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	conns  []net.Conn
	paused bool
}

func startCutProxy(t *testing.T, target string) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln, target: target}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			paused := p.paused
			p.mu.Unlock()
			out, err := net.Dial("tcp", target)
			if paused || err != nil {
				in.Close()
				if out != nil {
					out.Close()
				}
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, in, out)
			p.mu.Unlock()
			wg.Add(2)
			go func() { defer wg.Done(); io.Copy(out, in); out.Close() }()
			go func() { defer wg.Done(); io.Copy(in, out); in.Close() }()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		p.cut(false)
		wg.Wait()
	})
	return p
}

// cut closes every open connection; paused says whether new ones are refused.
func (p *cutProxy) cut(paused bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.paused = paused
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// watched collects a Watch's changes.
type watched struct {
	mu      sync.Mutex
	changes []*kvindexv1.IndexChange
}

func (w *watched) add(ch []*kvindexv1.IndexChange) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.changes = append(w.changes, ch...)
	return nil
}

func (w *watched) last() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.changes) == 0 {
		return 0
	}
	return w.changes[len(w.changes)-1].AppliedIndex
}

// since returns the changes applied at or after index.
func (w *watched) since(index uint64) []*kvindexv1.IndexChange {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []*kvindexv1.IndexChange
	for _, c := range w.changes {
		if c.AppliedIndex >= index {
			out = append(out, c)
		}
	}
	return out
}

// watchResumeRuns counts the runs of TestWatchResumesWithoutAGap in this process.
var watchResumeRuns atomic.Int32

// TestWatchResumesWithoutAGap cuts a Watch's connection, makes changes while
// it cannot reconnect, and checks that the resumed Watch delivered exactly the
// changes a Watch that was never cut saw: none skipped, none twice. A Watch
// that asks for changes no member still has ends with ErrWatchResync.
func TestWatchResumesWithoutAGap(t *testing.T) {
	proxy := startCutProxy(t, exampleAddr)
	direct, err := kvindex.New(kvindex.Options{Addrs: []string{exampleAddr}})
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	viaProxy, err := kvindex.New(kvindex.Options{Addrs: []string{proxy.ln.Addr().String()}, MaxAttempts: 1000,
		MinBackoff: 20 * time.Millisecond, MaxBackoff: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer viaProxy.Close()
	ctx, cancel := context.WithCancel(context.Background())
	var ref, resumed watched
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for _, w := range []struct {
		c   *kvindex.Client
		got *watched
	}{{direct, &ref}, {viaProxy, &resumed}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- w.c.Watch(ctx, &kvindexv1.WatchRequest{Model: exampleModel}, w.got.add)
		}()
	}
	defer func() {
		cancel()
		wg.Wait()
		for range 2 {
			if err := <-errs; err != nil {
				t.Errorf("Watch ended with %v", err)
			}
		}
	}()
	// Prompts new to the shared engine on every run (-count=N), so that each
	// one stores blocks and makes changes.
	run := uint32(watchResumeRuns.Add(1))
	prompt := func(i uint32) []uint32 { return []uint32{250 - run%200, i / 200, i % 200, 3, 4, 5, 6, 7} }
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	// Both watchers subscribe asynchronously: make changes until both see one.
	for i := uint32(0); ref.last() == 0 || resumed.last() == 0; i++ {
		if i > 200 {
			t.Fatal("the watchers saw no change")
		}
		if err := generate(prompt(i)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	start := resumed.last()
	proxy.cut(true)
	for i := uint32(300); i < 306; i++ { // applied while the resuming watcher is cut off
		if err := generate(prompt(i)); err != nil {
			t.Fatal(err)
		}
	}
	proxy.cut(false)
	if err := generate(prompt(400)); err != nil {
		t.Fatal(err)
	}
	end := indexerSrv.Backend().AppliedIndex()
	waitFor("both watchers to reach the last change", func() bool { return ref.last() >= end && resumed.last() >= end })
	want, got := ref.since(start+1), resumed.since(start+1)
	if len(want) < 6 {
		t.Fatalf("only %d changes after the cut; the test needs the ones made meanwhile", len(want))
	}
	if len(got) != len(want) {
		t.Fatalf("resumed watcher got %d changes after index %d, the uncut one %d", len(got), start, len(want))
	}
	for i := range want {
		if !proto.Equal(got[i], want[i]) {
			t.Fatalf("change %d after the cut: resumed %v, uncut %v", i, got[i], want[i])
		}
	}

	// Changes from before what any member keeps: start over.
	old := uint64(0)
	err = direct.Watch(context.Background(), &kvindexv1.WatchRequest{AfterAppliedIndex: &old}, func([]*kvindexv1.IndexChange) error { return nil })
	if !errors.Is(err, kvindex.ErrWatchResync) {
		t.Errorf("Watch after index 0 = %v, want ErrWatchResync", err)
	}
}
