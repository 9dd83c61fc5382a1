package server

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	kvindexv1 "github.com/kvindex/kvindex/api/proto/kvindex/v1"
	"github.com/kvindex/kvindex/internal/radix"
)

// The gRPC fast path of Score and QueryByHash, the calls a router makes once per
// request. Through the generated handlers each call decoded its token ids (or
// block hashes) into a fresh slice and answered with one WorkerScore and one
// DpRankScore message per candidate worker, marshaled by reflection: ~30 KB
// allocated and more CPU than the scoring itself for a 2k-token prompt over 64
// workers (bench/RESULTS.md). Here the two methods have handlers of their own,
// registered under the generated service description in place of the generated
// ones (same names, same wire format):
//
//   - requests come from a pool and are decoded with proto's Merge into the
//     capacity their repeated fields kept (serverCodec), so the token ids or
//     hashes of a request land in a reused slice;
//   - the answer is the scoreResult itself (pooled, see newScoreResult), written
//     by serverCodec straight into a gRPC buffer and released.
//
// The generated-type forms (indexService.Score and QueryByHash) stay for REST
// and are the reference: scorewire_test holds the two encodings to the same
// message.
//
// Concurrency: the pools are safe for concurrent use; a request or result is
// owned by one call at a time: taken by the handler, released by it (request)
// or by the codec once written (result).

// indexServiceDesc is kvindex.v1.IndexService with the fast-path handlers.
var indexServiceDesc = func() grpc.ServiceDesc {
	d := kvindexv1.IndexService_ServiceDesc
	d.Methods = slices.Clone(d.Methods)
	for i := range d.Methods {
		switch d.Methods[i].MethodName {
		case "Score":
			d.Methods[i].Handler = fastHandler(&scoreRequests, kvindexv1.IndexService_Score_FullMethodName,
				func(r *kvindexv1.ScoreRequest) *[]uint32 { return &r.TokenIds },
				indexService.scoreResult, func(r *scoreResult) any { return (*scoreWire)(r) })
		case "QueryByHash":
			d.Methods[i].Handler = fastHandler(&queryByHashRequests, kvindexv1.IndexService_QueryByHash_FullMethodName,
				func(r *kvindexv1.QueryByHashRequest) *[]uint64 { return &r.BlockHashes },
				indexService.queryByHashResult, func(r *scoreResult) any { return (*queryByHashWire)(r) })
		}
	}
	return d
}()

var (
	scoreRequests       = sync.Pool{New: func() any { return new(kvindexv1.ScoreRequest) }}
	queryByHashRequests = sync.Pool{New: func() any { return new(kvindexv1.QueryByHashRequest) }}
)

// maxPooledIDs bounds the token ids or hashes a pooled request keeps room for:
// a rare huge prompt does not pin its buffer in the pool.
const maxPooledIDs = 1 << 15

// fastHandler is a generated-style method handler that decodes into a request
// from pool, computes its result through the server's interceptor and answers
// with wire(result). When the call is done it empties the request, keeping the
// capacity of its ids field, and pools it again. The answer refers to nothing
// of the request but its strings, which emptying it does not touch.
func fastHandler[R any, P interface {
	*R
	proto.Message
}, T uint32 | uint64](pool *sync.Pool, method string, ids func(P) *[]T,
	result func(indexService, context.Context, P) (*scoreResult, error), wire func(*scoreResult) any) grpc.MethodHandler {
	return func(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
		req := P(pool.Get().(*R))
		defer func() {
			if kept := (*ids(req))[:0]; cap(kept) <= maxPooledIDs {
				proto.Reset(req)
				*ids(req) = kept
				pool.Put((*R)(req))
			}
		}()
		if err := dec(req); err != nil {
			return nil, err
		}
		s := srv.(indexService)
		handler := func(ctx context.Context, req any) (any, error) {
			res, err := result(s, ctx, req.(P))
			if err != nil {
				return nil, err
			}
			return wire(res), nil
		}
		if interceptor == nil {
			return handler(ctx, req)
		}
		return interceptor(ctx, req, &grpc.UnaryServerInfo{Server: srv, FullMethod: method}, handler)
	}
}

// serverCodec is gRPC's proto codec with two changes: a wireMessage writes
// itself, and the token ids of a ScoreRequest and the block hashes of a
// QueryByHashRequest are decoded by decodeIDs into the capacity the pooled
// request kept (proto's own decoder allocates a new slice for every packed
// field, even when merging), the rest of the message by proto with Merge (gRPC
// otherwise decodes into a new, zero message, for which merging is decoding).
type serverCodec struct{ proto encoding.CodecV2 }

func newServerCodec() serverCodec { return serverCodec{proto: encoding.GetCodecV2("proto")} }

func (c serverCodec) Name() string { return c.proto.Name() }

func (c serverCodec) Marshal(v any) (mem.BufferSlice, error) {
	if w, ok := v.(wireMessage); ok {
		return w.marshalWire(), nil
	}
	return c.proto.Marshal(v)
}

