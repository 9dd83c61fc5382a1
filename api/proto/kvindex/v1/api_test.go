package kvindexv1_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	kvindexv1 "github.com/kvindex/kvindex/api/proto/kvindex/v1"
)

var update = flag.Bool("update", false, "rewrite testdata/*.json from the messages in the test")

// Servers that implement nothing: they must still satisfy the generated interfaces,
// which is what every real server in internal/server builds on.
type unimplementedIndexServer struct {
	kvindexv1.UnimplementedIndexServiceServer
}

type unimplementedAdminServer struct {
	kvindexv1.UnimplementedAdminServiceServer
}

var (
	_ kvindexv1.IndexServiceServer = unimplementedIndexServer{}
	_ kvindexv1.AdminServiceServer = unimplementedAdminServer{}
)

func sampleScoreResponse() *kvindexv1.ScoreResponse {
	return &kvindexv1.ScoreResponse{
		Model:        "qwen3-8b",
		BlockSize:    16,
		PromptTokens: 70,
		TotalBlocks:  4,
		AppliedIndex: 1234567890123,
		Scores: []*kvindexv1.WorkerScore{{
			Worker:            "engine-0",
			MatchedBlocks:     3,
			MatchedTokens:     48,
			HitRate:           0.75,
			GpuMatchedBlocks:  2,
			CpuMatchedBlocks:  3,
			DiskMatchedBlocks: 1,
			DpRanks: []*kvindexv1.DpRankScore{{
				DpRank:            1,
				MatchedBlocks:     3,
				MatchedTokens:     48,
				GpuMatchedBlocks:  2,
				CpuMatchedBlocks:  3,
				DiskMatchedBlocks: 1,
			}},
		}},
	}
}

func TestScoreResponseSurvivesWireRoundTrip(t *testing.T) {
	want := sampleScoreResponse()
	wire, err := proto.Marshal(want)
	if err != nil {
		t.Fatalf("marshal: %v", err)
	}
	got := &kvindexv1.ScoreResponse{}
	if err := proto.Unmarshal(wire, got); err != nil {
		t.Fatalf("unmarshal: %v", err)
	}
	if !proto.Equal(got, want) {
		t.Fatalf("round trip changed the message:\n got  %v\n want %v", got, want)
	}
}

