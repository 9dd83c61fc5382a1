package raftstore

import (
	"errors"
	"fmt"
	"maps"
)

var (
	// ErrInvalidWorker: a worker registration missing a required field or with one
	// out of range; the message names it.
	ErrInvalidWorker = errors.New("raftstore: invalid worker")
	// ErrWorkerExists: a worker with this id is registered with a different spec.
	ErrWorkerExists = errors.New("raftstore: worker already registered with a different spec")
	// ErrUnknownWorker: no worker with this id is registered.
	ErrUnknownWorker = errors.New("raftstore: unknown worker")
)

// Worker is one entry of the replicated worker registry: who an engine is and
// where its event, replay and HTTP endpoints are (the fields of the API's
// WorkerSpec). The registry decides which engines the leader subscribes to; the
// index itself applies batches of any stream, registered or not, except those of
// a worker unregistered since (see FSM).
type Worker struct {
	ID             string
	Model          string
	BlockSize      uint32
	DPSize         uint32 // 0 is read as 1
	EventsEndpoint string
	EventsTopic    string
	ReplayEndpoint string
	HTTPEndpoint   string
	Role           string // "", "aggregated", "prefill" or "decode"; not interpreted here
	Labels         map[string]string
}

// Validate checks what the registry requires: an id of 1..1024 bytes, a model, a
// block size, and strings of at most 64 KiB.
func (w *Worker) Validate() error {
	switch {
	case w.ID == "" || len(w.ID) > maxNameLen:
		return fmt.Errorf("%w: id of %d bytes (want 1..%d)", ErrInvalidWorker, len(w.ID), maxNameLen)
	case w.Model == "":
		return fmt.Errorf("%w: worker %q has no model", ErrInvalidWorker, w.ID)
	case w.BlockSize == 0:
		return fmt.Errorf("%w: worker %q has block size 0", ErrInvalidWorker, w.ID)
	}
	for what, s := range map[string]string{
		"model": w.Model, "events endpoint": w.EventsEndpoint, "events topic": w.EventsTopic,
		"replay endpoint": w.ReplayEndpoint, "HTTP endpoint": w.HTTPEndpoint, "role": w.Role,
	} {
		if len(s) > maxStringLen {
			return fmt.Errorf("%w: worker %q %s of %d bytes exceeds %d", ErrInvalidWorker, w.ID, what, len(s), maxStringLen)
		}
	}
	for k, v := range w.Labels {
		if len(k) > maxStringLen || len(v) > maxStringLen {
			return fmt.Errorf("%w: worker %q label %.32q exceeds %d bytes", ErrInvalidWorker, w.ID, k, maxStringLen)
		}
	}
	return nil
}

// Equal reports whether w and o are the same registration (a nil and an empty
// label map are equal).
func (w *Worker) Equal(o *Worker) bool {
	return w.ID == o.ID && w.Model == o.Model && w.BlockSize == o.BlockSize && w.DPSize == o.DPSize &&
		w.EventsEndpoint == o.EventsEndpoint && w.EventsTopic == o.EventsTopic &&
		w.ReplayEndpoint == o.ReplayEndpoint && w.HTTPEndpoint == o.HTTPEndpoint &&
		w.Role == o.Role && maps.Equal(w.Labels, o.Labels)
}

func (w Worker) clone() Worker {
	w.Labels = maps.Clone(w.Labels)
	return w
}