// Field numbers of ScoreRequest.token_ids and QueryByHashRequest.block_hashes.
const (
	scoreRequestTokenIDs     = 5
	queryByHashRequestHashes = 4
)

func (c serverCodec) Unmarshal(data mem.BufferSlice, v any) error {
	m, ok := v.(proto.Message)
	if !ok {
		return c.proto.Unmarshal(data, v) // which refuses it
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	b := buf.ReadOnlyData()
	switch m := m.(type) {
	case *kvindexv1.ScoreRequest:
		return decodeIDs(b, m, scoreRequestTokenIDs, &m.TokenIds)
	case *kvindexv1.QueryByHashRequest:
		return decodeIDs(b, m, queryByHashRequestHashes, &m.BlockHashes)
	}
	return proto.UnmarshalOptions{Merge: true}.Unmarshal(b, m)
}

// decodeIDs decodes the message b into m, appending every value of the repeated
// integer field num (packed or not), which is *ids, to *ids itself (truncated to
// T, as proto does) and handing the other fields to proto. A
// message is the concatenation of its fields and decoding with Merge a
// concatenation is decoding its parts in turn, so proto decodes the runs of
// other fields between the occurrences of num. Malformed input is left to proto
// (which reports it) from the first bad field on.
func decodeIDs[T uint32 | uint64](b []byte, m proto.Message, num protowire.Number, ids *[]T) error {
	opts := proto.UnmarshalOptions{Merge: true}
	start := 0
	for i := 0; i < len(b); {
		n, typ, tagLen := protowire.ConsumeTag(b[i:])
		if tagLen < 0 {
			break
		}
		valLen := protowire.ConsumeFieldValue(n, typ, b[i+tagLen:])
		if valLen < 0 {
			break
		}
		val := b[i+tagLen : i+tagLen+valLen]
		next := i + tagLen + valLen
		if n == num && (typ == protowire.VarintType || typ == protowire.BytesType) {
			if err := opts.Unmarshal(b[start:i], m); err != nil {
				return err
			}
			if typ == protowire.BytesType {
				val, _ = protowire.ConsumeBytes(val)
			}
			for len(val) > 0 {
				v, n := protowire.ConsumeVarint(val)
				if n < 0 {
					return fmt.Errorf("field %d: %w", num, protowire.ParseError(n))
				}
				*ids = append(*ids, T(v))
				val = val[n:]
			}
			start = next
		}
		i = next
	}
	return opts.Unmarshal(b[start:], m)
}

// wireMessage is a response that encodes itself (once: it may release its
// content while doing so).
type wireMessage interface {
	marshalWire() mem.BufferSlice
}

// scoreWire is a scoreResult sent as a kvindex.v1.ScoreResponse;
// queryByHashWire as a kvindex.v1.QueryByHashResponse.
type (
	scoreWire       scoreResult
	queryByHashWire scoreResult
)

// Field numbers of ScoreResponse, QueryByHashResponse, WorkerScore and
// DpRankScore (api/proto/kvindex/v1/index.proto).
const (
	scoreModel, scoreBlockSize, scorePromptTokens, scoreTotalBlocks, scoreApplied, scoreScores = 1, 2, 3, 4, 5, 6
	qbhModel, qbhBlockSize, qbhTotalBlocks, qbhApplied, qbhScores                              = 1, 2, 3, 4, 5

	wsWorker, wsBlocks, wsTokens, wsHitRate, wsGPU, wsCPU, wsDisk, wsRanks = 1, 2, 3, 4, 5, 6, 7, 8
	rkRank, rkBlocks, rkTokens, rkGPU, rkCPU, rkDisk                       = 1, 2, 3, 4, 5, 6
)

func (w *scoreWire) marshalWire() mem.BufferSlice {
	r := (*scoreResult)(w)
	return r.marshalWire(func(e *wireEncoder) {
		e.string(scoreModel, r.model)
		e.uint(scoreBlockSize, uint64(uint32(r.blockSize)))
		e.uint(scorePromptTokens, uint64(uint32(r.promptTokens)))
		e.uint(scoreTotalBlocks, uint64(uint32(r.totalBlocks)))
		e.uint(scoreApplied, r.applied)
	}, scoreScores)
}

func (w *queryByHashWire) marshalWire() mem.BufferSlice {
	r := (*scoreResult)(w)
	return r.marshalWire(func(e *wireEncoder) {
		e.string(qbhModel, r.model)
		e.uint(qbhBlockSize, uint64(uint32(r.blockSize)))
		e.uint(qbhTotalBlocks, uint64(uint32(r.totalBlocks)))
		e.uint(qbhApplied, r.applied)
	}, qbhScores)
}

// marshalWire encodes the response whose scalar fields header writes and whose
// WorkerScores are field scores, the way proto.Marshal encodes it (fields in
// number order, zero scalars left out), into one pooled buffer, and releases r.
// The header runs twice, to size the buffer and to fill it; each worker is
// sized once.
func (r *scoreResult) marshalWire(header func(*wireEncoder), scores protowire.Number) mem.BufferSlice {
	size := wireEncoder{sizing: true}
	header(&size)
	sizes := r.sizes[:0]
	for i := range r.workers {
		sizes = append(sizes, r.workerSize(&r.workers[i]))
		size.message(scores, sizes[i])
	}
	r.sizes = sizes
	pool := mem.DefaultBufferPool()
	buf := pool.Get(size.n)
	e := wireEncoder{b: (*buf)[:0]}
	header(&e)
	bs := uint32(r.blockSize)
	for i := range r.workers {
		w := &r.workers[i]
		e.message(scores, sizes[i])
		e.string(wsWorker, w.id)
		e.uint(wsBlocks, uint64(uint32(w.blocks)))
		e.uint(wsTokens, uint64(uint32(w.blocks)*bs))
		e.double(wsHitRate, hitRate(w.blocks, r.totalBlocks))
		e.tiers(wsGPU, w.perTier)
		for j := range w.ranks {
			rk := &w.ranks[j]
			e.message(wsRanks, rankSize(rk, bs))
			e.uint(rkRank, uint64(rk.rank))
			e.uint(rkBlocks, uint64(uint32(rk.blocks)))
			e.uint(rkTokens, uint64(uint32(rk.blocks)*bs))
			e.tiers(rkGPU, rk.perTier)
		}
	}
	*buf = e.b
	r.release()
	return mem.BufferSlice{mem.NewBuffer(buf, pool)}
}

// workerSize is the encoded size of w's WorkerScore.
func (r *scoreResult) workerSize(w *workerResult) int {
	bs := uint32(r.blockSize)
	e := wireEncoder{sizing: true}
	e.string(wsWorker, w.id)
	e.uint(wsBlocks, uint64(uint32(w.blocks)))
	e.uint(wsTokens, uint64(uint32(w.blocks)*bs))
	e.double(wsHitRate, hitRate(w.blocks, r.totalBlocks))
	e.tiers(wsGPU, w.perTier)
	for j := range w.ranks {
		e.message(wsRanks, rankSize(&w.ranks[j], bs))
	}
	return e.n
}

// rankSize is the encoded size of rk's DpRankScore.
func rankSize(rk *rankResult, bs uint32) int {
	e := wireEncoder{sizing: true}
	e.uint(rkRank, uint64(rk.rank))
	e.uint(rkBlocks, uint64(uint32(rk.blocks)))
	e.uint(rkTokens, uint64(uint32(rk.blocks)*bs))
	e.tiers(rkGPU, rk.perTier)
	return e.n
}

// wireEncoder appends proto3 fields to b, or only counts their bytes in n when
// sizing: one description of each message serves both passes.
type wireEncoder struct {
	sizing bool
	n      int
	b      []byte
}

func (e *wireEncoder) uint(num protowire.Number, v uint64) {
	if v == 0 {
		return
	}
	if e.sizing {
		e.n += protowire.SizeTag(num) + protowire.SizeVarint(v)
		return
	}
	e.b = protowire.AppendVarint(protowire.AppendTag(e.b, num, protowire.VarintType), v)
}

func (e *wireEncoder) double(num protowire.Number, v float64) {
	if v == 0 {
		return
	}
	if e.sizing {
		e.n += protowire.SizeTag(num) + protowire.SizeFixed64()
		return
	}
	e.b = protowire.AppendFixed64(protowire.AppendTag(e.b, num, protowire.Fixed64Type), math.Float64bits(v))
}

func (e *wireEncoder) string(num protowire.Number, v string) {
	if v == "" {
		return
	}
	if e.sizing {
		e.n += protowire.SizeTag(num) + protowire.SizeBytes(len(v))
		return
	}
	e.b = protowire.AppendString(protowire.AppendTag(e.b, num, protowire.BytesType), v)
}

// message writes the tag and length of an embedded message of size bytes; its
// fields follow (when not sizing). Repeated messages are written even when
// empty, as proto.Marshal does.
func (e *wireEncoder) message(num protowire.Number, size int) {
	if e.sizing {
		e.n += protowire.SizeTag(num) + protowire.SizeBytes(size)
		return
	}
	e.b = protowire.AppendVarint(protowire.AppendTag(e.b, num, protowire.BytesType), uint64(size))
}

// tiers writes the GPU, CPU and disk counts as fields first, first+1, first+2.
func (e *wireEncoder) tiers(first protowire.Number, perTier [radix.NumTiers]int) {
	e.uint(first, uint64(uint32(perTier[radix.TierGPU])))
	e.uint(first+1, uint64(uint32(perTier[radix.TierCPU])))
	e.uint(first+2, uint64(uint32(perTier[radix.TierDisk])))
}
