package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	kvindexv1 "github.com/kvindex/kvindex/api/proto/kvindex/v1"
	kvindex "github.com/kvindex/kvindex/clients/go"
	"github.com/kvindex/kvindex/internal/envflag"
)

// envPrefix prefixes kvctl's environment variables: --addr is
// KVINDEX_KVCTL_ADDR. Not the indexer's KVINDEX_: kvctl run where the indexer's
// variables are set (its container) would take KVINDEX_TLS_CERT, the server's
// certificate, as its client certificate, KVINDEX_BLOCK_SIZE as its own.
const envPrefix = "KVINDEX_KVCTL_"

const synopsis = `usage: kvctl <command> [flags]

Commands:
  score       how much of a prompt each worker caches (--model M and --text "..." or --tokens 1,2,3)
  workers     registered workers, their streams and cached blocks
  cluster     raft members, leader, progress and index digests
  stats       index size and counters
  dump        every cached block (STORED changes), parents first
  register    add a worker (--id, --model, --endpoint, ...; needs --admin-token when the indexer has one)
  unregister  remove a worker and its blocks (--id)

Every command takes the common flags below; "kvctl <command> --help" lists its own.`

// errUsage: bad command-line use; the message was printed.
var errUsage = errors.New("usage")

// common are the flags every command takes.
type common struct {
	addr, adminToken       string
	o, output              string // -o wins over --output (KVINDEX_OUTPUT)
	tlsCA, tlsCert, tlsKey string
	tlsServerName          string
	timeout                time.Duration
}

func (c *common) register(fs *flag.FlagSet) {
	fs.StringVar(&c.addr, "addr", "127.0.0.1:7070", "gRPC `host:port` of the indexer; several members comma-separated")
	fs.StringVar(&c.o, "o", "", "output: table or json (short for --output)")
	fs.StringVar(&c.output, "output", "table", "output: table or json")
	fs.StringVar(&c.adminToken, "admin-token", "", "bearer `token` for register and unregister")
	fs.StringVar(&c.tlsCA, "tls-ca", "", "PEM CA `file` to verify the indexer with (enables TLS)")
	fs.StringVar(&c.tlsCert, "tls-cert", "", "PEM client certificate `file` for mTLS (with --tls-key)")
	fs.StringVar(&c.tlsKey, "tls-key", "", "PEM client key `file` for mTLS")
	fs.StringVar(&c.tlsServerName, "tls-server-name", "", "server name to verify instead of the address's host")
	fs.DurationVar(&c.timeout, "timeout", 10*time.Second, "deadline of one command")
}

func (c *common) client() (*kvindex.Client, error) {
	opts := kvindex.Options{AdminToken: c.adminToken}
	for _, a := range strings.Split(c.addr, ",") {
		if a = strings.TrimSpace(a); a != "" {
			opts.Addrs = append(opts.Addrs, a)
		}
	}
	if c.tlsCA != "" || c.tlsCert != "" {
		cfg, err := kvindex.ClientTLS(c.tlsCA, c.tlsCert, c.tlsKey, c.tlsServerName)
		if err != nil {
			return nil, fmt.Errorf("--tls-ca/--tls-cert/--tls-key: %w", err)
		}
		opts.TLS = cfg
	}
	return kvindex.New(opts)
}

// command is one kvctl subcommand: its flags and what it does.
type command struct {
	summary string
	flags   func(fs *flag.FlagSet) func(ctx context.Context, c *kvindex.Client, out *printer) error
}

var commands = map[string]command{
	"score":      {"score a prompt", scoreCmd},
	"workers":    {"list workers", workersCmd},
	"cluster":    {"show the cluster", clusterCmd},
	"stats":      {"show index statistics", statsCmd},
	"dump":       {"dump the index", dumpCmd},
	"register":   {"register a worker", registerCmd},
	"unregister": {"unregister a worker", unregisterCmd},
}

