package server

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	kvindexv1 "github.com/kvindex/kvindex/api/proto/kvindex/v1"
	"github.com/kvindex/kvindex/internal/kvblock"
	"github.com/kvindex/kvindex/internal/radix"
	"github.com/kvindex/kvindex/internal/workerspec"
)

const adminToken = "s3cret-token"

// TestAdminCallsNeedTheToken checks that every admin call is refused without the
// bearer token or with a wrong one, on both protocols, and works with it.
func TestAdminCallsNeedTheToken(t *testing.T) {
	f := newFixture(t, fixtureOptions{engines: defaultEngines[:1], configure: func(c *Config) { c.AdminToken = adminToken }})
	ctx := context.Background()
	withToken := func(tok string) context.Context {
		return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tok)
	}
	spec := &kvindexv1.WorkerSpec{Id: "w-new", Model: testModel, BlockSize: 4, EventsEndpoint: "tcp://127.0.0.1:1"}
	calls := []struct {
		name string
		call func(context.Context) error
	}{
		{"RegisterWorker", func(c context.Context) error {
			_, err := f.admin.RegisterWorker(c, &kvindexv1.RegisterWorkerRequest{Worker: spec})
			return err
		}},
		{"UnregisterWorker", func(c context.Context) error {
			_, err := f.admin.UnregisterWorker(c, &kvindexv1.UnregisterWorkerRequest{WorkerId: "w-none"})
			return err
		}},
		{"Join", func(c context.Context) error {
			_, err := f.admin.Join(c, &kvindexv1.JoinRequest{NodeId: "b", RaftAddr: "127.0.0.1:1"})
			return err
		}},
		{"Leave", func(c context.Context) error {
			_, err := f.admin.Leave(c, &kvindexv1.LeaveRequest{NodeId: "b"})
			return err
		}},
		{"Snapshot", func(c context.Context) error {
			_, err := f.admin.Snapshot(c, &kvindexv1.SnapshotRequest{})
			return err
		}},
	}
	for _, c := range calls {
		t.Run(c.name, func(t *testing.T) {
			if err := c.call(ctx); status.Code(err) != codes.Unauthenticated {
				t.Errorf("without a token: %v", err)
			}
			if err := c.call(withToken("wrong")); status.Code(err) != codes.PermissionDenied {
				t.Errorf("with a wrong token: %v", err)
			}
			// With the token the call reaches the backend: any answer but a refusal.
			if err := c.call(withToken(adminToken)); status.Code(err) == codes.Unauthenticated || status.Code(err) == codes.PermissionDenied {
				t.Errorf("with the token: %v", err)
			}
		})
	}
	if _, err := f.admin.Cluster(ctx, &kvindexv1.ClusterRequest{}); err != nil {
		t.Errorf("Cluster is read-only and needs no token: %v", err)
	}
	if _, err := f.index.Score(ctx, &kvindexv1.ScoreRequest{Model: testModel, TokenIds: tokens(0, 4)}); err != nil {
		t.Errorf("Score needs no token: %v", err)
	}

	for _, path := range []string{"/register", "/unregister"} {
		body := `{"instance_id": "w-rest", "model_name": "` + testModel + `", "endpoint": "tcp://127.0.0.1:1"}`
		if code, resp := f.postJSON(path, body); code != 401 || !strings.Contains(resp, "unauthenticated") {
			t.Errorf("%s without a token = %d %s", path, code, resp)
		}
		if code, resp := f.postJSON(path, body, "Authorization", "Bearer wrong"); code != 403 || !strings.Contains(resp, "permission_denied") {
			t.Errorf("%s with a wrong token = %d %s", path, code, resp)
		}
		if code, resp := f.postJSON(path, body, "Authorization", "Basic "+adminToken); code != 401 {
			t.Errorf("%s with another scheme = %d %s", path, code, resp)
		}
		if code, resp := f.postJSON(path, body, "Authorization", "Bearer "+adminToken); code/100 != 2 {
			t.Errorf("%s with the token = %d %s", path, code, resp)
		}
	}
}

