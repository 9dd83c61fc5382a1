package server

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"

	indexerv1 "github.com/kvindex/kvindex/api/proto/indexer/v1"
	kvindexv1 "github.com/kvindex/kvindex/api/proto/kvindex/v1"
	"github.com/kvindex/kvindex/internal/kvblock"
	"github.com/kvindex/kvindex/internal/radix"
	"github.com/kvindex/kvindex/internal/tokenize"
	"github.com/kvindex/kvindex/internal/workerspec"
)

// GRPCServer returns a gRPC server with the IndexService, the AdminService,
// the LoadService, the MemberService, llm-d's indexer.v1.IndexerService, the
// health service (reporting health) and reflection registered. creds is nil for plaintext.
func (a *API) GRPCServer(creds credentials.TransportCredentials, healthSrv *health.Server) *grpc.Server {
	opts := []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(a.unaryInterceptor),
		grpc.ChainStreamInterceptor(a.streamInterceptor),
		grpc.MaxRecvMsgSize(int(a.maxBodyBytes)),
		grpc.MaxConcurrentStreams(a.maxStreams),
		// Clients may ping no more often than every KeepaliveMinTime (faster:
		// the connection is closed, GOAWAY too_many_pings); the server pings
		// idle connections itself, so that a dead Watch client frees its slot.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: kvindexv1.KeepaliveMinTime, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: grpcKeepaliveTime, Timeout: grpcKeepaliveTimeout}),
		grpc.ForceServerCodecV2(newServerCodec()), // Score's fast path, scorewire.go
		// Calls run on long-lived workers (when one is free) instead of a new
		// goroutine each, whose stack grew again on every Score (~5 µs of copying).
		grpc.NumStreamWorkers(uint32(runtime.GOMAXPROCS(0))),
	}
	opts = append(opts, kvindexv1.FlowControlServerOptions()...) // no ping per query
	if creds != nil {
		opts = append(opts, grpc.Creds(creds))
	}
	s := grpc.NewServer(opts...)
	s.RegisterService(&indexServiceDesc, indexService{a: a}) // kvindexv1.RegisterIndexServiceServer with the fast path
	kvindexv1.RegisterAdminServiceServer(s, adminService{a: a})
	indexerv1.RegisterIndexerServiceServer(s, llmdService{a: a})
	kvindexv1.RegisterLoadServiceServer(s, loadService{a: a})
	kvindexv1.RegisterMemberServiceServer(s, memberService{a: a})
	healthpb.RegisterHealthServer(s, healthSrv)
	reflection.Register(s)
	return s
}

// Keepalive: when the server pings a silent connection and how long it waits
// for the answer (the shortest ping interval a client may use is
// kvindexv1.KeepaliveMinTime, a contract with the clients).
const (
	grpcKeepaliveTime    = time.Minute
	grpcKeepaliveTimeout = 20 * time.Second
)

// authorizeCall checks a gRPC call against methodAccess.
func (a *API) authorizeCall(ctx context.Context, method string) error {
	var auth string
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		if v := md.Get("authorization"); len(v) > 0 {
			auth = v[0]
		}
	}
	return a.authorize(methodAccess(method), auth)
}

func (a *API) unaryInterceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	start := time.Now()
	var resp any
	err := a.authorizeCall(ctx, info.FullMethod)
	if err == nil {
		resp, err = handler(ctx, req)
	}
	err = grpcError(err)
	a.metrics.observe("grpc", path.Base(info.FullMethod), status.Code(err).String(), start)
	return resp, err
}

func (a *API) streamInterceptor(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	start := time.Now()
	err := a.authorizeCall(ss.Context(), info.FullMethod)
	if err == nil {
		err = handler(srv, ss)
	}
	err = grpcError(err)
	a.metrics.observe("grpc", path.Base(info.FullMethod), status.Code(err).String(), start)
	return err
}

// indexService implements kvindex.v1.IndexService.
type indexService struct {
	kvindexv1.UnimplementedIndexServiceServer
	a *API
}

// Score is the generated-type form of Score, for REST; gRPC calls take
// scoreHandler's path (scorewire.go) to the same scoreResult.
func (s indexService) Score(ctx context.Context, req *kvindexv1.ScoreRequest) (*kvindexv1.ScoreResponse, error) {
	res, err := s.scoreResult(ctx, req)
	if err != nil {
		return nil, err
	}
	defer res.release()
	return res.proto(), nil
}

