package router

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvindex/kvindex/internal/workerspec"
)

// Role is a worker's part in prefill/decode disaggregation.
type Role uint8

const (
	// RoleBoth serves whole requests.
	RoleBoth Role = iota
	// RolePrefill runs the prefill leg only.
	RolePrefill
	// RoleDecode runs the decode leg only.
	RoleDecode
)

func (r Role) String() string {
	switch r {
	case RolePrefill:
		return "prefill"
	case RoleDecode:
		return "decode"
	}
	return "both"
}

func roleOf(s string) Role {
	switch s {
	case "prefill":
		return RolePrefill
	case "decode":
		return RoleDecode
	}
	return RoleBoth
}

// Worker is one engine the router may send requests to. Values are immutable once
// published in a fleet view.
type Worker struct {
	ID        string
	Model     string
	URL       string // base URL, no trailing slash
	Role      Role
	Ranks     uint32
	BlockSize int
	Labels    map[string]string
	// Adapters are the LoRA adapters the engine lists in /v1/models; nil until
	// the first poll answered.
	Adapters map[string]bool
}

// Serves reports whether the worker takes requests for model, which may be its
// base model or one of its LoRA adapters; lora is the adapter ("" for the base).
func (w *Worker) Serves(model string) (lora string, ok bool) {
	if model == "" || model == w.Model {
		return "", true
	}
	return model, w.Adapters[model]
}

// fleetView is one immutable state of the fleet.
type fleetView struct {
	workers []*Worker // by id
	byID    map[string]*Worker
	// version grows with every change; the ring cache keys on it.
	version uint64
}

// Fleet is the current set of workers, merged from the static --worker list, the
// workers file and the indexer's registry (in that precedence on equal ids), plus
// the LoRA adapters each engine lists. Readers take a view without locking. A
// change is announced (onChange): a worker that joins, comes back or takes a new
// adapter may serve requests queued while there was none.
type Fleet struct {
	log       *slog.Logger
	blockSize int

	mu       sync.Mutex
	static   []workerspec.Spec          // guarded by mu
	file     []workerspec.Spec          // guarded by mu
	registry []workerspec.Spec          // guarded by mu
	kube     []workerspec.Spec          // guarded by mu
	adapters map[string]map[string]bool // worker id -> adapters; guarded by mu
	version  uint64                     // guarded by mu

	view atomic.Pointer[fleetView]

	// onChange is called, outside mu, after every published change.
	onChange func()
}

func newFleet(static []workerspec.Spec, blockSize int, log *slog.Logger) *Fleet {
	f := &Fleet{log: log, blockSize: blockSize, static: static, adapters: map[string]map[string]bool{}}
	f.mu.Lock()
	f.publishLocked()
	f.mu.Unlock()
	return f
}

// View returns the current workers.
func (f *Fleet) View() *fleetView { return f.view.Load() }

// Workers returns the current workers, ordered by id.
func (f *Fleet) Workers() []*Worker { return f.view.Load().workers }

func (f *Fleet) setFile(specs []workerspec.Spec) {
	f.update(func() bool { f.file = specs; return true })
}

func (f *Fleet) setRegistry(specs []workerspec.Spec) {
	f.update(func() bool { f.registry = specs; return true })
}

func (f *Fleet) setKube(specs []workerspec.Spec) {
	f.update(func() bool { f.kube = specs; return true })
}

// setAdapters records the LoRA adapters of workers (by id) and republishes the
// fleet once if any changed.
func (f *Fleet) setAdapters(byWorker map[string]map[string]bool) {
	f.update(func() bool {
		changed := false
		for id, adapters := range byWorker {
			if old, ok := f.adapters[id]; !ok || !maps.Equal(old, adapters) {
				f.adapters[id], changed = adapters, true
			}
		}
		return changed
	})
}

// update runs change under mu and, when it reports a change, publishes the
// result; if the workers differ from the current view, onChange is called
// after mu is released.
func (f *Fleet) update(change func() bool) {
	f.mu.Lock()
	changed := change() && f.publishLocked()
	f.mu.Unlock()
	if changed && f.onChange != nil {
		f.onChange()
	}
}