// run is kvctl: it returns the process exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, lookup func(string) (string, bool)) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		var c common
		fs := flag.NewFlagSet("kvctl", flag.ContinueOnError)
		fs.SetOutput(stderr)
		c.register(fs)
		envflag.Usage(fs, envPrefix, synopsis)()
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	cmd, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "kvctl: unknown command %q\n\n%s\n", args[0], synopsis)
		return 2
	}
	fs := flag.NewFlagSet("kvctl "+args[0], flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c common
	c.register(fs)
	action := cmd.flags(fs)
	fs.Usage = envflag.Usage(fs, envPrefix, "usage: kvctl "+args[0]+" [flags]: "+cmd.summary)
	if err := envflag.Parse(fs, envPrefix, args[1:], lookup); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(stderr, "kvctl:", err)
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "kvctl %s: unexpected argument %q\n", args[0], fs.Arg(0))
		return 2
	}
	if c.o != "" {
		c.output = c.o
	}
	if c.output != "table" && c.output != "json" {
		fmt.Fprintf(stderr, "kvctl: -o %q: want table or json\n", c.output)
		return 2
	}
	client, err := c.client()
	if err != nil {
		fmt.Fprintln(stderr, "kvctl:", err)
		return 2
	}
	defer client.Close()
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	out := &printer{w: stdout, json: c.output == "json"}
	if err := action(ctx, client, out); err != nil {
		if errors.Is(err, errUsage) {
			return 2
		}
		if st, isStatus := status.FromError(err); isStatus {
			fmt.Fprintf(stderr, "kvctl %s: %s: %s\n", args[0], st.Code(), st.Message())
		} else {
			fmt.Fprintf(stderr, "kvctl %s: %v\n", args[0], err)
		}
		return 1
	}
	return 0
}

// printer writes JSON (protojson, snake_case names) or tables.
type printer struct {
	w    io.Writer
	json bool
}

func (p *printer) proto(m proto.Message) error {
	data, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(m)
	if err != nil {
		return err
	}
	// protojson varies its whitespace on purpose; indent with encoding/json so
	// the output is stable for scripts that diff it.
	var buf bytes.Buffer
	if err := json.Indent(&buf, data, "", "  "); err != nil {
		return err
	}
	buf.WriteByte('\n')
	_, err = p.w.Write(buf.Bytes())
	return err
}

func (p *printer) table(header string, rows [][]string) error {
	tw := tabwriter.NewWriter(p.w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, header)
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	return tw.Flush()
}

func u(v uint64) string { return strconv.FormatUint(v, 10) }

func usageError(fs *flag.FlagSet, format string, args ...any) error {
	fmt.Fprintf(fs.Output(), "kvctl %s: %s\n", strings.TrimPrefix(fs.Name(), "kvctl "), fmt.Sprintf(format, args...))
	return errUsage
}

func scoreCmd(fs *flag.FlagSet) func(context.Context, *kvindex.Client, *printer) error {
	req := &kvindexv1.ScoreRequest{}
	var tokens, workers string
	var blockSize uint32
	var linearizable bool
	fs.StringVar(&req.Model, "model", "", "model of the prompt (required)")
	fs.StringVar(&req.Text, "text", "", "the prompt as text, tokenized by the indexer")
	fs.StringVar(&tokens, "tokens", "", "the prompt as comma-separated token ids")
	fs.StringVar(&req.LoraName, "lora", "", "LoRA adapter name")
	fs.StringVar(&req.CacheSalt, "cache-salt", "", "cache salt")
	fs.Var(envflag.Uint32{V: &blockSize}, "block-size", "tokens per block (default: the model's workers')")
	fs.StringVar(&workers, "workers", "", "comma-separated worker ids to score (default: every worker of the model)")
	fs.BoolVar(&linearizable, "linearizable", false, "read the leader's latest state instead of the member's")
	return func(ctx context.Context, c *kvindex.Client, out *printer) error {
		if req.Model == "" {
			return usageError(fs, "--model is required")
		}
		if (req.Text == "") == (tokens == "") {
			return usageError(fs, "give one of --text and --tokens")
		}
		for _, t := range envflag.SplitList(tokens) {
			id, err := strconv.ParseUint(t, 10, 32)
			if err != nil {
				return usageError(fs, "--tokens: %q is not a token id", t)
			}
			req.TokenIds = append(req.TokenIds, uint32(id))
		}
		if blockSize > 0 {
			req.BlockSize = &blockSize
		}
		req.Workers = envflag.SplitList(workers)
		if linearizable {
			req.Consistency = kvindexv1.Consistency_CONSISTENCY_LINEARIZABLE
		}
		resp, err := c.Score(ctx, req)
		if err != nil {
			return err
		}
		if out.json {
			return out.proto(resp)
		}
		fmt.Fprintf(out.w, "model %s, %d tokens, %d blocks of %d, applied index %d\n",
			resp.Model, resp.PromptTokens, resp.TotalBlocks, resp.BlockSize, resp.AppliedIndex)
		var rows [][]string
		for _, s := range resp.Scores {
			ranks := make([]string, len(s.DpRanks))
			for i, r := range s.DpRanks {
				ranks[i] = fmt.Sprintf("%d:%d", r.DpRank, r.MatchedBlocks)
			}
			rows = append(rows, []string{s.Worker, u(uint64(s.MatchedBlocks)), u(uint64(s.MatchedTokens)),
				fmt.Sprintf("%.3f", s.HitRate), u(uint64(s.GpuMatchedBlocks)), u(uint64(s.CpuMatchedBlocks)),
				u(uint64(s.DiskMatchedBlocks)), strings.Join(ranks, " ")})
		}
		return out.table("WORKER\tBLOCKS\tTOKENS\tHIT RATE\tGPU\tCPU\tDISK\tDP RANK:BLOCKS", rows)
	}
}