func (s indexService) scoreResult(ctx context.Context, req *kvindexv1.ScoreRequest) (*scoreResult, error) {
	q, err := scoreQueryFromProto(req)
	if err != nil {
		return nil, err
	}
	return s.a.score(ctx, q)
}

func scoreQueryFromProto(req *kvindexv1.ScoreRequest) (*scoreQuery, error) {
	q := &scoreQuery{
		model: req.Model, lora: req.LoraName, salt: req.CacheSalt, blockSize: int(req.GetBlockSize()),
		tokens: req.TokenIds, hasTokens: len(req.TokenIds) > 0, linearizable: isLinearizable(req.Consistency),
	}
	if req.BlockSize != nil && req.GetBlockSize() == 0 {
		return nil, invalidArg("block_size=0 must be between 1 and %d", maxBlockSize)
	}
	if req.Text != "" {
		q.text = &req.Text
	}
	if len(req.Messages) > 0 {
		q.messages = messagesFromProto(req.Messages)
		q.chat.AddGenerationPrompt = req.AddGenerationPrompt == nil || *req.AddGenerationPrompt
		if req.ToolsJson != "" {
			if err := json.Unmarshal([]byte(req.ToolsJson), &q.chat.Tools); err != nil {
				return nil, invalidArg("tools_json: %v", err)
			}
		}
		if req.ChatTemplateKwargsJson != "" {
			if err := json.Unmarshal([]byte(req.ChatTemplateKwargsJson), &q.chat.Kwargs); err != nil {
				return nil, invalidArg("chat_template_kwargs_json: want a JSON object: %v", err)
			}
		}
	}
	if len(req.Workers) > 0 {
		q.workers = req.Workers
	}
	return q, nil
}

func isLinearizable(c kvindexv1.Consistency) bool {
	return c == kvindexv1.Consistency_CONSISTENCY_LINEARIZABLE
}

func messagesFromProto(in []*kvindexv1.ChatMessage) []tokenize.Message {
	out := make([]tokenize.Message, len(in))
	for i, m := range in {
		msg := tokenize.Message{Role: m.Role, Content: m.Content, Name: m.Name, ToolCallID: m.ToolCallId}
		if m.ReasoningContent != "" {
			msg.Reasoning = &m.ReasoningContent
		}
		for _, tc := range m.ToolCalls {
			call := tokenize.ToolCall{ID: tc.Id, Type: tc.Type}
			if tc.Function != nil {
				call.Function = tokenize.FunctionCall{Name: tc.Function.Name, Arguments: tc.Function.Arguments}
			}
			msg.ToolCalls = append(msg.ToolCalls, call)
		}
		out[i] = msg
	}
	return out
}

// proto shapes a result as a kvindex.v1.ScoreResponse.
func (r *scoreResult) proto() *kvindexv1.ScoreResponse {
	return &kvindexv1.ScoreResponse{
		Model: r.model, BlockSize: uint32(r.blockSize), PromptTokens: uint32(r.promptTokens),
		TotalBlocks: uint32(r.totalBlocks), AppliedIndex: r.applied, Scores: r.workerScores(),
	}
}

func (r *scoreResult) workerScores() []*kvindexv1.WorkerScore {
	// One allocation for all scores and one for all ranks: a response lists
	// every candidate worker, and this is the hot path.
	scores := make([]kvindexv1.WorkerScore, len(r.workers))
	ranks := 0
	for i := range r.workers {
		ranks += len(r.workers[i].ranks)
	}
	rankScores := make([]kvindexv1.DpRankScore, ranks)
	rankPtrs := make([]*kvindexv1.DpRankScore, ranks)
	out := make([]*kvindexv1.WorkerScore, len(r.workers))
	bs := uint32(r.blockSize)
	for i := range r.workers {
		w := &r.workers[i]
		ws := &scores[i]
		ws.Worker, ws.MatchedBlocks, ws.MatchedTokens = w.id, uint32(w.blocks), uint32(w.blocks)*bs
		ws.HitRate = hitRate(w.blocks, r.totalBlocks)
		ws.GpuMatchedBlocks = uint32(w.perTier[radix.TierGPU])
		ws.CpuMatchedBlocks = uint32(w.perTier[radix.TierCPU])
		ws.DiskMatchedBlocks = uint32(w.perTier[radix.TierDisk])
		if n := len(w.ranks); n > 0 {
			ws.DpRanks, rankPtrs = rankPtrs[:n:n], rankPtrs[n:]
			for j, rk := range w.ranks {
				d := &rankScores[0]
				rankScores = rankScores[1:]
				d.DpRank, d.MatchedBlocks, d.MatchedTokens = rk.rank, uint32(rk.blocks), uint32(rk.blocks)*bs
				d.GpuMatchedBlocks = uint32(rk.perTier[radix.TierGPU])
				d.CpuMatchedBlocks = uint32(rk.perTier[radix.TierCPU])
				d.DiskMatchedBlocks = uint32(rk.perTier[radix.TierDisk])
				ws.DpRanks[j] = d
			}
		}
		out[i] = ws
	}
	return out
}

