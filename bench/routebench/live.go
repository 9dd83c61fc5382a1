package routebench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvindex/kvindex/bench/fakeengine"
	"github.com/kvindex/kvindex/bench/traces"
	"github.com/kvindex/kvindex/internal/cputime"
)

// fleet is the live mode's processes: one fakeengine per worker and the indexer,
// started once; a router is started per policy (the policy is a router flag).
type fleet struct {
	cfg     *Config
	dir     string
	stderr  io.Writer
	procs   []*proc
	engines []string // base URLs
	grpc    string   // indexer gRPC address
	indexer *proc
	client  *http.Client
}

// freePort returns a TCP port that was free a moment ago.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

func freePorts(n int) ([]int, error) {
	var out []int
	for range n {
		p, err := freePort()
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}

// proc is one started process; done closes when it has exited.
type proc struct {
	name, log string
	cmd       *exec.Cmd
	done      chan struct{}
	err       error // the exit status, valid once done is closed
}

// errExited is a process that ended before it was ready: most often a port that
// was free when picked and taken by another process before the child bound it.
var errExited = errors.New("exited before it was ready")

// start runs a binary with its output in dir/name.log.
func (f *fleet) start(ctx context.Context, name, bin string, args ...string) (*proc, error) {
	logPath := filepath.Join(f.dir, name+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, filepath.Join(f.cfg.BinDir, bin), args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	p := &proc{name: name, log: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	f.procs = append(f.procs, p)
	return p, nil
}

// logTail is the end of p's log, for error messages (the log directory is
// removed when the fleet closes).
func (p *proc) logTail() string {
	raw, _ := os.ReadFile(p.log)
	const max = 2000
	if len(raw) > max {
		raw = raw[len(raw)-max:]
	}
	return strings.TrimSpace(string(raw))
}

// waitReady polls url until it answers 200, and fails early when p exits.
func (f *fleet) waitReady(ctx context.Context, p *proc, url string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if resp, err := f.client.Do(req); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-p.done:
			return fmt.Errorf("%s %w (%v); its log ends:\n%s", p.name, errExited, p.err, p.logTail())
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fmt.Errorf("%s: %s not ready after %v; its log ends:\n%s", p.name, url, timeout, p.logTail())
}

// startAttempts bounds the restarts of a fleet or router whose process exited
// before it was ready (a port taken between picking and binding).
const startAttempts = 3

// startFleet starts the engines and the indexer, on fresh ports again when a
// process exits before it is ready.
func startFleet(ctx context.Context, cfg *Config, stderr io.Writer) (*fleet, error) {
	for attempt := 1; ; attempt++ {
		f, err := startFleetOnce(ctx, cfg, stderr)
		if err == nil || !errors.Is(err, errExited) || attempt == startAttempts {
			return f, err
		}
		fmt.Fprintf(stderr, "routebench: fleet start attempt %d: %v\nroutebench: retrying on fresh ports\n", attempt, err)
	}
}

func startFleetOnce(ctx context.Context, cfg *Config, stderr io.Writer) (*fleet, error) {
	dir, err := os.MkdirTemp("", "routebench-")
	if err != nil {
		return nil, err
	}
	f := &fleet{cfg: cfg, dir: dir, stderr: stderr, client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 512}}}
	ok := false
	defer func() {
		if !ok {
			f.close()
		}
	}()
	ports, err := freePorts(3*cfg.Workers + 3)
	if err != nil {
		return nil, err
	}
	var workerArgs []string
	var engines []*proc
	for w := range cfg.Workers {
		ec := engineConfig(cfg, w)
		httpP, evP, repP := ports[3*w], ports[3*w+1], ports[3*w+2]
		args := []string{"--model", simModel, "--port", strconv.Itoa(httpP), "--block-size", strconv.Itoa(ec.BlockSize),
			"--num-gpu-blocks", strconv.Itoa(ec.NumGPUBlocks), "--num-cpu-blocks", strconv.Itoa(ec.NumCPUBlocks),
			"--time-scale", strconv.FormatFloat(cfg.TimeScale, 'g', -1, 64), "--block-hash-seed", strconv.FormatUint(ec.BlockHashSeed, 10),
			"--max-model-len", strconv.Itoa(ec.MaxModelLen),
			"--kv-events-endpoint", fmt.Sprintf("tcp://*:%d", evP), "--kv-events-replay-endpoint", fmt.Sprintf("tcp://*:%d", repP),
			"--log-level", "warn"}
		p, err := f.start(ctx, workerID(w), "fakeengine", args...)
		if err != nil {
			return nil, err
		}
		engines = append(engines, p)
		url := fmt.Sprintf("http://127.0.0.1:%d", httpP)
		f.engines = append(f.engines, url)
		workerArgs = append(workerArgs, "--worker", fmt.Sprintf("id=%s,model=%s,block-size=%d,endpoint=tcp://127.0.0.1:%d,replay=tcp://127.0.0.1:%d,http=%s",
			workerID(w), simModel, cfg.BlockSize, evP, repP, url))
	}
	base := 3 * cfg.Workers
	f.grpc = fmt.Sprintf("127.0.0.1:%d", ports[base])
	idxHTTP := fmt.Sprintf("127.0.0.1:%d", ports[base+1])
	args := append([]string{"--node-id", "bench", "--data-dir", filepath.Join(dir, "indexer"), "--http-addr", idxHTTP,
		"--grpc-addr", f.grpc, "--raft-addr", fmt.Sprintf("127.0.0.1:%d", ports[base+2]), "--block-size", strconv.Itoa(cfg.BlockSize),
		"--tokenizer", simModel + "=builtin", "--log-level", "warn"}, workerArgs...)
	indexer, err := f.start(ctx, "indexer", "indexer", args...)
	if err != nil {
		return nil, err
	}
	f.indexer = indexer
	for i, u := range f.engines {
		if err := f.waitReady(ctx, engines[i], u+"/health", 60*time.Second); err != nil {
			return nil, err
		}
	}
	if err := f.waitReady(ctx, indexer, "http://"+idxHTTP+"/readyz", 60*time.Second); err != nil {
		return nil, err
	}
	ok = true
	return f, nil
}

func (f *fleet) close() {
	f.stopFrom(0)
	os.RemoveAll(f.dir)
}

// stopFrom stops the processes started from f.procs[n] on, newest first, and
// forgets them.
func (f *fleet) stopFrom(n int) {
	for i := len(f.procs) - 1; i >= n; i-- {
		p := f.procs[i]
		select {
		case <-p.done:
			continue
		default:
		}
		p.cmd.Process.Signal(os.Interrupt)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			p.cmd.Process.Kill()
			<-p.done
		}
	}
	f.procs = f.procs[:n]
}

