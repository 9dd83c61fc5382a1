package server

import (
	"context"
	"testing"
	"time"

	kvindexv1 "github.com/kvindex/kvindex/api/proto/kvindex/v1"
)

// heldBackend is the fixture's real backend, except that one Workers call,
// once armed, waits after reading the registry until released: the moment
// a view rebuild has read the registry but not yet stored its view.
type heldBackend struct {
	Backend
	read, release chan struct{}
}

func (b *heldBackend) Workers(ctx context.Context) ([]WorkerStatus, error) {
	ws, err := b.Backend.Workers(ctx)
	if b.read != nil {
		close(b.read)
		<-b.release
		b.read = nil
	}
	return ws, err
}

// TestARebuildThatReadBeforeAChangeIsNotFresh: a view rebuild reads the
// registry, a registration applies and invalidates the view, and only then
// does the rebuild store its view. That view misses the new worker, so the
// next read must rebuild instead of serving it (it used to be served as fresh
// for the whole TTL: a Score right after a successful RegisterWorker could
// leave the new worker out).
func TestARebuildThatReadBeforeAChangeIsNotFresh(t *testing.T) {
	f := newFixture(t, fixtureOptions{engines: []engineSpec{}})
	held := &heldBackend{Backend: f.srv.Backend(), read: make(chan struct{}), release: make(chan struct{})}
	cache := &viewCache{backend: held, ttl: time.Hour}
	rebuilt := make(chan error, 1)
	go func() {
		_, err := cache.get(context.Background())
		rebuilt <- err
	}()
	<-held.read
	spec := &kvindexv1.WorkerSpec{Id: "late", Model: testModel, BlockSize: 4}
	if _, err := f.admin.RegisterWorker(context.Background(), &kvindexv1.RegisterWorkerRequest{Worker: spec}); err != nil {
		t.Fatal(err)
	}
	cache.invalidate() // what the apply hook does for the registration
	close(held.release)
	if err := <-rebuilt; err != nil {
		t.Fatal(err)
	}
	v, err := cache.get(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if v.byID["late"] == nil {
		t.Error("a read after the registration and its invalidation got a view without the new worker")
	}
}
