package routebench

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/schollz/progressbar/v3"

	"github.com/kvindex/kvindex/bench/traces"
)

// Main is routebench's entry point: flags, run, report. cmd/routebench calls it.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, err := ParseFlags(args, stderr, nil)
	if err != nil {
		return err
	}
	rows, err := Run(ctx, cfg, stderr)
	if err != nil {
		return err
	}
	PrintTable(stdout, rows)
	fmt.Fprintf(stdout, "\nwrote %s/results.csv\n", cfg.Out)
	return nil
}

// Run replays every trace (at --rate and at each --rates value) once per policy,
// offline or live, writes results.csv and the plots into cfg.Out, and returns
// the rows.
func Run(ctx context.Context, cfg Config, stderr io.Writer) ([]Row, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	rates := append([]float64{cfg.Rate}, cfg.Rates...)
	type job struct {
		spec  string
		rate  float64
		trace traces.Trace
	}
	var jobs []job
	total := 0
	for _, spec := range cfg.Traces {
		for _, rate := range rates {
			tr, err := traces.Open(spec, traces.Options{Seed: cfg.Seed, Requests: cfg.Requests, Rate: rate}, cfg.PoissonMooncake)
			if err != nil {
				return nil, err
			}
			jobs = append(jobs, job{spec: spec, rate: rate, trace: tr})
			total += len(tr.Requests) * len(cfg.Policies)
		}
	}
	var bar *progressbar.ProgressBar
	tick := func() {}
	if cfg.Progress {
		bar = progressbar.NewOptions(total, progressbar.OptionSetWriter(stderr), progressbar.OptionSetDescription("routebench"),
			progressbar.OptionShowCount(), progressbar.OptionThrottle(200*time.Millisecond), progressbar.OptionClearOnFinish())
		tick = func() { bar.Add(1) }
	}
	var live *fleet
	if !cfg.Offline {
		var err error
		if live, err = startFleet(ctx, &cfg, stderr); err != nil {
			return nil, err
		}
		defer live.close()
	}
	var rows []Row
	for _, j := range jobs {
		for _, p := range cfg.Policies {
			spec, _ := specFor(p)
			start := time.Now()
			var row Row
			var err error
			if cfg.Offline {
				row, err = runOffline(&cfg, spec, j.trace, j.rate, tick)
			} else {
				row, err = live.run(ctx, spec, j.trace, j.rate, tick)
			}
			if err != nil {
				return nil, fmt.Errorf("%s / %s: %w", j.spec, p, err)
			}
			row.Trace = j.trace.Name
			row.WallSeconds = time.Since(start).Seconds()
			rows = append(rows, row)
		}
	}
	if bar != nil {
		bar.Finish()
	}
	fillOracle(rows)
	if err := WriteCSV(cfg.Out, rows); err != nil {
		return nil, err
	}
	if cfg.Plots {
		if err := WritePlots(cfg.Out, rows); err != nil {
			return nil, err
		}
	}
	return rows, nil
}

// runOffline simulates one (trace, policy) run.
func runOffline(cfg *Config, spec policySpec, tr traces.Trace, rate float64, tick func()) (Row, error) {
	s, err := newSimulator(cfg, spec, tr)
	if err != nil {
		return Row{}, err
	}
	s.onProgress = tick
	outs, err := s.run()
	if err != nil {
		return Row{}, err
	}
	busy := map[string]time.Duration{}
	for w, b := range s.busy {
		busy[workerID(w)] = b
	}
	return summarize(tr.Name, policyName(spec, cfg), "offline", cfg.Workers, cfg.BlockSize, rate, outs, busy, cfg.SLOTTFT), nil
}

// policyName is a row's policy column: the policy, with the routers when more
// than one ran it, and for the router's own policies (the ones the ledger
// serves) whether they shared through the ledger.
func policyName(spec policySpec, cfg *Config) string {
	switch {
	case cfg.Routers <= 1:
		return spec.name
	case spec.routerPolicy == "":
		return fmt.Sprintf("%s/%d-routers", spec.name, cfg.Routers)
	}
	return fmt.Sprintf("%s/%d-routers-ledger-%v", spec.name, cfg.Routers, cfg.Ledger)
}