// startRouter starts a router with args and a fresh --listen port (again on
// another port when it exits before it is ready) and returns its base URL.
func (f *fleet) startRouter(ctx context.Context, name string, args []string) (string, error) {
	for attempt := 1; ; attempt++ {
		port, err := freePort()
		if err != nil {
			return "", err
		}
		listen := fmt.Sprintf("127.0.0.1:%d", port)
		p, err := f.start(ctx, name, "router", append([]string{"--listen", listen}, args...)...)
		if err != nil {
			return "", err
		}
		base := "http://" + listen
		err = f.waitReady(ctx, p, base+"/readyz", 30*time.Second)
		if err == nil || !errors.Is(err, errExited) || attempt == startAttempts {
			return base, err
		}
		fmt.Fprintf(f.stderr, "routebench: %v\nroutebench: retrying on a fresh port\n", err)
	}
}

// resetCaches empties every engine's prefix cache (they announce it to the
// indexer), so every policy starts cold.
func (f *fleet) resetCaches(ctx context.Context) error {
	for _, u := range f.engines {
		var lastErr error
		for range 50 {
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, u+"/reset_prefix_cache", nil)
			resp, err := f.client.Do(req)
			if err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					lastErr = nil
					break
				}
				err = fmt.Errorf("status %d", resp.StatusCode)
			}
			lastErr = err
			time.Sleep(100 * time.Millisecond)
		}
		if lastErr != nil {
			return fmt.Errorf("reset %s: %w", u, lastErr)
		}
	}
	time.Sleep(300 * time.Millisecond) // let the cleared events reach the indexer
	return nil
}

