package fakeengine

import (
	"context"
	"log/slog"
)

// Run starts the engine or fleet cfg describes, serves until ctx is done, then
// shuts down.
func Run(ctx context.Context, cfg Config, log *slog.Logger) error {
	fleet, err := NewFleet(cfg, log)
	if err != nil {
		return err
	}
	if err := fleet.Start(); err != nil {
		return err
	}
	<-ctx.Done()
	log.Info("shutting down")
	return fleet.Close()
}
