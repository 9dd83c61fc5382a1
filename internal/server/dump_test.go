package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"sync"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"

	kvindexv1 "github.com/kvindex/kvindex/api/proto/kvindex/v1"
	"github.com/kvindex/kvindex/bench/fakeengine"
	"github.com/kvindex/kvindex/internal/ingest"
	"github.com/kvindex/kvindex/internal/radix"
	"github.com/kvindex/kvindex/internal/raftstore"
)

// dumpEntry is one block a dump reports: held by a worker's rank on a tier.
type dumpEntry struct {
	ns, seq uint64
	worker  string
	rank    uint32
	tier    kvindexv1.Tier
}

// appliedLog records every stream batch the node applied, with its log index.
type appliedLog struct {
	mu      sync.Mutex
	indexes []uint64
	batches []ingest.StreamBatch
}

func (l *appliedLog) observer() raftstore.BatchObserver {
	return func(index uint64, b *ingest.StreamBatch, o raftstore.BatchOutcome, _ ingest.ApplyResult) {
		if o != raftstore.BatchApplied {
			return
		}
		c := *b
		c.Ops = make([]ingest.Op, len(b.Ops))
		for i, op := range b.Ops {
			op.Hashes, op.Keys = slices.Clone(op.Hashes), slices.Clone(op.Keys)
			c.Ops[i] = op
		}
		l.mu.Lock()
		defer l.mu.Unlock()
		l.indexes = append(l.indexes, index)
		l.batches = append(l.batches, c)
	}
}

// stateAt replays, into an index of its own, the batches applied at log
// indexes up to applied, and returns the blocks that index holds as a dump
// would list them. Apply hooks run under the lock IndexCopy takes, so every
// batch at or below an applied index a dump reported is recorded by then.
func (l *appliedLog) stateAt(applied uint64) map[dumpEntry]bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	ref := ingest.NewApplier(radix.New(radix.Config{}))
	for i, b := range l.batches {
		if l.indexes[i] <= applied {
			ref.Apply(b)
		}
	}
	nodes := ref.Index().Nodes()
	paths := make([][]uint64, len(nodes)) // local keys from the namespace root
	ns := make([]uint64, len(nodes))
	out := map[dumpEntry]bool{}
	for i, n := range nodes {
		if n.Parent < 0 {
			ns[i] = n.Key
			continue
		}
		ns[i] = ns[n.Parent]
		paths[i] = append(slices.Clone(paths[n.Parent]), n.Key)
		seq := chainTip(paths[i])
		for _, h := range n.Holders {
			for t := range radix.Tier(radix.NumTiers) {
				if h.Tiers&(1<<t) != 0 {
					out[dumpEntry{ns[i], seq, h.Worker.Worker, h.Worker.DPRank, tierProto(t)}] = true
				}
			}
		}
	}
	return out
}

// addChanges adds a dump's changes to got, failing on a change of another
// applied index or kind than the dump's, or one listed twice.
func addChanges(got map[dumpEntry]bool, applied uint64, changes []*kvindexv1.IndexChange) error {
	for _, c := range changes {
		if c.AppliedIndex != applied || c.Kind != kvindexv1.ChangeKind_CHANGE_KIND_STORED || len(c.SequenceHashes) != 1 {
			return fmt.Errorf("change %v in a dump at applied index %d", c, applied)
		}
		e := dumpEntry{c.NamespaceId, c.SequenceHashes[0], c.Worker, c.DpRank, c.Tier}
		if got[e] {
			return fmt.Errorf("change %v listed twice", c)
		}
		got[e] = true
	}
	return nil
}

// grpcDump dumps the whole index over gRPC.
func grpcDump(f *fixture) (uint64, map[dumpEntry]bool, error) {
	stream, err := f.index.Dump(context.Background(), &kvindexv1.DumpRequest{})
	if err != nil {
		return 0, nil, err
	}
	got, applied := map[dumpEntry]bool{}, uint64(0)
	for first := true; ; first = false {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return applied, got, nil
		}
		if err != nil {
			return 0, nil, err
		}
		if first {
			applied = m.AppliedIndex
		} else if m.AppliedIndex != applied {
			return 0, nil, fmt.Errorf("one dump's messages report applied indexes %d and %d", applied, m.AppliedIndex)
		}
		if err := addChanges(got, applied, m.Changes); err != nil {
			return 0, nil, err
		}
	}
}

