package raftstore

import (
	"math/rand/v2"

	"github.com/kvindex/kvindex/internal/ingest"
	"github.com/kvindex/kvindex/internal/radix"
)

// synthStream generates the stream batches of one engine rank the way ingest
// hands them over: consecutive seqs, BlockStored chains under blocks it holds (or
// at a namespace root), BlockRemoved of blocks it holds (evicting when over
// capacity), and a rare AllBlocksCleared. It is deterministic for a seed.
type synthStream struct {
	stream   ingest.Stream
	rng      *rand.Rand
	seq      uint64
	held     []heldBlock // any order
	next     uint64      // next engine hash
	capacity int
	ns       uint64
}

type heldBlock struct {
	hash uint64
	tier radix.Tier
}

func newSynthStream(s ingest.Stream, seed uint64, capacity int) *synthStream {
	return &synthStream{
		stream: s, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		next: seed << 32, capacity: capacity, ns: seed % 3,
	}
}

// batch returns the next batch; blocks is about how many block events it carries.
func (g *synthStream) batch(blocks int) ingest.StreamBatch {
	b := ingest.StreamBatch{Stream: g.stream, Seq: g.seq}
	g.seq++
	if g.rng.IntN(5000) == 0 {
		g.held = g.held[:0]
		b.Ops = append(b.Ops, ingest.Op{Kind: ingest.OpCleared})
		return b
	}
	for left := blocks; left > 0; {
		n := min(left, 1+g.rng.IntN(16))
		left -= n
		if len(g.held) > g.capacity-n || (len(g.held) > 0 && g.rng.IntN(3) == 0) {
			g.remove(&b, n)
			continue
		}
		op := ingest.Op{Kind: ingest.OpStored, Namespace: g.ns, Tier: radix.Tier(g.rng.IntN(2))}
		if len(g.held) > 0 && g.rng.IntN(4) != 0 {
			op.HasParent, op.Parent = true, g.held[g.rng.IntN(len(g.held))].hash
		}
		for range n {
			op.Hashes = append(op.Hashes, g.next)
			op.Keys = append(op.Keys, g.rng.Uint64()%1024) // few keys: chains share nodes
			g.held = append(g.held, heldBlock{g.next, op.Tier})
			g.next++
		}
		b.Ops = append(b.Ops, op)
	}
	return b
}

func (g *synthStream) remove(b *ingest.StreamBatch, n int) {
	// One BlockRemoved per tier, as vLLM reports each medium's evictions.
	var ops [2]ingest.Op
	for range min(n, len(g.held)) {
		i := g.rng.IntN(len(g.held))
		op := &ops[g.held[i].tier]
		op.Hashes = append(op.Hashes, g.held[i].hash)
		g.held[i] = g.held[len(g.held)-1]
		g.held = g.held[:len(g.held)-1]
	}
	for tier, op := range ops {
		if len(op.Hashes) > 0 {
			op.Kind, op.Tier = ingest.OpRemoved, radix.Tier(tier)
			b.Ops = append(b.Ops, op)
		}
	}
}