// publishLocked builds the view from the sources and publishes it unless it
// equals the current one (a registry poll that found nothing new), so that the
// version only grows with a change; it reports whether it published.
func (f *Fleet) publishLocked() bool {
	byID := map[string]*Worker{}
	for _, list := range [][]workerspec.Spec{f.registry, f.kube, f.file, f.static} { // later wins
		for _, s := range list {
			if s.HTTP == "" {
				continue // not routable; the indexer may know workers the router cannot reach
			}
			bs := s.BlockSize
			if bs == 0 {
				bs = f.blockSize
			}
			byID[s.ID] = &Worker{ID: s.ID, Model: s.Model, URL: strings.TrimRight(s.HTTP, "/"), Role: roleOf(s.Role),
				Ranks: s.Ranks(), BlockSize: bs, Labels: s.Labels, Adapters: f.adapters[s.ID]}
		}
	}
	for id := range f.adapters {
		if byID[id] == nil {
			delete(f.adapters, id)
		}
	}
	ws := slices.SortedFunc(maps.Values(byID), func(a, b *Worker) int { return cmp.Compare(a.ID, b.ID) })
	if old := f.view.Load(); old != nil && reflect.DeepEqual(old.workers, ws) {
		return false
	}
	f.version++
	f.view.Store(&fleetView{workers: ws, byID: byID, version: f.version})
	return true
}

// watchFile re-reads the workers file whenever its content changes, until ctx
// ends. A file that fails to parse keeps the previous list (and is logged).
func (f *Fleet) watchFile(ctx context.Context, path string, every time.Duration) {
	var last []byte
	load := func() {
		data, err := os.ReadFile(path)
		if err != nil {
			f.log.Warn("workers file unreadable; keeping the last list", "file", path, "err", err)
			return
		}
		if last != nil && string(data) == string(last) {
			return
		}
		if len(bytes.TrimSpace(data)) == 0 && len(last) > 0 {
			// Most likely caught mid-write (truncated, not yet written): an empty
			// fleet is said explicitly, with "workers: []".
			f.log.Warn("workers file is empty; keeping the last list (write `workers: []` to remove every worker)", "file", path)
			return
		}
		specs, err := workerspec.ParseFile(data)
		if err != nil {
			f.log.Warn("workers file invalid; keeping the last list", "file", path, "err", err)
			return
		}
		last = data
		f.setFile(specs)
		f.log.Info("workers file loaded", "file", path, "workers", len(specs))
	}
	load()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			load()
		}
	}
}

// modelCard is one entry of an engine's /v1/models.
type modelCard struct {
	ID          string  `json:"id"`
	Object      string  `json:"object"`
	Created     int64   `json:"created"`
	OwnedBy     string  `json:"owned_by"`
	Root        string  `json:"root,omitempty"`
	Parent      *string `json:"parent"`
	MaxModelLen int     `json:"max_model_len,omitempty"`
}

type modelList struct {
	Object string      `json:"object"`
	Data   []modelCard `json:"data"`
}

// maxModelsBody bounds what the router reads of an engine's /v1/models.
const maxModelsBody = 4 << 20

// getFromWorker GETs path of a worker within timeout and hands a 200 body,
// bounded by limit, to read; other statuses are errors naming the URL.
func getFromWorker(ctx context.Context, hc *http.Client, w *Worker, path string, timeout time.Duration, limit int64, read func(io.Reader) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, w.URL+path, nil)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s%s: %s", w.URL, path, resp.Status)
	}
	if err := read(io.LimitReader(resp.Body, limit)); err != nil {
		return fmt.Errorf("GET %s%s: %w", w.URL, path, err)
	}
	return nil
}

// fetchModels reads a worker's /v1/models.
func fetchModels(ctx context.Context, hc *http.Client, w *Worker) ([]modelCard, error) {
	var list modelList
	err := getFromWorker(ctx, hc, w, "/v1/models", 5*time.Second, maxModelsBody, func(r io.Reader) error {
		return json.NewDecoder(r).Decode(&list)
	})
	return list.Data, err
}

// pollModels keeps every worker's LoRA adapters current, until ctx ends.
func (f *Fleet) pollModels(ctx context.Context, hc *http.Client, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		// One republish per round (or per 64 workers, so a large fleet's first
		// round shows its adapters early): publishing is linear in the fleet.
		round := map[string]map[string]bool{}
		for _, w := range f.Workers() {
			if len(round) == 64 {
				f.setAdapters(round)
				round = map[string]map[string]bool{}
			}
			cards, err := fetchModels(ctx, hc, w)
			if err != nil {
				if ctx.Err() == nil {
					f.log.Debug("worker models unavailable", "worker", w.ID, "err", err)
				}
				continue
			}
			adapters := map[string]bool{}
			for _, c := range cards {
				if c.ID != w.Model {
					adapters[c.ID] = true
				}
			}
			round[w.ID] = adapters
		}
		f.setAdapters(round)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