func workersCmd(fs *flag.FlagSet) func(context.Context, *kvindex.Client, *printer) error {
	var model string
	fs.StringVar(&model, "model", "", "only workers of this model")
	return func(ctx context.Context, c *kvindex.Client, out *printer) error {
		resp, err := c.Workers(ctx, model)
		if err != nil {
			return err
		}
		if out.json {
			return out.proto(resp)
		}
		var rows [][]string
		for _, w := range resp.Workers {
			seqs := make([]string, len(w.DpRanks))
			for i, r := range w.DpRanks {
				seqs[i] = fmt.Sprintf("%d:%d", r.DpRank, r.LastSeq)
			}
			state := strings.ToLower(strings.TrimPrefix(w.State.String(), "WORKER_STATE_"))
			role := strings.ToLower(strings.TrimPrefix(w.Spec.Role.String(), "WORKER_ROLE_"))
			if w.Spec.Role == kvindexv1.WorkerRole_WORKER_ROLE_UNSPECIFIED {
				role = "aggregated"
			}
			blockSize := cmp.Or(w.Spec.BlockSize, w.EffectiveBlockSize) // the indexer's --block-size when the spec gives none
			rows = append(rows, []string{w.Spec.Id, w.Spec.Model, u(uint64(blockSize)), role, state,
				u(w.GpuBlocks), u(w.CpuBlocks), u(w.DiskBlocks), u(w.DetachedBlocks), strings.Join(seqs, " "), w.Spec.EventsEndpoint})
		}
		return out.table("ID\tMODEL\tBLOCK SIZE\tROLE\tSTATE\tGPU\tCPU\tDISK\tDETACHED\tDP RANK:SEQ\tEVENTS", rows)
	}
}

func clusterCmd(*flag.FlagSet) func(context.Context, *kvindex.Client, *printer) error {
	return func(ctx context.Context, c *kvindex.Client, out *printer) error {
		resp, err := c.Cluster(ctx)
		if err != nil {
			return err
		}
		if out.json {
			return out.proto(resp)
		}
		fmt.Fprintf(out.w, "leader %s, term %d, commit index %d; answered by %s at applied index %d\n",
			resp.Leader, resp.Term, resp.CommitIndex, resp.NodeId, resp.AppliedIndex)
		var rows [][]string
		for _, m := range resp.Members {
			leader := ""
			if m.IsLeader {
				leader = "*"
			}
			// The digest's first 16 hex digits, enough to tell replicas apart.
			digest := ""
			if m.IndexDigest != "" {
				digest = fmt.Sprintf("%.16s@%d", m.IndexDigest, m.DigestAppliedIndex)
			}
			rows = append(rows, []string{m.Id + leader, m.RaftAddr, m.GrpcAddr,
				strings.ToLower(strings.TrimPrefix(m.Suffrage.String(), "SUFFRAGE_")), u(m.AppliedIndex), digest})
		}
		return out.table("MEMBER\tRAFT\tGRPC\tSUFFRAGE\tAPPLIED\tDIGEST@APPLIED", rows)
	}
}

func statsCmd(*flag.FlagSet) func(context.Context, *kvindex.Client, *printer) error {
	return func(ctx context.Context, c *kvindex.Client, out *printer) error {
		resp, err := c.Stats(ctx)
		if err != nil {
			return err
		}
		if out.json {
			return out.proto(resp)
		}
		rows := [][]string{{"nodes", u(resp.Nodes)}, {"residencies", u(resp.Residencies)},
			{"holders", u(uint64(resp.Workers))}, {"namespaces", u(uint64(resp.Namespaces))}, {"applied_index", u(resp.AppliedIndex)}}
		for _, name := range sortedKeys(resp.Counters) {
			rows = append(rows, []string{name, u(resp.Counters[name])})
		}
		return out.table("STAT\tVALUE", rows)
	}
}

