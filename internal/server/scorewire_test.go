package server

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	kvindexv1 "github.com/kvindex/kvindex/api/proto/kvindex/v1"
	"github.com/kvindex/kvindex/internal/kvblock"
)

// randomResult makes a scoreResult with every field exercised: empty and
// multi-byte varints, zero and nonzero tiers, workers with no, one and several
// ranks, a zero total (hit rate 0).
func randomResult(rng *rand.Rand) *scoreResult {
	val := func() int {
		switch rng.IntN(4) {
		case 0:
			return 0
		case 1:
			return rng.IntN(128)
		case 2:
			return rng.IntN(1 << 14)
		default:
			return rng.IntN(1 << 20)
		}
	}
	r := &scoreResult{model: fmt.Sprintf("model-%d", rng.IntN(3)), blockSize: 1 + rng.IntN(64), promptTokens: val(),
		totalBlocks: val(), applied: rng.Uint64() >> rng.IntN(64)}
	if rng.IntN(8) == 0 {
		r.model = ""
	}
	for w := range rng.IntN(12) {
		wr := workerResult{id: fmt.Sprintf("w-%02d", w), registered: rng.IntN(2) == 0, blocks: val()}
		for t := range wr.perTier {
			wr.perTier[t] = val()
		}
		for rank := range rng.IntN(4) {
			rk := rankResult{rank: uint32(rank), blocks: val()}
			for t := range rk.perTier {
				rk.perTier[t] = val()
			}
			wr.ranks = append(wr.ranks, rk)
		}
		r.workers = append(r.workers, wr)
	}
	return r
}

func wireBytes(t *testing.T, data mem.BufferSlice) []byte {
	t.Helper()
	defer data.Free()
	return data.Materialize()
}

// TestWireEncodingEqualsProtoMarshal holds the fast path's hand-written
// encoding of Score and QueryByHash answers to proto.Marshal of the
// generated-type answer built from the same result, byte for byte.
func TestWireEncodingEqualsProtoMarshal(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 7))
	det := proto.MarshalOptions{Deterministic: true}
	for i := range 500 {
		r := randomResult(rng)
		want, err := det.Marshal(r.proto())
		if err != nil {
			t.Fatal(err)
		}
		qbh := &kvindexv1.QueryByHashResponse{Model: r.model, BlockSize: uint32(r.blockSize), TotalBlocks: uint32(r.totalBlocks),
			AppliedIndex: r.applied, Scores: r.workerScores()}
		wantQBH, err := det.Marshal(qbh)
		if err != nil {
			t.Fatal(err)
		}
		copyOf := *r // marshalWire releases the result it encodes
		copyOf.workers = append([]workerResult(nil), r.workers...)
		got := wireBytes(t, (*scoreWire)(r).marshalWire())
		if !bytes.Equal(got, want) {
			var back kvindexv1.ScoreResponse
			err := proto.Unmarshal(got, &back)
			t.Fatalf("case %d: Score encoding differs from proto.Marshal (decodes to %v, %v), want %v", i, &back, err, r.proto())
		}
		gotQBH := wireBytes(t, (*queryByHashWire)(&copyOf).marshalWire())
		if !bytes.Equal(gotQBH, wantQBH) {
			t.Fatalf("case %d: QueryByHash encoding differs from proto.Marshal", i)
		}
	}
}

func TestFastPathHandlersAreRegistered(t *testing.T) {
	// The server registers indexServiceDesc; a method of it left with the
	// generated handler would silently leave the fast path.
	generated := map[string]uintptr{}
	for _, m := range kvindexv1.IndexService_ServiceDesc.Methods {
		generated[m.MethodName] = reflect.ValueOf(m.Handler).Pointer()
	}
	for _, m := range indexServiceDesc.Methods {
		fast := reflect.ValueOf(m.Handler).Pointer() != generated[m.MethodName]
		if want := m.MethodName == "Score" || m.MethodName == "QueryByHash"; fast != want {
			t.Errorf("%s: fast-path handler %v, want %v", m.MethodName, fast, want)
		}
	}
	if len(indexServiceDesc.Methods) != len(kvindexv1.IndexService_ServiceDesc.Methods) {
		t.Errorf("%d methods, the generated description has %d", len(indexServiceDesc.Methods), len(kvindexv1.IndexService_ServiceDesc.Methods))
	}
}