// TestRegisterAndUnregister drives the worker registry through gRPC and the
// REST forms, and checks the effect on Workers and on scores.
func TestRegisterAndUnregister(t *testing.T) {
	f := newFixture(t, fixtureOptions{engines: defaultEngines[:1]})
	ctx := context.Background()
	prompt := concat(tokens(0, 12), tokens(40, 4))
	f.generate("e0", 0, prompt, "")

	// A second engine registered at run time, through gRPC: it is followed at once.
	e9 := startEngineFor(t, engineSpec{name: "e9", dp: 1, gpuBlocks: 64})
	f.engines["e9"] = e9
	spec := workerFlagFor(t, "e9", e9)
	resp, err := f.admin.RegisterWorker(ctx, &kvindexv1.RegisterWorkerRequest{Worker: specProto(spec)})
	if err != nil || resp.Worker.Spec.Id != "e9" {
		t.Fatalf("RegisterWorker = %v, %v", resp, err)
	}
	if _, err := f.admin.RegisterWorker(ctx, &kvindexv1.RegisterWorkerRequest{Worker: specProto(spec)}); err != nil {
		t.Errorf("registering the same spec again: %v", err)
	}
	f.generate("e9", 0, prompt, "")
	score, err := f.index.Score(ctx, &kvindexv1.ScoreRequest{Model: testModel, TokenIds: prompt, Workers: []string{"e9", "e0", "nobody"}})
	if err != nil {
		t.Fatal(err)
	}
	got := viewsFromProto(score.Scores)
	if got["e9"].blocks != 4 || got["e0"].blocks != 4 || got["nobody"].blocks != 0 || len(score.Scores) != 3 {
		t.Errorf("scores after registering e9 = %v", score.Scores)
	}
	for _, s := range score.Scores {
		if s.Worker == "nobody" && len(s.DpRanks) != 0 {
			t.Errorf("an unknown worker has dp ranks: %v", s)
		}
	}

	// The compatible REST form, then dp rank 1 of it at port + 1.
	code, body := f.postJSON("/register", `{"instance_id": 7, "model_name": "`+testModel+`", "endpoint": "tcp://127.0.0.1:6100", "block_size": 4}`)
	if code != 201 || !strings.Contains(body, `"instance_id":"7"`) {
		t.Fatalf("POST /register (Dynamo form) = %d %s", code, body)
	}
	code, body = f.postJSON("/register", `{"instance_id": "7", "modelname": "`+testModel+`", "endpoint": "tcp://127.0.0.1:6101", "dp_rank": 1}`)
	if code != 201 {
		t.Fatalf("POST /register dp_rank 1 = %d %s", code, body)
	}
	if code, body := f.postJSON("/register", `{"instance_id": "7", "model": "`+testModel+`", "endpoint": "tcp://127.0.0.1:7000", "dp_rank": 2}`); code != 400 || !strings.Contains(body, "offset by 2") {
		t.Errorf("dp rank 2 at another port = %d %s", code, body)
	}
	code, body = f.postJSON("/register", map[string]any{"worker": map[string]any{"id": "typed", "model": testModel, "block_size": 4, "role": "WORKER_ROLE_DECODE"}})
	if code != 200 || !strings.Contains(body, `"role":"WORKER_ROLE_DECODE"`) {
		t.Fatalf("POST /register (kvindex form) = %d %s", code, body)
	}
	workers, err := f.index.Workers(ctx, &kvindexv1.WorkersRequest{Model: testModel})
	if err != nil {
		t.Fatal(err)
	}
	byID := map[string]*kvindexv1.WorkerInfo{}
	for _, w := range workers.Workers {
		byID[w.Spec.Id] = w
	}
	if len(byID) != 4 || byID["7"].Spec.DpSize != 2 || byID["7"].Spec.EventsEndpoint != "tcp://127.0.0.1:6100" || byID["typed"] == nil {
		t.Errorf("workers = %v", workers.Workers)
	}

	// Unregister: e9's blocks leave the index before the call returns.
	if code, body := f.postJSON("/unregister", `{"worker_id": "e9"}`); code != 200 {
		t.Fatalf("POST /unregister = %d %s", code, body)
	}
	score, err = f.index.Score(ctx, &kvindexv1.ScoreRequest{Model: testModel, TokenIds: prompt})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range score.Scores {
		if s.Worker == "e9" {
			t.Errorf("e9 is still scored after unregistering: %v", s)
		}
	}
	for _, hs := range f.srv.Index().HolderStats([]string{"e9"}) {
		t.Errorf("e9 still holds blocks: %+v", hs)
	}
	// Mooncake's unregister body always names a dp rank: naming a worker's
	// only rank removes it; one rank of several (7 has two) cannot go alone.
	mooncake := map[string]any{"endpoint": "tcp://127.0.0.1:5557", "replay_endpoint": "tcp://127.0.0.1:5558", "type": "vLLM",
		"modelname": testModel, "tenant_id": "default", "instance_id": "vllm-prefill-node1", "block_size": 4, "dp_rank": 0}
	if code, body := f.postJSON("/register", mooncake); code != 201 {
		t.Fatalf("POST /register (Mooncake body) = %d %s", code, body)
	}
	if code, body := f.postJSON("/unregister", map[string]any{"type": "vLLM", "modelname": testModel, "tenant_id": "default",
		"instance_id": "vllm-prefill-node1", "block_size": 4, "dp_rank": 0}); code != 200 {
		t.Errorf("POST /unregister (Mooncake body, the only rank) = %d %s", code, body)
	}
	if code, body := f.postJSON("/unregister", `{"instance_id": 7, "dp_rank": 0}`); code != 501 || !strings.Contains(body, "has 2") {
		t.Errorf("POST /unregister of one rank of two = %d %s, want 501", code, body)
	}
	if code, body := f.postJSON("/unregister", `{"instance_id": 7}`); code != 200 || !strings.Contains(body, `"status":"ok"`) {
		t.Errorf("POST /unregister (Dynamo form) = %d %s", code, body)
	}
	if _, err := f.admin.UnregisterWorker(ctx, &kvindexv1.UnregisterWorkerRequest{WorkerId: "typed"}); err != nil {
		t.Errorf("UnregisterWorker: %v", err)
	}
	if _, err := f.admin.UnregisterWorker(ctx, &kvindexv1.UnregisterWorkerRequest{WorkerId: "typed"}); status.Code(err) != codes.NotFound {
		t.Errorf("unregistering twice: %v", err)
	}
}

