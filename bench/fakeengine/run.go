package fakeengine

import (
	"context"
	"log/slog"
)

// Run starts the engine or fleet cfg describes, serves until ctx is done, then
// shuts down. A nil log discards.
func Run(ctx context.Context, cfg Config, log *slog.Logger) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
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