// TestFastPathAnswersEqualTheGeneratedPath sends a sequence of Score and
// QueryByHash calls over gRPC (the fast path, with pooled requests and results
// reused from call to call: long prompts then short ones, salts, candidate
// lists, matched_only) and compares every answer with the generated-type form
// called directly on the same state.
func TestFastPathAnswersEqualTheGeneratedPath(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	tr := sendTraffic(f)
	ctx := context.Background()
	direct := indexService{a: f.srv.api}
	local := kvindexv1.BlockHashKind_BLOCK_HASH_KIND_LOCAL
	keys := kvblock.AppendLocalHashes(nil, tr.query, 4, "")
	scores := []*kvindexv1.ScoreRequest{
		{Model: testModel, TokenIds: tr.query},
		{Model: testModel, TokenIds: tr.sys, CacheSalt: "tenant-x"},
		{Model: testModel, TokenIds: tr.query[:8], Workers: []string{"e1", "nobody", "e0"}},
		{Model: testModel, TokenIds: tr.query},
		{Model: testModel, Text: tr.text},
	}
	for i, req := range scores {
		got, err := f.index.Score(ctx, req)
		if err != nil {
			t.Fatalf("Score %d: %v", i, err)
		}
		want, err := direct.Score(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if got.Scores[0].MatchedBlocks == 0 && i != 2 {
			t.Errorf("Score %d matched nothing: the case is vacuous", i)
		}
		if !proto.Equal(got, want) {
			t.Errorf("Score %d over gRPC = %v, want %v", i, got, want)
		}
	}
	queries := []*kvindexv1.QueryByHashRequest{
		{Model: testModel, BlockHashes: keys, HashKind: local},
		{Model: testModel, BlockHashes: keys[:1], HashKind: local, MatchedOnly: true},
		{Model: testModel, BlockHashes: keys, HashKind: local, Workers: []string{"e2", "e0"}, MatchedOnly: true},
		{Model: testModel, BlockHashes: keys, HashKind: local},
	}
	for i, req := range queries {
		got, err := f.index.QueryByHash(ctx, req)
		if err != nil {
			t.Fatalf("QueryByHash %d: %v", i, err)
		}
		want, err := direct.QueryByHash(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if len(got.Scores) == 0 || got.Scores[0].MatchedBlocks == 0 {
			t.Errorf("QueryByHash %d matched nothing: the case is vacuous", i)
		}
		if !proto.Equal(got, want) {
			t.Errorf("QueryByHash %d over gRPC = %v, want %v", i, got, want)
		}
	}
}

// TestRequestDecodingEqualsProtoUnmarshal holds the codec's decoding of Score
// and QueryByHash requests (ids into the pooled request's slice, the rest by
// proto) to proto.Unmarshal: packed and unpacked ids, ids split over several
// occurrences between other fields, concatenated messages (later scalars win,
// repeated fields append), and truncated, malformed input (both refuse it).
func TestRequestDecodingEqualsProtoUnmarshal(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 13))
	codec := newServerCodec()
	decode := func(b []byte, into proto.Message) error {
		return codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, into)
	}
	ids := func() []uint64 {
		out := make([]uint64, rng.IntN(40))
		for i := range out {
			out[i] = rng.Uint64() >> rng.IntN(64)
		}
		return out
	}
	unpacked := func(num protowire.Number, vs []uint64) []byte {
		var b []byte
		for _, v := range vs {
			b = protowire.AppendVarint(protowire.AppendTag(b, num, protowire.VarintType), v)
		}
		return b
	}
	var pooledScore kvindexv1.ScoreRequest
	var pooledQuery kvindexv1.QueryByHashRequest
	for i := range 400 {
		tokens := ids()
		sr := &kvindexv1.ScoreRequest{Model: "m", CacheSalt: fmt.Sprint(rng.IntN(3)), Workers: []string{"a", "b"}[:rng.IntN(3)]}
		for _, v := range tokens[:len(tokens)/2] {
			sr.TokenIds = append(sr.TokenIds, uint32(v))
		}
		qr := &kvindexv1.QueryByHashRequest{Model: "m", BlockHashes: tokens[:len(tokens)/2], MatchedOnly: rng.IntN(2) == 0}
		sb, _ := proto.Marshal(sr)
		qb, _ := proto.Marshal(qr)
		// More ids, unpacked, then another message with other scalars.
		sb = append(sb, unpacked(scoreRequestTokenIDs, tokens[len(tokens)/2:])...)
		qb = append(qb, unpacked(queryByHashRequestHashes, tokens[len(tokens)/2:])...)
		more, _ := proto.Marshal(&kvindexv1.ScoreRequest{Model: "n", TokenIds: []uint32{7, 1 << 20}, Text: "x"})
		sb = append(sb, more...)
		more, _ = proto.Marshal(&kvindexv1.QueryByHashRequest{LoraName: "l", BlockHashes: []uint64{1 << 60}, Workers: []string{"c"}})
		qb = append(qb, more...)
		if i%4 == 3 { // truncated: malformed unless cut at a field boundary
			sb, qb = sb[:rng.IntN(len(sb)+1)], qb[:rng.IntN(len(qb)+1)]
		}

		var wantScore kvindexv1.ScoreRequest
		wantErr := proto.Unmarshal(sb, &wantScore)
		pooledScore = kvindexv1.ScoreRequest{TokenIds: pooledScore.TokenIds[:0]}
		err := decode(sb, &pooledScore)
		if (err != nil) != (wantErr != nil) || (err == nil && !proto.Equal(&pooledScore, &wantScore)) {
			t.Fatalf("case %d: ScoreRequest decodes to %v (%v), proto.Unmarshal to %v (%v)", i, &pooledScore, err, &wantScore, wantErr)
		}
		var wantQuery kvindexv1.QueryByHashRequest
		wantErr = proto.Unmarshal(qb, &wantQuery)
		pooledQuery = kvindexv1.QueryByHashRequest{BlockHashes: pooledQuery.BlockHashes[:0]}
		err = decode(qb, &pooledQuery)
		if (err != nil) != (wantErr != nil) || (err == nil && !proto.Equal(&pooledQuery, &wantQuery)) {
			t.Fatalf("case %d: QueryByHashRequest decodes to %v (%v), proto.Unmarshal to %v (%v)", i, &pooledQuery, err, &wantQuery, wantErr)
		}
	}
}