// TestWatchStreamsChanges follows one engine's cache through Watch: stored
// blocks with the chain hashes a router computes, removals, clears and the
// worker's removal.
func TestWatchStreamsChanges(t *testing.T) {
	f := newFixture(t, fixtureOptions{engines: []engineSpec{{name: "w0", dp: 1, gpuBlocks: 8}, {name: "w1", dp: 1, gpuBlocks: 64}}, register: true})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := f.index.Watch(ctx, &kvindexv1.WatchRequest{Workers: []string{"w0"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Header(); err != nil { // subscribed
		t.Fatal(err)
	}
	changes := make(chan *kvindexv1.IndexChange, 1024)
	go func() {
		defer close(changes)
		for {
			m, err := stream.Recv()
			if err != nil {
				return
			}
			for _, c := range m.Changes {
				changes <- c
			}
		}
	}()
	next := func(kind kvindexv1.ChangeKind) *kvindexv1.IndexChange {
		t.Helper()
		timeout := time.After(20 * time.Second)
		for {
			select {
			case c, ok := <-changes:
				if !ok {
					t.Fatalf("the stream ended waiting for %v", kind)
				}
				if c.Worker != "w0" {
					t.Fatalf("a change of another worker: %v", c)
				}
				if c.Kind == kind {
					return c
				}
			case <-timeout:
				t.Fatalf("no %v change", kind)
			}
		}
	}
	first := concat(tokens(0, 16), tokens(50, 1))
	f.generate("w1", 0, first, "") // filtered out
	f.generate("w0", 0, first, "")
	c := next(kvindexv1.ChangeKind_CHANGE_KIND_STORED)
	locals := kvblock.AppendLocalHashes(nil, first, 4, "")
	chain := kvblock.AppendChainHashes(nil, locals)
	if !slices.Equal(c.SequenceHashes, chain) || !slices.Equal(c.LocalHashes, locals) || c.ParentSequenceHash != nil ||
		c.Model != testModel || c.NamespaceId != (kvblock.Namespace{Model: testModel}).ID() ||
		c.Tier != kvindexv1.Tier_TIER_GPU || c.AppliedIndex == 0 {
		t.Errorf("stored change = %v, want chain %v", c, chain)
	}

	// A continuation hangs under the first prompt's last block.
	second := concat(tokens(0, 16), tokens(80, 8))
	f.generate("w0", 0, second, "")
	c = next(kvindexv1.ChangeKind_CHANGE_KIND_STORED)
	full := kvblock.AppendChainHashes(nil, kvblock.AppendLocalHashes(nil, second, 4, ""))
	if c.ParentSequenceHash == nil || *c.ParentSequenceHash != full[3] || !slices.Equal(c.SequenceHashes, full[4:]) {
		t.Errorf("continuation = %v, want parent %d and %v", c, full[3], full[4:])
	}

	// w0 has 8 GPU blocks: a new long prompt evicts older ones.
	f.generate("w0", 0, tokens(150, 24), "")
	removed := next(kvindexv1.ChangeKind_CHANGE_KIND_REMOVED)
	if len(removed.SequenceHashes) == 0 || !slices.Contains(full, removed.SequenceHashes[0]) {
		t.Errorf("removed = %v, want blocks of the earlier prompts %v", removed, full)
	}

	if err := f.engines["w0"].ResetPrefixCache(); err != nil {
		t.Fatal(err)
	}
	f.sync()
	next(kvindexv1.ChangeKind_CHANGE_KIND_CLEARED)

	if _, err := f.admin.UnregisterWorker(context.Background(), &kvindexv1.UnregisterWorkerRequest{WorkerId: "w0"}); err != nil {
		t.Fatal(err)
	}
	next(kvindexv1.ChangeKind_CHANGE_KIND_WORKER_REMOVED)
}

// TestHealthAndReflection checks the gRPC health service and reflection.
func TestHealthAndReflection(t *testing.T) {
	f := newFixture(t, fixtureOptions{engines: defaultEngines[:1]})
	ctx := context.Background()
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := healthpb.NewHealthClient(f.conn).Check(ctx, &healthpb.HealthCheckRequest{})
		if err == nil && resp.Status == healthpb.HealthCheckResponse_SERVING {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("health = %v, %v", resp, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	rc, err := reflectionpb.NewServerReflectionClient(f.conn).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := rc.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	resp, err := rc.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range resp.GetListServicesResponse().GetService() {
		names = append(names, s.Name)
	}
	for _, want := range []string{"kvindex.v1.IndexService", "kvindex.v1.AdminService", "indexer.v1.IndexerService", "grpc.health.v1.Health"} {
		if !slices.Contains(names, want) {
			t.Errorf("reflection lists %v, not %s", names, want)
		}
	}
	code, body := f.get("/readyz")
	if code != 200 || body != "ready\n" {
		t.Errorf("/readyz = %d %q", code, body)
	}
	code, body = f.get("/metrics")
	for _, want := range []string{`kvindex_api_requests_total{api="grpc",code="OK",method="Check"}`, "kvindex_index_nodes ", `kvindex_index_block_results_total{result="stored_attached"}`} {
		if code != 200 || !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

// TestScoreReportsTheAppliedIndex checks that applied_index moves with the
// apply loop and that a score computed after a sync reports at least it.
func TestScoreReportsTheAppliedIndex(t *testing.T) {
	f := newFixture(t, fixtureOptions{engines: defaultEngines[:1]})
	ctx := context.Background()
	before, err := f.index.Score(ctx, &kvindexv1.ScoreRequest{Model: testModel, TokenIds: tokens(0, 8)})
	if err != nil {
		t.Fatal(err)
	}
	f.generate("e0", 0, tokens(0, 9), "")
	after, err := f.index.Score(ctx, &kvindexv1.ScoreRequest{Model: testModel, TokenIds: tokens(0, 8)})
	if err != nil {
		t.Fatal(err)
	}
	if after.AppliedIndex <= before.AppliedIndex || after.Scores[0].MatchedBlocks != 2 || before.Scores[0].MatchedBlocks != 0 {
		t.Errorf("before %v, after %v", before, after)
	}
	code, body := f.postJSON("/kv-cache/hit-rate", map[string]any{"model": testModel, "token_ids": tokens(0, 8)})
	var hr hitRateResponse
	if err := json.Unmarshal([]byte(body), &hr); code != 200 || err != nil || hr.AppliedIndex < after.AppliedIndex {
		t.Errorf("hit-rate applied_index %d < %d: %d %s", hr.AppliedIndex, after.AppliedIndex, code, body)
	}
	var w kvindexv1.WorkersResponse
	_, body = f.get("/workers")
	if err := protojson.Unmarshal([]byte(body), &w); err != nil || w.AppliedIndex < after.AppliedIndex {
		t.Errorf("workers applied_index %d < %d (%v)", w.AppliedIndex, after.AppliedIndex, err)
	}
}

// TestCompatRegisterOfDPRanksIsOneCompareAndSet registers a worker's dp ranks
// through the compatible /register form, ranks 1..3 at once: each is one
// compare-and-set of the worker's spec, so none undoes another, and the
// worker's blocks stay (it used to be unregistered and registered again).
func TestCompatRegisterOfDPRanksIsOneCompareAndSet(t *testing.T) {
	f := newFixture(t, fixtureOptions{engines: []engineSpec{}})
	e := startEngineFor(t, engineSpec{name: "dp4", dp: 4, gpuBlocks: 256})
	spec := workerFlagFor(t, "dp4", e)
	code, body := f.postJSON("/register", map[string]any{"instance_id": "dp4", "model": testModel,
		"endpoint": spec.Endpoint, "replay_endpoint": spec.Replay, "block_size": 4})
	if code != 201 {
		t.Fatalf("POST /register rank 0 = %d %s", code, body)
	}
	f.engines["dp4"] = e
	f.generate("dp4", 0, []uint32{1, 2, 3, 4, 5, 6, 7, 8}, "")
	rank0 := radix.WorkerKey{Worker: "dp4", DPRank: 0}
	before := f.srv.Index().HeldBlocks(rank0)
	if before == 0 {
		t.Fatal("rank 0's blocks were not indexed")
	}

	var wg sync.WaitGroup
	codes := make([]int, 4)
	bodies := make([]string, 4)
	for rank := 1; rank <= 3; rank++ {
		ep, err := workerspec.OffsetEndpoint(spec.Endpoint, uint32(rank))
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			codes[rank], bodies[rank] = f.postJSON("/register", map[string]any{"instance_id": "dp4", "model": testModel,
				"endpoint": ep, "dp_rank": rank})
		}()
	}
	wg.Wait()
	for rank := 1; rank <= 3; rank++ {
		if codes[rank] != 201 {
			t.Errorf("POST /register dp_rank %d = %d %s", rank, codes[rank], bodies[rank])
		}
	}
	workers, err := f.index.Workers(context.Background(), &kvindexv1.WorkersRequest{Model: testModel})
	if err != nil {
		t.Fatal(err)
	}
	if len(workers.Workers) != 1 || workers.Workers[0].Spec.DpSize != 4 {
		t.Fatalf("registry after ranks 1..3 = %v, want dp4 with dp_size 4", workers.Workers)
	}
	if got := f.srv.Index().HeldBlocks(rank0); got != before {
		t.Errorf("rank 0 holds %d blocks after its worker gained ranks, %d before: they must stay", got, before)
	}
	f.generate("dp4", 3, []uint32{9, 9, 9, 9}, "")
	if f.srv.Index().HeldBlocks(radix.WorkerKey{Worker: "dp4", DPRank: 3}) == 0 {
		t.Error("rank 3, registered last, is not followed")
	}
}

// TestDynamoWorkersListingCarriesNumericInstanceIDs: Dynamo's standalone
// indexer registers workers by integer instance_id and lists them with the id
// as a JSON integer (its WorkerId is a u64), so a Dynamo client decoding
// GET /workers?format=dynamo into its own types must read back the ids it
// registered; a worker named by kvindex keeps a string id.
func TestDynamoWorkersListingCarriesNumericInstanceIDs(t *testing.T) {
	f := newFixture(t, fixtureOptions{engines: []engineSpec{}})
	for _, id := range []uint64{7, 1 << 40} {
		code, body := f.postJSON("/register", map[string]any{"instance_id": id, "model_name": testModel,
			"endpoint": "tcp://127.0.0.1:1", "block_size": 4})
		if code != 201 {
			t.Fatalf("POST /register instance_id %d = %d %s", id, code, body)
		}
	}
	code, body := f.postJSON("/register", map[string]any{"instance_id": "w-07", "model_name": testModel,
		"endpoint": "tcp://127.0.0.1:2", "block_size": 4})
	if code != 201 {
		t.Fatalf("POST /register instance_id w-07 = %d %s", code, body)
	}
	code, body = f.get("/workers?format=dynamo")
	if code != 200 {
		t.Fatalf("GET /workers?format=dynamo = %d %s", code, body)
	}
	var raw []struct {
		InstanceID json.RawMessage   `json:"instance_id"`
		Endpoints  map[string]string `json:"endpoints"`
	}
	if err := json.Unmarshal([]byte(body), &raw); err != nil {
		t.Fatalf("not Dynamo's listing: %v\n%s", err, body)
	}
	var numeric []uint64
	var named []string
	for _, w := range raw {
		var n uint64
		if err := json.Unmarshal(w.InstanceID, &n); err == nil {
			numeric = append(numeric, n)
			continue
		}
		var s string
		if err := json.Unmarshal(w.InstanceID, &s); err != nil {
			t.Fatalf("instance_id %s is neither an integer nor a string", w.InstanceID)
		}
		named = append(named, s)
	}
	slices.Sort(numeric)
	if !slices.Equal(numeric, []uint64{7, 1 << 40}) || !slices.Equal(named, []string{"w-07"}) {
		t.Errorf("listed integer ids %v and string ids %q, want [7 %d] and [w-07]:\n%s", numeric, named, uint64(1<<40), body)
	}
}
