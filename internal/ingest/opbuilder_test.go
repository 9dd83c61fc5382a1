package ingest

import (
	"slices"
	"testing"

	"github.com/kvindex/kvindex/internal/ingest/wire"
	"github.com/kvindex/kvindex/internal/kvblock"
	"github.com/kvindex/kvindex/internal/radix"
)

func TestOpBuilderBuildsWhatASubscriptionBuilds(t *testing.T) {
	toks := []uint32{1, 2, 3, 4, 5, 6, 7, 8}
	events := []wire.Event{
		{Kind: wire.BlockStored, BlockHashes: []uint64{10, 11}, TokenIDs: toks, BlockSize: 4},
		{Kind: wire.BlockStored, BlockHashes: []uint64{12}, TokenIDs: toks, BlockSize: 4}, // token count mismatch: refused
		{Kind: wire.BlockRemoved, BlockHashes: []uint64{10}},
	}
	ops := NewOpBuilder("m", 4).Build(events)
	if len(ops) != 2 || ops[0].Kind != radix.OpStored || ops[1].Kind != radix.OpRemoved {
		t.Fatalf("ops %+v", ops)
	}
	if want := kvblock.AppendLocalHashes(nil, toks, 4, ""); !slices.Equal(ops[0].Keys, want) {
		t.Errorf("keys %v, want %v", ops[0].Keys, want)
	}
	if ns := (kvblock.Namespace{Model: "m"}).ID(); ops[0].Namespace != ns {
		t.Errorf("namespace %x, want %x", ops[0].Namespace, ns)
	}
	want, _ := newOpBuilder("m", 4).build(events)
	if len(want) != len(ops) {
		t.Errorf("subscription builder made %d ops, exported one %d", len(want), len(ops))
	}
}
