package routebench

import (
	"context"
	"errors"
	"io"

	"github.com/kvindex/kvindex/bench/traces"
)

// fleet is the live mode's processes.
type fleet struct{}

func startFleet(ctx context.Context, cfg *Config, stderr io.Writer) (*fleet, error) {
	return nil, errors.New("routebench: live mode not built yet")
}

func (f *fleet) close() {}

func (f *fleet) run(ctx context.Context, spec policySpec, tr traces.Trace, rate float64, tick func()) (Row, error) {
	return Row{}, errors.New("not built")
}