// TestJSONShapeMatchesGolden pins the JSON names of the public messages: a renamed
// field makes the golden file fail to decode (unknown field) and fail to compare.
// Every field is set so that every name is pinned; the values need not make a
// valid request.
func TestJSONShapeMatchesGolden(t *testing.T) {
	optionalBlockSize := uint32(16)
	addGenerationPrompt := false
	parentHash := uint64(0x9e3779b97f4a7c15)
	tests := []struct {
		golden string
		msg    proto.Message
	}{
		{"score_request.json", &kvindexv1.ScoreRequest{
			Model:                  "qwen3-8b",
			LoraName:               "sql-adapter",
			CacheSalt:              "tenant-a",
			BlockSize:              &optionalBlockSize,
			TokenIds:               []uint32{1, 2, 4294967295},
			Text:                   "Hello",
			AddGenerationPrompt:    &addGenerationPrompt,
			ToolsJson:              `[{"type":"function","function":{"name":"lookup"}}]`,
			ChatTemplateKwargsJson: `{"enable_thinking":false}`,
			Messages: []*kvindexv1.ChatMessage{{
				Role:             "assistant",
				Content:          "Let me look that up.",
				Name:             "bot",
				ToolCallId:       "call-0",
				ReasoningContent: "think",
				ToolCalls: []*kvindexv1.ToolCall{{
					Id:       "call-1",
					Type:     "function",
					Function: &kvindexv1.FunctionCall{Name: "lookup", Arguments: `{"q":"x"}`},
				}},
			}},
			Workers:     []string{"engine-0", "engine-1"},
			Consistency: kvindexv1.Consistency_CONSISTENCY_LINEARIZABLE,
		}},
		{"score_response.json", sampleScoreResponse()},
		{"query_by_hash_request.json", &kvindexv1.QueryByHashRequest{
			Model:       "qwen3-8b",
			LoraName:    "sql-adapter",
			CacheSalt:   "tenant-a",
			BlockHashes: []uint64{1, 18446744073709551615},
			HashKind:    kvindexv1.BlockHashKind_BLOCK_HASH_KIND_LOCAL,
			Workers:     []string{"engine-0"},
			Consistency: kvindexv1.Consistency_CONSISTENCY_LOCAL,
		}},
		{"workers_response.json", &kvindexv1.WorkersResponse{
			AppliedIndex: 42,
			Workers: []*kvindexv1.WorkerInfo{{
				Spec: &kvindexv1.WorkerSpec{
					Id:             "engine-0",
					Model:          "qwen3-8b",
					BlockSize:      16,
					DpSize:         2,
					EventsEndpoint: "tcp://10.0.0.7:5557",
					EventsTopic:    "kv-events",
					ReplayEndpoint: "tcp://10.0.0.7:5657",
					HttpEndpoint:   "http://10.0.0.7:8000",
					Role:           kvindexv1.WorkerRole_WORKER_ROLE_PREFILL,
					Labels:         map[string]string{"zone": "a"},
				},
				State:      kvindexv1.WorkerState_WORKER_STATE_LIVE,
				GpuBlocks:  100,
				CpuBlocks:  200,
				DiskBlocks: 300,
				DpRanks: []*kvindexv1.DpRankStatus{{
					DpRank: 1, LastSeq: 77, GpuBlocks: 50, CpuBlocks: 100, DiskBlocks: 150,
				}},
			}},
		}},
		{"stats_response.json", &kvindexv1.StatsResponse{
			Nodes:        1000,
			Residencies:  64000,
			Workers:      64,
			Namespaces:   3,
			AppliedIndex: 42,
			Counters:     map[string]uint64{"stored_blocks": 70000},
		}},
		{"watch_response.json", &kvindexv1.WatchResponse{
			Changes: []*kvindexv1.IndexChange{{
				Worker:             "engine-0",
				DpRank:             1,
				Kind:               kvindexv1.ChangeKind_CHANGE_KIND_STORED,
				Model:              "qwen3-8b",
				LoraName:           "sql-adapter",
				CacheSalt:          "tenant-a",
				Tier:               kvindexv1.Tier_TIER_CPU,
				SequenceHashes:     []uint64{11, 12},
				LocalHashes:        []uint64{21, 22},
				ParentSequenceHash: &parentHash,
				AppliedIndex:       43,
			}},
		}},
		{"cluster_response.json", &kvindexv1.ClusterResponse{
			Leader:       "node-1",
			Term:         3,
			CommitIndex:  50,
			AppliedIndex: 49,
			NodeId:       "node-2",
			Members: []*kvindexv1.ClusterMember{{
				Id:           "node-1",
				RaftAddr:     "10.0.0.1:7090",
				GrpcAddr:     "10.0.0.1:7070",
				Suffrage:     kvindexv1.Suffrage_SUFFRAGE_VOTER,
				AppliedIndex: 50,
				IsLeader:     true,
			}},
		}},
		{"route_decision.json", &kvindexv1.RouteDecision{
			Worker:        "engine-0",
			DpRank:        1,
			PrefillWorker: "engine-2",
			DecodeWorker:  "engine-3",
			Policy:        "kv-aware",
			OverlapBlocks: 7,
			Cost:          12.5,
			Reason:        "lowest cost",
		}},
	}
	for _, tt := range tests {
		t.Run(tt.golden, func(t *testing.T) {
			path := filepath.Join("testdata", tt.golden)
			encoded, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(tt.msg)
			if err != nil {
				t.Fatalf("marshal: %v", err)
			}
			if *update {
				writeIndentedJSON(t, path, encoded)
			}
			golden, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("read golden (run with -update to create it): %v", err)
			}

			decoded := tt.msg.ProtoReflect().New().Interface()
			if err := protojson.Unmarshal(golden, decoded); err != nil {
				t.Fatalf("golden %s no longer decodes (renamed field?): %v", path, err)
			}
			if !proto.Equal(decoded, tt.msg) {
				t.Errorf("golden %s decodes to\n %v\nwant\n %v", path, decoded, tt.msg)
			}
			if got, want := canonicalJSON(t, encoded), canonicalJSON(t, golden); got != want {
				t.Errorf("JSON shape changed; if intended, rerun with -update.\n got  %s\n want %s", got, want)
			}
		})
	}
}

