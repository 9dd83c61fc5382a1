package radix

import (
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"sync"
	"testing"
)

// TestConcurrentReadersAndOneWriter runs Match, Stats, Digest and WriteTo in
// parallel with a writer (run it with -race). Readers check every answer is well
// formed; at the end the index must equal one built from the same events alone.
func TestConcurrentReadersAndOneWriter(t *testing.T) {
	const steps = 4000
	ix := New(Config{MaxDetachedPerWorker: 6})
	g := newEventGen(7)
	events := make([]event, steps)
	for i := range events {
		events[i] = g.next()
	}

	done := make(chan struct{})
	errs := make(chan error, 4)
	var wg sync.WaitGroup
	for r := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(r), 1))
			var dst []WorkerMatch
			for i := 0; ; i++ {
				select {
				case <-done:
					return
				default:
				}
				keys := make([]uint64, 1+rng.IntN(6))
				for k := range keys {
					keys[k] = uint64(1 + rng.IntN(5))
				}
				dst = ix.Match(g.ns[rng.IntN(len(g.ns))], keys, nil, dst)
				if err := wellFormed(dst, len(keys)); err != nil {
					errs <- err
					return
				}
				switch i % 50 {
				case 0:
					ix.Stats()
				case 1:
					ix.Digest()
				case 2:
					if _, err := ix.WriteTo(io.Discard); err != nil {
						errs <- err
						return
					}
				}
			}
		}()
	}
	for _, e := range events {
		if _, _, err := apply(ix, e); err != nil {
			t.Fatal(err)
		}
	}
	close(done)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	alone := New(Config{MaxDetachedPerWorker: 6})
	for _, e := range events {
		_, _, _ = apply(alone, e)
	}
	if ix.Digest() != alone.Digest() {
		t.Fatal("index built under concurrent reads differs from one built alone")
	}
	var buf bytes.Buffer
	if _, err := ix.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	// ReadFrom concurrent with readers too.
	var rg sync.WaitGroup
	rg.Add(1)
	go func() {
		defer rg.Done()
		for range 100 {
			if err := wellFormed(ix.Match(g.ns[0], []uint64{1, 2, 3}, nil, nil), 3); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	if _, err := ix.ReadFrom(bytes.NewReader(buf.Bytes())); err != nil {
		t.Fatal(err)
	}
	rg.Wait()
}

func wellFormed(ms []WorkerMatch, keys int) error {
	for i, m := range ms {
		sum := 0
		for _, n := range m.PerTier {
			sum += n
		}
		if m.Blocks <= 0 || m.Blocks > keys || sum != m.Blocks {
			return fmt.Errorf("malformed match %+v for %d keys", m, keys)
		}
		if i > 0 && ms[i-1].Worker.compare(m.Worker) >= 0 {
			return fmt.Errorf("matches not sorted: %v before %v", ms[i-1].Worker, m.Worker)
		}
	}
	return nil
}