func hitRate(matched, total int) float64 {
	if total == 0 {
		return 0
	}
	return float64(matched) / float64(total)
}

// QueryByHash is the generated-type form of QueryByHash, for REST; gRPC calls
// take queryByHashHandler's path (scorewire.go) to the same scoreResult.
func (s indexService) QueryByHash(ctx context.Context, req *kvindexv1.QueryByHashRequest) (*kvindexv1.QueryByHashResponse, error) {
	res, err := s.queryByHashResult(ctx, req)
	if err != nil {
		return nil, err
	}
	defer res.release()
	return &kvindexv1.QueryByHashResponse{
		Model: res.model, BlockSize: uint32(res.blockSize), TotalBlocks: uint32(res.totalBlocks),
		AppliedIndex: res.applied, Scores: res.workerScores(),
	}, nil
}

func (s indexService) queryByHashResult(ctx context.Context, req *kvindexv1.QueryByHashRequest) (*scoreResult, error) {
	if req.HashKind != kvindexv1.BlockHashKind_BLOCK_HASH_KIND_LOCAL {
		return nil, errSequenceHashes
	}
	q := &scoreQuery{
		model: req.Model, lora: req.LoraName, salt: req.CacheSalt, localKeys: req.BlockHashes, byHash: true,
		linearizable: isLinearizable(req.Consistency),
	}
	if len(req.Workers) > 0 {
		q.workers = req.Workers
	}
	res, err := s.a.score(ctx, q)
	if err != nil {
		return nil, err
	}
	if req.MatchedOnly {
		res.workers = res.workers[:res.matched()]
	}
	return res, nil
}

// errSequenceHashes answers lookups by sequence (chained) hashes: the index is
// keyed by local keys under their parent, and a chained hash cannot be turned
// back into the local key of its block without a table of every block's
// sequence hash, which the index does not keep.
var errSequenceHashes = fmt.Errorf("%w: lookups by sequence (chained) block hashes; send the local block hashes with hash_kind BLOCK_HASH_KIND_LOCAL (Dynamo's /query_by_hash form)", ErrNotSupported)

func (s indexService) Workers(ctx context.Context, req *kvindexv1.WorkersRequest) (*kvindexv1.WorkersResponse, error) {
	return s.a.workers(ctx, req.Model, isLinearizable(req.Consistency))
}

