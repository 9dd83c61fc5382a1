package server

import (
	"cmp"
	"context"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	kvindexv1 "github.com/kvindex/kvindex/api/proto/kvindex/v1"
)

// registryView is a read-only copy of the worker registry arranged for
// scoring: who serves which model with which block size. Dead workers
// (WORKER_STATE_DEAD) are in byID, so that a request naming one gets it
// with zero matches, but not among their model's workers, so that requests
// listing every worker of a model leave them out; their block size still
// counts for the model's.
type registryView struct {
	built   time.Time
	gen     uint64 // the viewCache's generation when the registry was read
	byID    map[string]*viewWorker
	byModel map[string]*modelView
}

type viewWorker struct {
	id, model string
	blockSize int    // effective: the spec's, else --block-size; 0 when unknown
	ranks     uint32 // dp ranks
	dead      bool
}

type modelView struct {
	workers    []*viewWorker // by id
	blockSizes []int         // distinct known block sizes, ascending
	// byBlockSize holds, per known block size, the ids of the workers with it
	// or with none known; unknownBlockSize the ids of the latter alone.
	byBlockSize      map[int][]string
	unknownBlockSize []string
}

// all returns the model's workers, by id (nil for an unknown model).
func (mv *modelView) all() []*viewWorker {
	if mv == nil {
		return nil
	}
	return mv.workers
}

// idsWithBlockSize returns the ids of the model's workers whose block size is
// bs or unknown, by id; the slice is shared.
func (mv *modelView) idsWithBlockSize(bs int) []string {
	if mv == nil {
		return nil
	}
	if ids, ok := mv.byBlockSize[bs]; ok {
		return ids
	}
	return mv.unknownBlockSize
}

// resolveBlockSize returns the block size to cut a prompt for model with: the
// requested one, else the one the model's workers share, else the default.
func (mv *modelView) resolveBlockSize(model string, requested, fallback int) (int, error) {
	if requested > 0 {
		return requested, nil
	}
	if mv != nil {
		switch len(mv.blockSizes) {
		case 1:
			return mv.blockSizes[0], nil
		case 0:
		default:
			return 0, invalidArg("workers of model %q use block sizes %v: give block_size", model, mv.blockSizes)
		}
	}
	if fallback > 0 {
		return fallback, nil
	}
	return 0, invalidArg("block_size is required: no worker of model %q states its block size", model)
}

// viewCache holds the registry view that scoring reads. It is rebuilt on the
// first read after the raft apply loop reports a registry change (invalidate),
// and at the latest ttl after the last build.
//
// Concurrency: safe for concurrent use. get returns the current view with two
// atomic loads while it is fresh; otherwise one caller rebuilds it (reading the
// registry under the caller's context) while the others wait on mu. invalidate
// never blocks: the apply goroutine calls it. A view is fresh only while the
// generation it was read at is current, so a rebuild that read the registry
// before a change, and stores its view after the change's invalidate, cannot
// pass for fresh. Views are never modified once stored, so readers may keep
// one as long as they like.
type viewCache struct {
	backend          Backend
	defaultBlockSize int
	ttl              time.Duration
	mu               sync.Mutex
	cur              atomic.Pointer[registryView]
	gen              atomic.Uint64 // bumped by every invalidate
}

func (c *viewCache) fresh(v *registryView) bool {
	return v != nil && v.gen == c.gen.Load() && time.Since(v.built) < c.ttl
}

func (c *viewCache) get(ctx context.Context) (*registryView, error) {
	if v := c.cur.Load(); c.fresh(v) {
		return v, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if v := c.cur.Load(); c.fresh(v) {
		return v, nil
	}
	gen := c.gen.Load() // before the read: a change applied during it bumps it
	workers, err := c.backend.Workers(ctx)
	if err != nil {
		return nil, err
	}
	v := &registryView{built: time.Now(), gen: gen, byID: map[string]*viewWorker{}, byModel: map[string]*modelView{}}
	for _, ws := range workers {
		w := &viewWorker{id: ws.Spec.ID, model: ws.Spec.Model, blockSize: cmp.Or(ws.Spec.BlockSize, c.defaultBlockSize), ranks: ws.Spec.Ranks(),
			dead: ws.State == kvindexv1.WorkerState_WORKER_STATE_DEAD}
		v.byID[w.id] = w
		mv := v.byModel[w.model]
		if mv == nil {
			mv = &modelView{}
			v.byModel[w.model] = mv
		}
		if !w.dead {
			mv.workers = append(mv.workers, w)
		}
		if w.blockSize > 0 && !slices.Contains(mv.blockSizes, w.blockSize) {
			mv.blockSizes = append(mv.blockSizes, w.blockSize)
		}
	}
	for _, mv := range v.byModel {
		slices.SortFunc(mv.workers, func(x, y *viewWorker) int { return strings.Compare(x.id, y.id) })
		slices.Sort(mv.blockSizes)
		mv.byBlockSize = map[int][]string{}
		for _, w := range mv.workers {
			if w.blockSize == 0 {
				mv.unknownBlockSize = append(mv.unknownBlockSize, w.id)
			}
			for _, bs := range mv.blockSizes {
				if w.blockSize == 0 || w.blockSize == bs {
					mv.byBlockSize[bs] = append(mv.byBlockSize[bs], w.id)
				}
			}
		}
	}
	c.cur.Store(v)
	return v, nil
}

// invalidate makes the next get rebuild the view.
func (c *viewCache) invalidate() { c.gen.Add(1) }