// canonicalJSON re-encodes JSON with sorted keys and no spacing, because protojson
// deliberately varies its whitespace.
func canonicalJSON(t *testing.T, data []byte) string {
	t.Helper()
	var v any
	if err := json.Unmarshal(data, &v); err != nil {
		t.Fatalf("invalid JSON %q: %v", data, err)
	}
	out, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("re-encode: %v", err)
	}
	return string(out)
}

func writeIndentedJSON(t *testing.T, path string, data []byte) {
	t.Helper()
	var buf bytes.Buffer
	if err := json.Indent(&buf, []byte(canonicalJSON(t, data)), "", "  "); err != nil {
		t.Fatalf("indent: %v", err)
	}
	buf.WriteByte('\n')
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatalf("write golden: %v", err)
	}
}

// TestGeneratedServicesServeOverGRPC registers servers that implement nothing on a
// real gRPC server and calls every RPC through the generated clients: each call must
// reach its handler (UNIMPLEMENTED naming the method), proving the generated
// service descriptors, method names and stream wiring fit together.
func TestGeneratedServicesServeOverGRPC(t *testing.T) {
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	server := grpc.NewServer()
	kvindexv1.RegisterIndexServiceServer(server, unimplementedIndexServer{})
	kvindexv1.RegisterAdminServiceServer(server, unimplementedAdminServer{})
	serveDone := make(chan error, 1)
	go func() { serveDone <- server.Serve(listener) }()
	t.Cleanup(func() {
		server.Stop()
		if err := <-serveDone; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			t.Errorf("serve: %v", err)
		}
	})

	conn, err := grpc.NewClient(listener.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { conn.Close() })
	index := kvindexv1.NewIndexServiceClient(conn)
	admin := kvindexv1.NewAdminServiceClient(conn)
	ctx := t.Context()

	calls := []struct {
		method string
		call   func() error
	}{
		{"Score", func() error { _, err := index.Score(ctx, &kvindexv1.ScoreRequest{Model: "m"}); return err }},
		{"QueryByHash", func() error { _, err := index.QueryByHash(ctx, &kvindexv1.QueryByHashRequest{}); return err }},
		{"Workers", func() error { _, err := index.Workers(ctx, &kvindexv1.WorkersRequest{}); return err }},
		{"Stats", func() error { _, err := index.Stats(ctx, &kvindexv1.StatsRequest{}); return err }},
		{"Watch", func() error { return firstWatchError(ctx, index) }},
		{"RegisterWorker", func() error { _, err := admin.RegisterWorker(ctx, &kvindexv1.RegisterWorkerRequest{}); return err }},
		{"UnregisterWorker", func() error { _, err := admin.UnregisterWorker(ctx, &kvindexv1.UnregisterWorkerRequest{}); return err }},
		{"Join", func() error { _, err := admin.Join(ctx, &kvindexv1.JoinRequest{}); return err }},
		{"Leave", func() error { _, err := admin.Leave(ctx, &kvindexv1.LeaveRequest{}); return err }},
		{"Cluster", func() error { _, err := admin.Cluster(ctx, &kvindexv1.ClusterRequest{}); return err }},
		{"Snapshot", func() error { _, err := admin.Snapshot(ctx, &kvindexv1.SnapshotRequest{}); return err }},
	}
	for _, c := range calls {
		t.Run(c.method, func(t *testing.T) {
			st, ok := status.FromError(c.call())
			if !ok || st.Code() != codes.Unimplemented {
				t.Fatalf("got %v, want code Unimplemented", st)
			}
			if want := "method " + c.method + " not implemented"; st.Message() != want {
				t.Fatalf("got message %q, want %q (call routed to the wrong handler?)", st.Message(), want)
			}
		})
	}
}

// firstWatchError opens a Watch stream and returns the error that ends it.
func firstWatchError(ctx context.Context, index kvindexv1.IndexServiceClient) error {
	stream, err := index.Watch(ctx, &kvindexv1.WatchRequest{})
	if err != nil {
		return err
	}
	for {
		if _, err := stream.Recv(); err != nil {
			if errors.Is(err, io.EOF) {
				return errors.New("watch stream ended without an error")
			}
			return err
		}
	}
}