// workers lists the registered workers (of model, when set) with their block
// counts per tier.
func (a *API) workers(ctx context.Context, model string, linearizable bool) (*kvindexv1.WorkersResponse, error) {
	if linearizable {
		if err := a.backend.Linearizable(ctx); err != nil {
			return nil, err
		}
	}
	applied := a.backend.AppliedIndex()
	list, err := a.backend.Workers(ctx)
	if err != nil {
		return nil, err
	}
	list = slices.DeleteFunc(list, func(w WorkerStatus) bool { return model != "" && w.Spec.Model != model })
	ids := make([]string, len(list))
	for i, w := range list {
		ids[i] = w.Spec.ID
	}
	stats := a.backend.Index().HolderStats(ids)
	resp := &kvindexv1.WorkersResponse{AppliedIndex: applied, Workers: make([]*kvindexv1.WorkerInfo, len(list))}
	h := 0
	for i, w := range list {
		info := &kvindexv1.WorkerInfo{Spec: specProto(w.Spec), State: w.State,
			EffectiveBlockSize: uint32(cmp.Or(w.Spec.BlockSize, a.defaultBlockSize))}
		ranks := map[uint32]*kvindexv1.DpRankStatus{}
		rank := func(r uint32) *kvindexv1.DpRankStatus {
			if ranks[r] == nil {
				ranks[r] = &kvindexv1.DpRankStatus{DpRank: r}
			}
			return ranks[r]
		}
		for _, rs := range w.Ranks {
			rank(rs.DPRank).LastSeq = rs.LastSeq
		}
		for ; h < len(stats) && stats[h].Worker.Worker < w.Spec.ID; h++ {
		}
		for ; h < len(stats) && stats[h].Worker.Worker == w.Spec.ID; h++ {
			st := &stats[h]
			r := rank(st.Worker.DPRank)
			r.GpuBlocks, r.CpuBlocks, r.DiskBlocks = uint64(st.PerTier[radix.TierGPU]), uint64(st.PerTier[radix.TierCPU]), uint64(st.PerTier[radix.TierDisk])
			info.GpuBlocks += r.GpuBlocks
			info.CpuBlocks += r.CpuBlocks
			info.DiskBlocks += r.DiskBlocks
			r.DetachedBlocks = uint64(st.Detached)
			info.DetachedBlocks += r.DetachedBlocks
		}
		for _, r := range ranks {
			info.DpRanks = append(info.DpRanks, r)
		}
		slices.SortFunc(info.DpRanks, func(x, y *kvindexv1.DpRankStatus) int { return int(x.DpRank) - int(y.DpRank) })
		resp.Workers[i] = info
	}
	return resp, nil
}

func (s indexService) Stats(context.Context, *kvindexv1.StatsRequest) (*kvindexv1.StatsResponse, error) {
	return s.a.stats(), nil
}

func (a *API) stats() *kvindexv1.StatsResponse {
	applied := a.backend.AppliedIndex()
	st := a.backend.Index().Stats()
	digest, digestApplied := a.backend.Digest()
	return &kvindexv1.StatsResponse{
		Nodes: uint64(st.Nodes), Residencies: uint64(st.Residencies), Workers: uint32(st.Workers),
		Namespaces: uint32(st.Namespaces), AppliedIndex: applied, Counters: indexCounters(st),
		IndexDigest: digest, DigestAppliedIndex: digestApplied,
	}
}

// maxChangesPerMessage bounds the changes of one Watch or Dump message.
const maxChangesPerMessage = 4096

// Watch streams the changes applied from now on (or after an applied index).
// A client that stops reading is ended once one message could not be sent for
// the write timeout (sendstall.go): it would hold its --max-watch-streams slot
// and its subscription's buffer for as long as its connection lives.
func (s indexService) Watch(req *kvindexv1.WatchRequest, stream grpc.ServerStreamingServer[kvindexv1.WatchResponse]) error {
	release, err := s.a.watches.acquire("Watch")
	if err != nil {
		return err
	}
	defer release()
	sub, err := s.a.backend.Changes().Subscribe(req.Workers, req.Model, req.GetAfterAppliedIndex(), req.AfterAppliedIndex != nil)
	if err != nil {
		return err
	}
	defer sub.Close()
	// Headers go out now, so a client knows the subscription exists before the
	// first change arrives, and where it starts (for resuming).
	if err := stream.SendHeader(metadata.Pairs(kvindexv1.WatchFromKey, strconv.FormatUint(sub.From(), 10))); err != nil {
		return err
	}
	return runSending(s.a.sendStall(), "watch", func(w *sendWatch) error {
		return watchLoop(stream, sub, w)
	})
}

// watchLoop sends the subscription's batches, as many as are waiting in one
// message, until the stream or the subscription ends.
func watchLoop(stream grpc.ServerStreamingServer[kvindexv1.WatchResponse], sub *Subscription, w *sendWatch) error {
	ctx := stream.Context()
	for {
		var batch []*kvindexv1.IndexChange
		select {
		case <-ctx.Done():
			return ctx.Err()
		case b, ok := <-sub.C():
			if !ok {
				err := sub.Err()
				if errors.Is(err, ErrWatchLagging) {
					return fmt.Errorf("%w: more than %d batches of changes were waiting; resume after the last applied_index received, or start over (Dump, then Watch)", err, cap(sub.c))
				}
				return err
			}
			batch = b
		}
	drain: // send what else is waiting in the same message
		for len(batch) < maxChangesPerMessage {
			select {
			case b, ok := <-sub.C():
				if !ok {
					break drain
				}
				batch = append(batch, b...)
			default:
				break drain
			}
		}
		if err := w.send(func() error { return stream.Send(&kvindexv1.WatchResponse{Changes: batch}) }); err != nil {
			return err
		}
	}
}