// completion is the usage part of an OpenAI completion (or its last chunk).
type completion struct {
	Usage struct {
		PromptTokens        int `json:"prompt_tokens"`
		PromptTokensDetails struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
}

// run replays tr through a router running spec's policy.
func (f *fleet) run(ctx context.Context, spec policySpec, tr traces.Trace, rate float64, tick func()) (Row, error) {
	if err := f.resetCaches(ctx); err != nil {
		return Row{}, err
	}
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	defer f.stopFrom(len(f.procs)) // this run's routers
	var bases []string
	for i := range f.cfg.Routers {
		var args []string
		if !spec.liveNoIndexer {
			args = append(args, "--indexer", f.grpc)
		}
		args = append(args, "--log-level", "warn", "--queue-size", "100000", "--queue-timeout", "10m",
			"--router-id", fmt.Sprintf("routebench-%d", i), "--ledger="+strconv.FormatBool(f.cfg.Ledger))
		args = append(args, spec.liveArgs...)
		if f.cfg.PrefillScale > 0 {
			args = append(args, "--prefill-scale", strconv.FormatFloat(f.cfg.PrefillScale, 'g', -1, 64))
		}
		for w, u := range f.engines {
			args = append(args, "--worker", fmt.Sprintf("id=%s,model=%s,block-size=%d,http=%s", workerID(w), simModel, f.cfg.BlockSize, u))
		}
		base, err := f.startRouter(rctx, fmt.Sprintf("router-%s-%d", spec.name, i), args)
		if err != nil {
			return Row{}, err
		}
		bases = append(bases, base)
	}
	base := bases[0]

	cpu0, err := cputime.Of(f.indexer.cmd.Process.Pid)
	if err != nil {
		return Row{}, fmt.Errorf("the indexer's CPU time: %w", err)
	}
	outs := make([]outcome, len(tr.Requests))
	busy := map[string]time.Duration{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	scale := f.cfg.TimeScale
	start := time.Now()
	for i := range tr.Requests {
		r := &tr.Requests[i]
		if wait := time.Duration(float64(r.Arrival)*scale) - time.Since(start); wait > 0 {
			select {
			case <-ctx.Done():
				return Row{}, ctx.Err()
			case <-time.After(wait):
			}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			o := f.send(ctx, bases[i%len(bases)], r)
			mu.Lock()
			outs[i] = o
			if !o.failed {
				busy[o.workerID] += o.e2e
			}
			mu.Unlock()
			tick()
		}()
	}
	wg.Wait()
	cpu1, err := cputime.Of(f.indexer.cmd.Process.Pid)
	if err != nil {
		return Row{}, fmt.Errorf("the indexer's CPU time: %w", err)
	}
	row := summarize(tr.Name, policyName(spec, f.cfg), "live", f.cfg.Workers, f.cfg.BlockSize, rate, outs, busy, f.cfg.SLOTTFT)
	row.DecisionP50, row.DecisionP99 = f.overheadQuantiles(ctx, base)
	row.IndexerCPUMs = float64(cpu1-cpu0) / float64(time.Millisecond) / float64(len(outs))
	return row, nil
}

// send streams one request through the router, as chat clients do (so the
// router's prefill load is released at the first token, not at the end), and
// reads usage.cached_tokens from the final usage chunk. TTFT and E2E are the
// engine's simulated ones from its X-Sim-* trailers when the router relays them,
// else the client's wall-clock times divided by --time-scale (which also divides
// the router's overhead and the engines' real scheduling delays).
func (f *fleet) send(ctx context.Context, base string, r *traces.Request) outcome {
	o := outcome{arrival: r.Arrival, promptTokens: len(r.Prompt), outputTokens: r.OutputTokens, decisionCPU: -1}
	body, _ := json.Marshal(map[string]any{"model": simModel, "prompt": r.Prompt, "max_tokens": r.OutputTokens,
		"stream": true, "stream_options": map[string]any{"include_usage": true}})
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/completions", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Session-ID", r.Session)
	if r.Prefix != "" {
		req.Header.Set("X-Cache-Key", r.Prefix)
	}
	scale := max(f.cfg.TimeScale, 1e-9)
	t0 := time.Now()
	resp, err := f.client.Do(req)
	if err != nil {
		o.failed = true
		fmt.Fprintf(f.stderr, "routebench: request %d: %v\n", r.ID, err)
		return o
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		raw, _ := io.ReadAll(resp.Body)
		o.failed = true
		fmt.Fprintf(f.stderr, "routebench: request %d: status %d %s\n", r.ID, resp.StatusCode, strings.TrimSpace(string(raw)))
		return o
	}
	o.workerID = resp.Header.Get("X-Kvindex-Worker")
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	gotUsage, done := false, false
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			done = true
			break
		}
		var c struct {
			completion
			Choices []json.RawMessage `json:"choices"`
			Error   json.RawMessage   `json:"error"`
		}
		if err := json.Unmarshal([]byte(data), &c); err != nil || len(c.Error) > 0 {
			o.failed = true
			return o
		}
		if o.ttft == 0 && len(c.Choices) > 0 {
			o.ttft = time.Duration(float64(time.Since(t0)) / scale)
		}
		if c.Usage.PromptTokens > 0 {
			gotUsage = true
			o.cachedTokens = c.Usage.PromptTokensDetails.CachedTokens
		}
	}
	o.e2e = time.Duration(float64(time.Since(t0)) / scale)
	if sc.Err() != nil || !done || !gotUsage {
		o.failed = true
		return o
	}
	// The engine's own simulated timings come as trailers after the body, when
	// the router relays them; they replace the client's clock.
	io.Copy(io.Discard, resp.Body)
	if ttft, ok := trailerMs(resp.Trailer, fakeengine.HeaderSimTTFT); ok {
		o.ttft = ttft
	}
	if e2e, ok := trailerMs(resp.Trailer, fakeengine.HeaderSimE2E); ok {
		o.e2e = e2e
	}
	return o
}