// restDump dumps the whole index with GET /dump.
func restDump(f *fixture) (uint64, map[dumpEntry]bool, error) {
	code, body := f.get("/dump")
	if code != 200 {
		return 0, nil, fmt.Errorf("GET /dump = %d %.300s", code, body)
	}
	var d struct {
		AppliedIndex string            `json:"applied_index"`
		Changes      []json.RawMessage `json:"changes"`
	}
	if err := json.Unmarshal([]byte(body), &d); err != nil {
		return 0, nil, fmt.Errorf("GET /dump: %v", err)
	}
	applied, err := strconv.ParseUint(d.AppliedIndex, 10, 64)
	if err != nil {
		return 0, nil, fmt.Errorf("GET /dump applied_index %q: %v", d.AppliedIndex, err)
	}
	changes := make([]*kvindexv1.IndexChange, len(d.Changes))
	for i, raw := range d.Changes {
		changes[i] = &kvindexv1.IndexChange{}
		if err := protojson.Unmarshal(raw, changes[i]); err != nil {
			return 0, nil, err
		}
	}
	got := map[dumpEntry]bool{}
	return applied, got, addChanges(got, applied, changes)
}

// TestDumpIsTheIndexAtItsAppliedIndex: a dump, over gRPC and REST, taken
// while an engine stores, offloads and evicts blocks, lists exactly the blocks
// of the index at the applied index it reports: what replaying the batches
// the node applied up to that index gives, no batch after it and none missing
// (its blocks and its applied index come from one copy of the index).
func TestDumpIsTheIndexAtItsAppliedIndex(t *testing.T) {
	rec := &appliedLog{}
	// Few GPU and CPU blocks: the traffic offloads and evicts, so blocks
	// come and go between dumps.
	f := newFixture(t, fixtureOptions{engines: []engineSpec{{name: "e1", dp: 1, gpuBlocks: 8, cpuBlocks: 24}},
		configure: func(c *Config) { c.onBatch = rec.observer() }})
	e := f.engines["e1"]
	f.generate("e1", 0, tokens(0, 8), "") // the stream is followed live from here on

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	trafficDone := make(chan error, 1)
	go func() {
		for i := range 400 {
			// Flush: each request's events are published before the next
			// request, so batches keep arriving while the dumps run.
			_, err := e.Generate(ctx, fakeengine.Request{Prompt: tokens(i%11*16, 8+i%13), MaxTokens: 1})
			if err == nil {
				err = e.Flush(ctx)
			}
			if err != nil {
				trafficDone <- err
				return
			}
		}
		trafficDone <- nil
	}()

	// Dumps are taken as fast as they come while the traffic runs, and each
	// is compared with the replay once the traffic is over.
	type taken struct {
		what    string
		applied uint64
		got     map[dumpEntry]bool
	}
	var dumps []taken
	take := func(what string, dump func(*fixture) (uint64, map[dumpEntry]bool, error)) {
		t.Helper()
		applied, got, err := dump(f)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		dumps = append(dumps, taken{what, applied, got})
	}
	for running := true; running; {
		select {
		case err := <-trafficDone:
			if err != nil {
				t.Fatal(err)
			}
			running = false
		default:
		}
		if len(dumps)%2 == 0 {
			take("gRPC Dump", grpcDump)
		} else {
			take("GET /dump", restDump)
		}
	}
	during := len(dumps)
	f.sync()
	take("gRPC Dump after the traffic", grpcDump)
	take("GET /dump after the traffic", restDump)
	indexes := map[uint64]bool{}
	for i, d := range dumps {
		indexes[d.applied] = true
		want := rec.stateAt(d.applied)
		for k := range d.got {
			if !want[k] {
				t.Errorf("%s at applied index %d lists %+v, which the index did not hold then", d.what, d.applied, k)
			}
		}
		for k := range want {
			if !d.got[k] {
				t.Errorf("%s at applied index %d misses %+v, which the index held then", d.what, d.applied, k)
			}
		}
		if i >= during && len(d.got) == 0 {
			t.Errorf("%s is empty: the test compared nothing", d.what)
		}
	}
	t.Logf("%d dumps during the traffic; %d distinct applied indexes in all", during, len(indexes))
}