// Dump streams the index. A client that stops reading is ended as a Watch's
// is (sendstall.go): it would hold the one dump slot.
func (s indexService) Dump(req *kvindexv1.DumpRequest, stream grpc.ServerStreamingServer[kvindexv1.DumpResponse]) error {
	return runSending(s.a.sendStall(), "dump", func(w *sendWatch) error {
		return s.a.dump(stream.Context(), req, func(m *kvindexv1.DumpResponse) error {
			return w.send(func() error { return stream.Send(m) })
		})
	})
}

// sendStall is how long one message of a server stream may wait for its client.
func (a *API) sendStall() time.Duration { return cmp.Or(a.writeTimeout, defaultSendStall) }

// dump sends the index as STORED changes, in messages of at most
// maxChangesPerMessage changes (at least one message).
func (a *API) dump(ctx context.Context, req *kvindexv1.DumpRequest, send func(*kvindexv1.DumpResponse) error) error {
	release, err := a.dumps.acquire()
	if err != nil {
		return err
	}
	defer release()
	var keep func(worker string) bool
	if len(req.Workers) > 0 || req.Model != "" {
		view, err := a.view.get(ctx)
		if err != nil {
			return err
		}
		keep = func(worker string) bool {
			if len(req.Workers) > 0 && !slices.Contains(req.Workers, worker) {
				return false
			}
			w := view.byID[worker]
			return req.Model == "" || (w != nil && w.model == req.Model)
		}
	}
	// One copy of the index, taken between two applied writes, gives both the
	// nodes and their applied index; walking it holds no lock.
	snap, applied := a.backend.IndexCopy()
	nodes := snap.Nodes()
	seqs := make([]uint64, len(nodes))
	nsOf := make([]uint64, len(nodes))
	msg := &kvindexv1.DumpResponse{AppliedIndex: applied}
	sent := false
	for i, n := range nodes {
		if n.Parent < 0 {
			nsOf[i] = n.Key
			continue
		}
		parent := nodes[n.Parent]
		nsOf[i] = nsOf[n.Parent]
		var parentSeq *uint64
		if parent.Parent < 0 {
			seqs[i] = n.Key
		} else {
			p := seqs[n.Parent]
			parentSeq = &p
			seqs[i] = kvblock.NextChainHash(p, n.Key)
		}
		for _, h := range n.Holders {
			if keep != nil && !keep(h.Worker.Worker) {
				continue
			}
			for t := range radix.Tier(radix.NumTiers) {
				if h.Tiers&(1<<t) == 0 {
					continue
				}
				c := a.backend.Changes().change(h.Worker, kvindexv1.ChangeKind_CHANGE_KIND_STORED, nsOf[i], t)
				c.SequenceHashes, c.LocalHashes, c.ParentSequenceHash, c.AppliedIndex = []uint64{seqs[i]}, []uint64{n.Key}, parentSeq, applied
				msg.Changes = append(msg.Changes, c)
			}
		}
		if len(msg.Changes) >= maxChangesPerMessage {
			if err := ctx.Err(); err != nil {
				return err
			}
			if err := send(msg); err != nil {
				return err
			}
			sent = true
			msg = &kvindexv1.DumpResponse{AppliedIndex: applied}
		}
	}
	if len(msg.Changes) > 0 || !sent {
		return send(msg)
	}
	return nil
}

// adminService implements kvindex.v1.AdminService.
type adminService struct {
	kvindexv1.UnimplementedAdminServiceServer
	a *API
}

