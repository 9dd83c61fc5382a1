package routebench

import (
	"fmt"
	"image/color"
	"os"
	"path/filepath"
	"slices"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// WritePlots writes, per trace, the TTFT CDF of every policy at the base rate
// (ttft_cdf_TRACE.png) and, when several rates ran, hit rate and TTFT p50 against
// the request rate (rate_TRACE.png).
func WritePlots(dir string, rows []Row) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var traceNames []string
	for _, r := range rows {
		if !slices.Contains(traceNames, r.Trace) {
			traceNames = append(traceNames, r.Trace)
		}
	}
	for _, tr := range traceNames {
		var mine []Row
		for _, r := range rows {
			if r.Trace == tr {
				mine = append(mine, r)
			}
		}
		if err := ttftCDF(dir, tr, mine); err != nil {
			return err
		}
		if err := rateSweep(dir, tr, mine); err != nil {
			return err
		}
	}
	return nil
}

func ttftCDF(dir, trace string, rows []Row) error {
	p := plot.New()
	p.Title.Text = "TTFT CDF — " + trace
	p.X.Label.Text = "TTFT (ms, log)"
	p.Y.Label.Text = "fraction of requests"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Legend.Top = false
	p.Legend.Left = false
	base := rows[0].Rate
	i := 0
	for _, r := range rows {
		if r.Rate != base || len(r.TTFTs) == 0 {
			continue
		}
		pts := make(plotter.XYs, 0, len(r.TTFTs))
		for k, v := range r.TTFTs {
			pts = append(pts, plotter.XY{X: max(v, 0.1), Y: float64(k+1) / float64(len(r.TTFTs))})
		}
		l, err := plotter.NewLine(pts)
		if err != nil {
			return err
		}
		l.Color = plotutil.Color(i)
		l.Dashes = plotutil.Dashes(i / 7)
		l.Width = vg.Points(1.2)
		p.Add(l)
		p.Legend.Add(r.Policy, l)
		i++
	}
	return p.Save(8*vg.Inch, 5*vg.Inch, filepath.Join(dir, fmt.Sprintf("ttft_cdf_%s.png", trace)))
}

func rateSweep(dir, trace string, rows []Row) error {
	var rates []float64
	for _, r := range rows {
		if !slices.Contains(rates, r.Rate) {
			rates = append(rates, r.Rate)
		}
	}
	if len(rates) < 2 {
		return nil
	}
	slices.Sort(rates)
	hit, ttft := plot.New(), plot.New()
	hit.Title.Text, ttft.Title.Text = "engine prefix hit rate vs request rate — "+trace, "TTFT p50 vs request rate — "+trace
	hit.X.Label.Text, ttft.X.Label.Text = "requests/s", "requests/s"
	hit.Y.Label.Text, ttft.Y.Label.Text = "hit rate", "TTFT p50 (ms)"
	var policies []string
	for _, r := range rows {
		if !slices.Contains(policies, r.Policy) {
			policies = append(policies, r.Policy)
		}
	}
	for i, pol := range policies {
		var hp, tp plotter.XYs
		for _, r := range rows {
			if r.Policy == pol {
				hp = append(hp, plotter.XY{X: r.Rate, Y: r.HitRate})
				tp = append(tp, plotter.XY{X: r.Rate, Y: r.TTFTP50})
			}
		}
		slices.SortFunc(hp, func(a, b plotter.XY) int { return cmpF(a.X, b.X) })
		slices.SortFunc(tp, func(a, b plotter.XY) int { return cmpF(a.X, b.X) })
		for _, pair := range []struct {
			p   *plot.Plot
			pts plotter.XYs
		}{{hit, hp}, {ttft, tp}} {
			l, s, err := plotter.NewLinePoints(pair.pts)
			if err != nil {
				return err
			}
			l.Color, s.Color = plotutil.Color(i), plotutil.Color(i)
			l.Dashes = plotutil.Dashes(i / 7)
			s.Shape = plotutil.Shape(i)
			pair.p.Add(l, s)
			pair.p.Legend.Add(pol, l, s)
		}
	}
	hit.Legend.Left, ttft.Legend.Left = true, true
	hit.Legend.Top, ttft.Legend.Top = false, true
	_ = color.Black
	if err := hit.Save(8*vg.Inch, 5*vg.Inch, filepath.Join(dir, fmt.Sprintf("hit_vs_rate_%s.png", trace))); err != nil {
		return err
	}
	return ttft.Save(8*vg.Inch, 5*vg.Inch, filepath.Join(dir, fmt.Sprintf("ttft_vs_rate_%s.png", trace)))
}

func cmpF(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
