package ingest

import "github.com/kvindex/kvindex/internal/ingest/wire"

// OpBuilder turns one stream's decoded events into index Ops exactly as a
// subscription does (block keys from the tokens with the worker's block size,
// namespace from model, LoRA and cache salt, refusals dropped). It exists for
// callers that feed an Applier without sockets, such as the route bench's
// offline simulator. Not safe for concurrent use: one per stream.
type OpBuilder struct{ b *opBuilder }

// NewOpBuilder returns the builder of a stream of model's worker whose events
// must carry blockSize (0 accepts the event's own).
func NewOpBuilder(model string, blockSize int) *OpBuilder {
	return &OpBuilder{b: newOpBuilder(model, blockSize)}
}

// Build converts events to Ops; the Ops alias the events' hash slices.
func (b *OpBuilder) Build(events []wire.Event) []Op {
	ops, _ := b.b.build(events)
	return ops
}