func (s adminService) RegisterWorker(ctx context.Context, req *kvindexv1.RegisterWorkerRequest) (*kvindexv1.RegisterWorkerResponse, error) {
	if req.Worker == nil {
		return nil, invalidArg("worker is required")
	}
	spec, err := specFromProto(req.Worker)
	if err != nil {
		return nil, err
	}
	var applied uint64
	if req.Expected != nil {
		expected, perr := specFromProto(req.Expected)
		if perr != nil {
			return nil, fmt.Errorf("expected: %w", perr)
		}
		applied, err = s.a.replaceWorker(ctx, expected, spec)
	} else {
		applied, err = s.a.registerWorker(ctx, spec)
	}
	if err != nil {
		return nil, err
	}
	return &kvindexv1.RegisterWorkerResponse{Worker: &kvindexv1.WorkerInfo{Spec: specProto(spec)}, AppliedIndex: applied}, nil
}

func (a *API) registerWorker(ctx context.Context, spec workerspec.Spec) (uint64, error) {
	if err := checkNames("worker id", spec.ID, "model", spec.Model); err != nil {
		return 0, err
	}
	if err := spec.Validate(); err != nil {
		return 0, err
	}
	applied, err := a.backend.RegisterWorker(ctx, spec)
	a.view.invalidate()
	return applied, err
}

func (a *API) replaceWorker(ctx context.Context, expected, spec workerspec.Spec) (uint64, error) {
	if err := checkNames("worker id", spec.ID, "model", spec.Model); err != nil {
		return 0, err
	}
	if expected.ID != spec.ID {
		return 0, invalidArg("expected.id %q differs from worker.id %q: a replacement keeps the id", expected.ID, spec.ID)
	}
	if err := spec.Validate(); err != nil {
		return 0, err
	}
	applied, err := a.backend.ReplaceWorker(ctx, expected, spec)
	a.view.invalidate()
	return applied, err
}

func (a *API) unregisterWorker(ctx context.Context, id string) (uint64, error) {
	if id == "" {
		return 0, invalidArg("worker_id is required")
	}
	if err := checkNames("worker_id", id); err != nil {
		return 0, err
	}
	applied, err := a.backend.UnregisterWorker(ctx, id)
	a.view.invalidate()
	return applied, err
}

func (s adminService) UnregisterWorker(ctx context.Context, req *kvindexv1.UnregisterWorkerRequest) (*kvindexv1.UnregisterWorkerResponse, error) {
	applied, err := s.a.unregisterWorker(ctx, req.WorkerId)
	if err != nil {
		return nil, err
	}
	return &kvindexv1.UnregisterWorkerResponse{AppliedIndex: applied}, nil
}

func (s adminService) Join(ctx context.Context, req *kvindexv1.JoinRequest) (*kvindexv1.JoinResponse, error) {
	if req.NodeId == "" || req.RaftAddr == "" {
		return nil, invalidArg("node_id and raft_addr are required")
	}
	if err := checkAddrs("raft_addr", req.RaftAddr, "grpc_addr", req.GrpcAddr); err != nil {
		return nil, err
	}
	applied, err := s.a.backend.Join(ctx, JoinRequest{
		NodeID: req.NodeId, RaftAddr: req.RaftAddr, GRPCAddr: req.GrpcAddr,
		Voter: req.Suffrage != kvindexv1.Suffrage_SUFFRAGE_NONVOTER,
	})
	if err != nil {
		return nil, err
	}
	return &kvindexv1.JoinResponse{AppliedIndex: applied}, nil
}

func (s adminService) Leave(ctx context.Context, req *kvindexv1.LeaveRequest) (*kvindexv1.LeaveResponse, error) {
	if req.NodeId == "" {
		return nil, invalidArg("node_id is required")
	}
	applied, err := s.a.backend.Leave(ctx, req.NodeId)
	if err != nil {
		return nil, err
	}
	return &kvindexv1.LeaveResponse{AppliedIndex: applied}, nil
}

func (s adminService) Cluster(ctx context.Context, req *kvindexv1.ClusterRequest) (*kvindexv1.ClusterResponse, error) {
	return s.a.cluster(ctx, !req.WithoutDigest)
}