func dumpCmd(fs *flag.FlagSet) func(context.Context, *kvindex.Client, *printer) error {
	req := &kvindexv1.DumpRequest{}
	var workers string
	fs.StringVar(&workers, "workers", "", "comma-separated worker ids (default: all)")
	fs.StringVar(&req.Model, "model", "", "only workers of this model")
	return func(ctx context.Context, c *kvindex.Client, out *printer) error {
		req.Workers = envflag.SplitList(workers)
		var rows [][]string
		all := &kvindexv1.DumpResponse{}
		applied, err := c.Dump(ctx, req, func(ch *kvindexv1.IndexChange) error {
			if out.json {
				all.Changes = append(all.Changes, ch)
				return nil
			}
			parent := "-"
			if ch.ParentSequenceHash != nil {
				parent = fmt.Sprintf("%016x", *ch.ParentSequenceHash)
			}
			rows = append(rows, []string{ch.Worker, u(uint64(ch.DpRank)), strings.ToLower(strings.TrimPrefix(ch.Tier.String(), "TIER_")),
				fmt.Sprintf("%016x", ch.SequenceHashes[0]), parent, ch.Model})
			return nil
		})
		if err != nil {
			return err
		}
		if out.json {
			all.AppliedIndex = applied
			return out.proto(all)
		}
		fmt.Fprintf(out.w, "%d blocks held, applied index %d\n", len(rows), applied)
		return out.table("WORKER\tDP RANK\tTIER\tSEQUENCE HASH\tPARENT\tMODEL", rows)
	}
}

func registerCmd(fs *flag.FlagSet) func(context.Context, *kvindex.Client, *printer) error {
	spec := &kvindexv1.WorkerSpec{}
	var blockSize, dpSize uint32
	var role string
	fs.StringVar(&spec.Id, "id", "", "worker id (required)")
	fs.StringVar(&spec.Model, "model", "", "served model (required)")
	fs.StringVar(&spec.EventsEndpoint, "endpoint", "", "ZMQ KV event endpoint of dp rank 0, e.g. tcp://10.0.0.7:5557")
	fs.StringVar(&spec.ReplayEndpoint, "replay", "", "ZMQ replay endpoint of dp rank 0")
	fs.StringVar(&spec.EventsTopic, "topic", "", "ZMQ topic to subscribe to")
	fs.StringVar(&spec.HttpEndpoint, "http", "", "the engine's OpenAI base URL")
	fs.Var(envflag.Uint32{V: &blockSize}, "block-size", "tokens per block")
	fs.Var(envflag.Uint32{V: &dpSize}, "dp-size", "data-parallel ranks")
	fs.StringVar(&role, "role", "", "aggregated, prefill or decode")
	return func(ctx context.Context, c *kvindex.Client, out *printer) error {
		if spec.Id == "" || spec.Model == "" {
			return usageError(fs, "--id and --model are required")
		}
		spec.BlockSize, spec.DpSize = blockSize, dpSize
		if role != "" {
			r, ok := kvindexv1.WorkerRole_value["WORKER_ROLE_"+strings.ToUpper(role)]
			if !ok {
				return usageError(fs, "--role=%q: want aggregated, prefill or decode", role)
			}
			spec.Role = kvindexv1.WorkerRole(r)
		}
		resp, err := c.RegisterWorker(ctx, spec)
		if err != nil {
			return err
		}
		if out.json {
			return out.proto(resp)
		}
		_, err = fmt.Fprintf(out.w, "registered %s (applied index %d)\n", resp.Worker.Spec.Id, resp.AppliedIndex)
		return err
	}
}

func unregisterCmd(fs *flag.FlagSet) func(context.Context, *kvindex.Client, *printer) error {
	var id string
	fs.StringVar(&id, "id", "", "worker id (required)")
	return func(ctx context.Context, c *kvindex.Client, out *printer) error {
		if id == "" {
			return usageError(fs, "--id is required")
		}
		resp, err := c.UnregisterWorker(ctx, id)
		if err != nil {
			return err
		}
		if out.json {
			return out.proto(resp)
		}
		_, err = fmt.Fprintf(out.w, "unregistered %s (applied index %d)\n", id, resp.AppliedIndex)
		return err
	}
}
