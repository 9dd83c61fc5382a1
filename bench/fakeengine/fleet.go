package fakeengine

import (
	"errors"
	"log/slog"
	"strconv"
)

// Fleet runs several engines in one process (--fleet N), laid out by
// Config.FleetMembers. Methods are safe for concurrent use once Start returned.
type Fleet struct {
	engines []*Engine
}

// NewFleet prepares cfg.Fleet engines (one when Fleet <= 1); each logs with an
// "engine" attribute holding its index.
func NewFleet(cfg Config, log *slog.Logger) (*Fleet, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	f := &Fleet{}
	for i, member := range cfg.FleetMembers() {
		e, err := New(member, log.With("engine", strconv.Itoa(i)))
		if err != nil {
			return nil, err
		}
		f.engines = append(f.engines, e)
	}
	return f, nil
}

// Start starts every engine; on error the ones already started are closed.
func (f *Fleet) Start() error {
	for i, e := range f.engines {
		if err := e.Start(); err != nil {
			for _, started := range f.engines[:i] {
				started.Close()
			}
			return err
		}
	}
	return nil
}

// Close closes every engine.
func (f *Fleet) Close() error {
	var errs []error
	for _, e := range f.engines {
		errs = append(errs, e.Close())
	}
	return errors.Join(errs...)
}

// Engines returns the engines in index order.
func (f *Fleet) Engines() []*Engine { return f.engines }