func (a *API) cluster(ctx context.Context, withDigest bool) (*kvindexv1.ClusterResponse, error) {
	cs, err := a.backend.Cluster(ctx, withDigest)
	if err != nil {
		return nil, err
	}
	resp := &kvindexv1.ClusterResponse{
		Leader: cs.LeaderID, Term: cs.Term, CommitIndex: cs.CommitIndex, AppliedIndex: cs.AppliedIndex, NodeId: cs.NodeID,
		IndexDigest: cs.Digest, DigestAppliedIndex: cs.DigestApplied,
	}
	for _, m := range cs.Members {
		suffrage := kvindexv1.Suffrage_SUFFRAGE_VOTER
		if !m.Voter {
			suffrage = kvindexv1.Suffrage_SUFFRAGE_NONVOTER
		}
		resp.Members = append(resp.Members, &kvindexv1.ClusterMember{
			Id: m.ID, RaftAddr: m.RaftAddr, GrpcAddr: m.GRPCAddr, Suffrage: suffrage,
			AppliedIndex: m.AppliedIndex, IsLeader: m.IsLeader, IndexDigest: m.Digest, DigestAppliedIndex: m.DigestApplied,
		})
	}
	return resp, nil
}

func (s adminService) Snapshot(ctx context.Context, _ *kvindexv1.SnapshotRequest) (*kvindexv1.SnapshotResponse, error) {
	info, err := s.a.backend.Snapshot(ctx)
	if err != nil {
		return nil, err
	}
	return &kvindexv1.SnapshotResponse{Index: info.Index, SizeBytes: info.SizeBytes}, nil
}

// llmdService implements llm-d's indexer.v1.IndexerService.
type llmdService struct {
	indexerv1.UnimplementedIndexerServiceServer
	a *API
}

func (s llmdService) GetPodScores(ctx context.Context, req *indexerv1.GetPodScoresRequest) (*indexerv1.GetPodScoresResponse, error) {
	q := &scoreQuery{model: req.ModelName, text: &req.Prompt}
	if len(req.PodIdentifiers) > 0 {
		q.workers = req.PodIdentifiers
	}
	res, err := s.a.score(ctx, q)
	if err != nil {
		return nil, err
	}
	return &indexerv1.GetPodScoresResponse{Scores: res.podScores()}, nil
}

// podScores shapes a result as llm-d's scores: one per worker, or one per dp
// rank for workers with several, highest first.
func (r *scoreResult) podScores() []*indexerv1.PodScore {
	var out []*indexerv1.PodScore
	for _, w := range r.workers {
		if len(w.ranks) <= 1 {
			out = append(out, &indexerv1.PodScore{Pod: w.id, Score: float64(w.blocks)})
			continue
		}
		for _, rk := range w.ranks {
			rank := int32(rk.rank)
			out = append(out, &indexerv1.PodScore{Pod: w.id, Score: float64(rk.blocks), DataParallelRank: &rank})
		}
	}
	slices.SortStableFunc(out, func(x, y *indexerv1.PodScore) int {
		switch {
		case x.Score > y.Score:
			return -1
		case x.Score < y.Score:
			return 1
		}
		return strings.Compare(x.Pod, y.Pod)
	})
	return out
}

var workerRoleNames = map[kvindexv1.WorkerRole]string{
	kvindexv1.WorkerRole_WORKER_ROLE_UNSPECIFIED: "",
	kvindexv1.WorkerRole_WORKER_ROLE_AGGREGATED:  "aggregated",
	kvindexv1.WorkerRole_WORKER_ROLE_PREFILL:     "prefill",
	kvindexv1.WorkerRole_WORKER_ROLE_DECODE:      "decode",
}

func specFromProto(p *kvindexv1.WorkerSpec) (workerspec.Spec, error) {
	role, ok := workerRoleNames[p.Role]
	if !ok {
		return workerspec.Spec{}, invalidArg("worker.role: unknown role %d", p.Role)
	}
	if p.BlockSize > maxBlockSize || p.DpSize > 1<<20 {
		return workerspec.Spec{}, invalidArg("worker %q: block_size=%d or dp_size=%d out of range", p.Id, p.BlockSize, p.DpSize)
	}
	spec := workerspec.Spec{
		ID: p.Id, Model: p.Model, BlockSize: int(p.BlockSize), DPSize: int(p.DpSize),
		Endpoint: p.EventsEndpoint, Topic: p.EventsTopic, Replay: p.ReplayEndpoint, HTTP: p.HttpEndpoint,
		Role: role, Labels: p.Labels,
	}
	if len(spec.Labels) == 0 {
		spec.Labels = nil
	}
	return spec, nil
}