// trailerMs reads a trailer holding milliseconds.
func trailerMs(h http.Header, name string) (time.Duration, bool) {
	v, err := strconv.ParseFloat(h.Get(name), 64)
	if err != nil {
		return 0, false
	}
	return time.Duration(v * float64(time.Millisecond)), true
}

// overheadQuantiles reads the router's kvindex_router_overhead_seconds histogram
// (arrival to upstream request sent: parse, tokenize, index query, decision) and
// returns its p50 and p99 in µs, interpolated within buckets.
func (f *fleet) overheadQuantiles(ctx context.Context, base string) (p50, p99 float64) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	resp, err := f.client.Do(req)
	if err != nil {
		return math.NaN(), math.NaN()
	}
	defer resp.Body.Close()
	type bucket struct{ le, n float64 }
	var buckets []bucket
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, `kvindex_router_overhead_seconds_bucket{le="`)
		if !ok {
			continue
		}
		leS, nS, ok := strings.Cut(rest, `"} `)
		if !ok {
			continue
		}
		le, err1 := strconv.ParseFloat(leS, 64)
		n, err2 := strconv.ParseFloat(nS, 64)
		if err1 == nil && err2 == nil {
			buckets = append(buckets, bucket{le, n})
		}
	}
	slices.SortFunc(buckets, func(a, b bucket) int { return cmpF(a.le, b.le) })
	q := func(p float64) float64 {
		if len(buckets) == 0 || buckets[len(buckets)-1].n == 0 {
			return math.NaN()
		}
		target := p * buckets[len(buckets)-1].n
		prevLe, prevN := 0.0, 0.0
		for _, b := range buckets {
			if b.n >= target {
				if math.IsInf(b.le, 1) {
					return prevLe * 1e6
				}
				frac := 0.0
				if b.n > prevN {
					frac = (target - prevN) / (b.n - prevN)
				}
				return (prevLe + frac*(b.le-prevLe)) * 1e6
			}
			prevLe, prevN = b.le, b.n
		}
		return math.NaN()
	}
	return q(.5), q(.99)
}
