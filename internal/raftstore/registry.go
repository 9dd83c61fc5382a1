package raftstore

import (
	"errors"
	"fmt"
	"maps"
	"math"

	"github.com/kvindex/kvindex/internal/workerspec"
)

var (
	// ErrInvalidWorker: a worker registration the registry cannot hold; the message
	// names the field. (Node.RegisterWorker also applies ingest's stricter
	// WorkerSpec.Validate, whose error it returns as is.)
	ErrInvalidWorker = errors.New("raftstore: invalid worker")
	// ErrWorkerExists: a worker with this id is registered with a different spec.
	ErrWorkerExists = errors.New("raftstore: worker already registered with a different spec")
	// ErrUnknownWorker: no worker with this id is registered.
	ErrUnknownWorker = errors.New("raftstore: unknown worker")
	// ErrWorkerChanged: a compare-and-set of a worker's spec (ReplaceWorker) found
	// another spec registered than the one it expected; read it again and retry.
	ErrWorkerChanged = errors.New("raftstore: the worker's registered spec changed")
)

// checkWorker is the registry's own, minimal check, applied by every replica when
// the entry commits. It must give the same answer in every version that shares a
// log, so it only checks what the log format needs: an id of 1..1024 bytes, block
// and dp sizes in 0..2^32-1, strings of at most 64 KiB.
func checkWorker(w *workerspec.Spec) error {
	switch {
	case w.ID == "" || len(w.ID) > maxNameLen:
		return fmt.Errorf("%w: id of %d bytes (want 1..%d)", ErrInvalidWorker, len(w.ID), maxNameLen)
	case w.BlockSize < 0 || w.BlockSize > math.MaxUint32:
		return fmt.Errorf("%w: worker %q block size %d", ErrInvalidWorker, w.ID, w.BlockSize)
	case w.DPSize < 0 || w.DPSize > math.MaxUint32:
		return fmt.Errorf("%w: worker %q dp size %d", ErrInvalidWorker, w.ID, w.DPSize)
	}
	for what, s := range map[string]string{
		"model": w.Model, "endpoint": w.Endpoint, "topic": w.Topic,
		"replay endpoint": w.Replay, "HTTP endpoint": w.HTTP, "role": w.Role,
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

// sameWorker reports whether two registrations are the same, field by field (a
// nil and an empty label map are the same).
func sameWorker(a, b *workerspec.Spec) bool {
	return a.ID == b.ID && a.Model == b.Model && a.BlockSize == b.BlockSize && a.DPSize == b.DPSize &&
		a.Endpoint == b.Endpoint && a.Topic == b.Topic && a.Replay == b.Replay && a.HTTP == b.HTTP &&
		a.Role == b.Role && maps.Equal(a.Labels, b.Labels)
}

func cloneWorker(w workerspec.Spec) workerspec.Spec {
	w.Labels = maps.Clone(w.Labels)
	return w
}
