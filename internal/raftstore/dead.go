package raftstore

import (
	"fmt"
	"maps"
)

// Dead workers. The leader (internal/server) probes each worker's health
// endpoint and, after --worker-dead-after of failures, proposes EntryWorkerDead;
// every replica then drops the worker's blocks and fences its streams
// (ingest.Applier.FenceWorker), so that no batch still in flight brings them
// back, and the worker is left out of scoring. It lives again when its health
// endpoint answers (EntryWorkerAlive) or when one of its streams starts afresh
// (a batch with Reset gets through the fence: applyBatches), and ingest starts
// each fenced stream afresh (no gap, no stale block) when it sees the fence.

// setDead declares a registered worker dead at log index index (dead), or
// ends its death (!dead: its health endpoint answers again). A death drops the
// worker's blocks and fences its streams (ingest.Applier.FenceWorker), so that
// only a fresh stream brings blocks back; its end leaves the fences, which each
// stream lifts by starting afresh. A worker already in the state asked for
// stays as it is (the leader may propose twice around an election).
func (f *fsm) setDead(id string, index uint64, dead bool) error {
	f.mu.Lock()
	_, registered := f.workers[id]
	_, wasDead := f.dead[id]
	switch {
	case !registered:
		f.mu.Unlock()
		return fmt.Errorf("%w: %q", ErrUnknownWorker, id)
	case wasDead == dead:
		f.mu.Unlock()
		return nil
	case dead:
		f.dead[id] = index
	default:
		delete(f.dead, id)
	}
	list := f.workerListLocked()
	f.mu.Unlock()
	if dead {
		ranks := f.applier.FenceWorker(id, index)
		f.metrics.workerDeaths.Inc()
		if f.onDead != nil {
			f.onDead(index, id, ranks)
		}
	}
	f.notifyWorkers(list)
	return nil
}

// Dead returns the workers declared dead, with the log index of each
// declaration.
func (f *fsm) Dead() map[string]uint64 {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return maps.Clone(f.dead)
}
