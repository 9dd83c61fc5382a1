package radix

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"flag"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata golden files")

func snapshotOf(t testing.TB, ix *Index) []byte {
	t.Helper()
	var buf bytes.Buffer
	n, err := ix.WriteTo(&buf)
	if err != nil || n != int64(buf.Len()) {
		t.Fatalf("WriteTo = %d, %v; wrote %d bytes", n, err, buf.Len())
	}
	return buf.Bytes()
}

func restore(t testing.TB, data []byte) *Index {
	t.Helper()
	ix := New(Config{})
	n, err := ix.ReadFrom(bytes.NewReader(data))
	if err != nil || n != int64(len(data)) {
		t.Fatalf("ReadFrom = %d, %v; want %d, nil", n, err, len(data))
	}
	return ix
}

// TestSnapshotRoundTripAfterRandomEvents restores snapshots taken along random
// event sequences and checks the copy is the same index: equal digest, sizes,
// answers, byte-identical snapshot, and it keeps agreeing after further events.
func TestSnapshotRoundTripAfterRandomEvents(t *testing.T) {
	for seed := uint64(1); seed <= 4; seed++ {
		g := newEventGen(seed)
		ix, ref := New(Config{MaxDetachedPerWorker: 6}), newRef(6)
		for step := 1; step <= 1200; step++ {
			e := g.next()
			_, _, _ = apply(ix, e)
			applyRef(ref, e)
			if step%300 != 0 {
				continue
			}
			data := snapshotOf(t, ix)
			cp := New(Config{MaxDetachedPerWorker: 6})
			if _, err := cp.ReadFrom(bytes.NewReader(data)); err != nil {
				t.Fatalf("seed %d step %d: ReadFrom: %v", seed, step, err)
			}
			if err := checkInvariants(cp); err != nil {
				t.Fatalf("seed %d step %d: restored index: %v", seed, step, err)
			}
			if ix.Digest() != cp.Digest() || !bytes.Equal(data, snapshotOf(t, cp)) {
				t.Fatalf("seed %d step %d: restored index differs", seed, step)
			}
			if got, want := sizes(cp.Stats()), sizes(ix.Stats()); got != want {
				t.Fatalf("seed %d step %d: restored Stats %+v, want %+v", seed, step, got, want)
			}
			// Both copies must also evolve identically.
			for range 200 {
				e := g.next()
				r1, d1, _ := apply(ix, e)
				r2, d2, _ := apply(cp, e)
				applyRef(ref, e)
				if r1 != r2 || d1 != d2 {
					t.Fatalf("seed %d: after restore %s: %+v %+v vs %+v %+v", seed, e, r1, d1, r2, d2)
				}
				ns, keys := g.prompt(ref)
				if a, b := ix.Match(ns, keys, nil, nil), cp.Match(ns, keys, nil, nil); !reflect.DeepEqual(a, b) {
					t.Fatalf("seed %d: Match differs after restore: %+v vs %+v", seed, a, b)
				}
			}
			if ix.Digest() != cp.Digest() {
				t.Fatalf("seed %d step %d: digests diverge after identical events", seed, step)
			}
		}
	}
}

func TestDigestDependsOnContentNotHistory(t *testing.T) {
	chain := func(ix *Index, w WorkerKey, ns uint64, hashes, keys []uint64, tier Tier) {
		if _, err := ix.Stored(w, ns, 0, false, hashes, keys, tier); err != nil {
			t.Fatal(err)
		}
	}
	a := New(Config{})
	chain(a, wA, ns1, u(1, 2, 3), u(10, 20, 30), TierGPU)
	chain(a, wB, ns1, u(1, 4), u(10, 40), TierCPU)
	chain(a, wC, ns2, u(9), u(90), TierDisk)
	if _, err := a.Stored(wA, 0, 77, true, u(5), u(50), TierGPU); err != nil { // detached
		t.Fatal(err)
	}

	b := New(Config{})
	chain(b, wC, 0x5, u(100, 101, 102), u(1, 2, 3), TierGPU) // churn: other nodes, freed later
	chain(b, wB, ns1, u(1, 4), u(10, 40), TierCPU)
	if _, err := b.Stored(wA, 0, 77, true, u(5), u(50), TierGPU); err != nil {
		t.Fatal(err)
	}
	chain(b, wA, ns1, u(1, 2, 3), u(10, 20, 30), TierCPU)
	chain(b, wA, ns1, u(1, 2, 3), u(10, 20, 30), TierGPU)
	if _, err := b.Removed(wA, u(1, 2, 3), TierCPU); err != nil {
		t.Fatal(err)
	}
	b.Cleared(wC)
	chain(b, wC, ns2, u(9), u(90), TierDisk)

	if a.Digest() != b.Digest() {
		t.Fatalf("same content, different histories: digests differ\n%x\n%x", snapshotOf(t, a), snapshotOf(t, b))
	}
	if _, err := b.Removed(wB, u(4), TierCPU); err != nil {
		t.Fatal(err)
	}
	if a.Digest() == b.Digest() {
		t.Fatal("different content, equal digests")
	}
}

// TestSnapshotIsACopy takes Snapshots along random event sequences and checks
// each one, written after the index has moved on (writes in between, including
// ones that grow and free the arena and the tables), writes exactly what WriteTo
// wrote when it was taken, and has that Digest.
func TestSnapshotIsACopy(t *testing.T) {
	for seed := uint64(1); seed <= 3; seed++ {
		g := newEventGen(seed)
		ix := New(Config{MaxDetachedPerWorker: 6})
		type taken struct {
			snap   *Snapshot
			bytes  []byte
			digest [32]byte
		}
		var snaps []taken
		for step := 1; step <= 1500; step++ {
			_, _, _ = apply(ix, g.next())
			if step%100 == 0 {
				snaps = append(snaps, taken{ix.Snapshot(), snapshotOf(t, ix), ix.Digest()})
			}
		}
		for i, s := range snaps {
			var buf bytes.Buffer
			if _, err := s.snap.WriteTo(&buf); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(buf.Bytes(), s.bytes) {
				t.Fatalf("seed %d: snapshot %d changed after later writes", seed, i)
			}
			if s.snap.Digest() != s.digest {
				t.Fatalf("seed %d: snapshot %d digest changed after later writes", seed, i)
			}
		}
		if snaps[0].digest == snaps[len(snaps)-1].digest {
			t.Fatalf("seed %d: the index did not change: the test proves nothing", seed)
		}
	}
}

// goldenIndex is a small index covering every part of the format.
func goldenIndex(t *testing.T) *Index {
	ix := New(Config{})
	run(t, ix, []op{
		root(wA, ns1, u(1, 2), u(10, 20), TierGPU, StoreResult{Attached: 2}),
		root(wA, ns1, u(1), u(10), TierCPU, StoreResult{Attached: 1}),
		root(wA1, ns1, u(1, 3), u(10, 30), TierDisk, StoreResult{Attached: 2}),
		root(wB, ns2, u(7), u(70), TierGPU, StoreResult{Attached: 1}),
		under(wB, 99, u(8), u(80), TierCPU, StoreResult{Detached: 1}),
		{clear: &wC},
	})
	return ix
}

// TestSnapshotFormatIsStable pins version 1 of the format: a change to the bytes
// must come with a new version (regenerate with -update only then).
func TestSnapshotFormatIsStable(t *testing.T) {
	got := snapshotOf(t, goldenIndex(t))
	path := filepath.Join("testdata", "snapshot_v1.bin")
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("snapshot bytes changed:\n got %x\nwant %x", got, want)
	}
	if restore(t, want).Digest() != goldenIndex(t).Digest() {
		t.Fatal("golden snapshot restores to a different index")
	}
}

func TestReadFromConsumesExactlyTheSnapshot(t *testing.T) {
	data := snapshotOf(t, goldenIndex(t))
	r := bufio.NewReader(io.MultiReader(bytes.NewReader(data), bytes.NewReader([]byte("NEXT"))))
	ix := New(Config{})
	n, err := ix.ReadFrom(r)
	if err != nil || n != int64(len(data)) {
		t.Fatalf("ReadFrom = %d, %v; want %d, nil", n, err, len(data))
	}
	if rest, _ := io.ReadAll(r); string(rest) != "NEXT" {
		t.Fatalf("left %q in the reader, want %q", rest, "NEXT")
	}
}

func TestReadFromErrorLeavesIndexUnchanged(t *testing.T) {
	ix := goldenIndex(t)
	before := ix.Digest()
	data := snapshotOf(t, New(Config{}))
	if _, err := ix.ReadFrom(bytes.NewReader(data[:len(data)-1])); !errors.Is(err, ErrCorruptSnapshot) {
		t.Fatalf("truncated snapshot: err = %v, want ErrCorruptSnapshot", err)
	}
	if ix.Digest() != before {
		t.Fatal("failed ReadFrom changed the index")
	}
}

func TestReadFromReportsReaderErrors(t *testing.T) {
	boom := errors.New("disk on fire")
	_, err := New(Config{}).ReadFrom(io.MultiReader(bytes.NewReader([]byte(snapshotMagic)), iotestErrReader{boom}))
	if !errors.Is(err, boom) || errors.Is(err, ErrCorruptSnapshot) {
		t.Fatalf("err = %v, want the reader's error, not corruption", err)
	}
}

type iotestErrReader struct{ err error }

func (r iotestErrReader) Read([]byte) (int, error) { return 0, r.err }

func TestReadFromRejectsEveryTruncationAndBitFlip(t *testing.T) {
	data := snapshotOf(t, goldenIndex(t))
	for i := range len(data) {
		if _, err := New(Config{}).ReadFrom(bytes.NewReader(data[:i])); !errors.Is(err, ErrCorruptSnapshot) {
			t.Fatalf("truncated to %d of %d bytes: err = %v, want ErrCorruptSnapshot", i, len(data), err)
		}
		flipped := bytes.Clone(data)
		flipped[i] ^= 0x10
		if _, err := New(Config{}).ReadFrom(bytes.NewReader(flipped)); !errors.Is(err, ErrCorruptSnapshot) {
			t.Fatalf("bit flipped in byte %d: err = %v, want ErrCorruptSnapshot", i, err)
		}
	}
}

// handmade builds a snapshot with a correct checksum around body, so structural
// checks (not the checksum) must catch what is wrong with it.
func handmade(body func(e *encoder)) []byte {
	var buf bytes.Buffer
	e := encoder{w: bufio.NewWriter(&buf)}
	e.write([]byte(snapshotMagic))
	e.uvarint(snapshotVersion)
	body(&e)
	e.write(binary.LittleEndian.AppendUint32(nil, e.crc))
	_ = e.w.Flush()
	return buf.Bytes()
}

func worker(e *encoder, name string, rank uint64) {
	e.uvarint(uint64(len(name)))
	e.write([]byte(name))
	e.uvarint(rank)
}

// nodes writes nodes given as (parent position, key) pairs.
func nodes(e *encoder, parentKey ...uint64) {
	e.uvarint(uint64(len(parentKey) / 2))
	for i := 0; i < len(parentKey); i += 2 {
		e.uvarint(uint64(i/2+1) - parentKey[i]) // wraps for a parent at or after the node: still invalid
		e.u64(parentKey[i+1])
	}
}

func blocks(e *encoder, hashPosTiers ...uint64) {
	e.uvarint(uint64(len(hashPosTiers) / 3))
	for i := 0; i < len(hashPosTiers); i += 3 {
		e.u64(hashPosTiers[i])
		e.uvarint(hashPosTiers[i+1])
		e.write([]byte{byte(hashPosTiers[i+2])})
	}
}

func TestReadFromRejectsStructuralCorruption(t *testing.T) {
	oneWorker := func(e *encoder) { e.uvarint(1); worker(e, "a", 0) }
	tests := []struct {
		name string
		body func(e *encoder)
	}{
		{"workers out of order", func(e *encoder) { e.uvarint(2); worker(e, "b", 0); worker(e, "a", 0); nodes(e) }},
		{"duplicate worker", func(e *encoder) { e.uvarint(2); worker(e, "a", 1); worker(e, "a", 1); nodes(e) }},
		{"dp rank over 32 bits", func(e *encoder) { e.uvarint(1); worker(e, "a", 1<<32); nodes(e) }},
		{"worker name too long", func(e *encoder) { e.uvarint(1); e.uvarint(maxNameLen + 1) }},
		{"worker count over the limit", func(e *encoder) { e.uvarint(maxWorkers + 1) }},
		{"parent not an earlier node", func(e *encoder) { oneWorker(e); nodes(e, 0, ns1, 2, 10, 1, 20) }},
		{"duplicate edge", func(e *encoder) { oneWorker(e); nodes(e, 0, ns1, 1, 10, 1, 10) }},
		{"block at a namespace root", func(e *encoder) { oneWorker(e); nodes(e, 0, ns1, 1, 10); blocks(e, 5, 1, 1); e.uvarint(0) }},
		{"block at position 0", func(e *encoder) { oneWorker(e); nodes(e, 0, ns1, 1, 10); blocks(e, 5, 0, 1); e.uvarint(0) }},
		{"block past the last node", func(e *encoder) { oneWorker(e); nodes(e, 0, ns1, 1, 10); blocks(e, 5, 3, 1); e.uvarint(0) }},
		{"empty tier mask", func(e *encoder) { oneWorker(e); nodes(e, 0, ns1, 1, 10); blocks(e, 5, 2, 0); e.uvarint(0) }},
		{"tier mask past Disk", func(e *encoder) { oneWorker(e); nodes(e, 0, ns1, 1, 10); blocks(e, 5, 2, 8); e.uvarint(0) }},
		{"hashes not ascending", func(e *encoder) { oneWorker(e); nodes(e, 0, ns1, 1, 10); blocks(e, 6, 2, 1, 5, 2, 1); e.uvarint(0) }},
		{"node nobody holds", func(e *encoder) { oneWorker(e); nodes(e, 0, ns1, 1, 10, 1, 20); blocks(e, 5, 2, 1); e.uvarint(0) }},
		{"namespace root without children", func(e *encoder) { oneWorker(e); nodes(e, 0, ns1); blocks(e); e.uvarint(0) }},
		{"hash both attached and detached", func(e *encoder) {
			oneWorker(e)
			nodes(e, 0, ns1, 1, 10)
			blocks(e, 5, 2, 1)
			e.uvarint(1)
			e.u64(5)
			e.u64(77)
			e.u64(50)
			e.write([]byte{1})
		}},
		{"detached waiting for an attached parent", func(e *encoder) {
			oneWorker(e)
			nodes(e, 0, ns1, 1, 10)
			blocks(e, 5, 2, 1)
			e.uvarint(1)
			e.u64(6)
			e.u64(5)
			e.u64(50)
			e.write([]byte{1})
		}},
		{"varint over 64 bits", func(e *encoder) { e.write(bytes.Repeat([]byte{0xff}, 10)); e.write([]byte{1}) }},
		{"trailing data in place of the checksum", func(e *encoder) { oneWorker(e); nodes(e); blocks(e); e.uvarint(0); e.write([]byte{0}) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(Config{}).ReadFrom(bytes.NewReader(handmade(tt.body)))
			if !errors.Is(err, ErrCorruptSnapshot) {
				t.Fatalf("err = %v, want ErrCorruptSnapshot", err)
			}
		})
	}
	future := snapshotOf(t, goldenIndex(t))
	future[len(snapshotMagic)] = snapshotVersion + 1
	binary.LittleEndian.PutUint32(future[len(future)-4:], crc32.Checksum(future[:len(future)-4], castagnoli))
	if _, err := New(Config{}).ReadFrom(bytes.NewReader(future)); !errors.Is(err, ErrCorruptSnapshot) {
		t.Errorf("unknown version: err = %v, want ErrCorruptSnapshot", err)
	}
	// The valid neighbour of these cases is accepted, so the checks above are what rejects them.
	valid := handmade(func(e *encoder) { oneWorker(e); nodes(e, 0, ns1, 1, 10); blocks(e, 5, 2, 1); e.uvarint(0) })
	got := restore(t, valid).Match(ns1, u(10), nil, nil)
	if want := []WorkerMatch{m(WorkerKey{Worker: "a"}, 1, 0, 0)}; !reflect.DeepEqual(got, want) {
		t.Fatalf("valid handmade snapshot: Match = %+v, want %+v", got, want)
	}
}

// TestReadFromBogusCountsDoNotAllocateHugely: counts claiming billions of entries
// followed by nothing must fail on the missing data without allocating for them.
func TestReadFromBogusCountsDoNotAllocateHugely(t *testing.T) {
	cases := map[string][]byte{
		"nodes":    handmade(func(e *encoder) { e.uvarint(0); e.uvarint(1<<32 - 2) }),
		"blocks":   handmade(func(e *encoder) { e.uvarint(1); worker(e, "a", 0); nodes(e); e.uvarint(1<<32 - 1) }),
		"detached": handmade(func(e *encoder) { e.uvarint(1); worker(e, "a", 0); nodes(e); blocks(e); e.uvarint(1<<32 - 1) }),
	}
	for name, data := range cases {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		_, err := New(Config{}).ReadFrom(bytes.NewReader(data))
		runtime.ReadMemStats(&after)
		if !errors.Is(err, ErrCorruptSnapshot) {
			t.Errorf("%s: err = %v, want ErrCorruptSnapshot", name, err)
		}
		if grew := after.TotalAlloc - before.TotalAlloc; grew > 8<<20 {
			t.Errorf("%s: allocated %d bytes for a %d-byte input", name, grew, len(data))
		}
	}
}

func FuzzReadFrom(f *testing.F) {
	f.Add(snapshotOf(f, New(Config{})))
	f.Add(handmade(func(e *encoder) {
		e.uvarint(1)
		worker(e, "a", 0)
		nodes(e, 0, ns1, 1, 10)
		blocks(e, 5, 2, 1)
		e.uvarint(0)
	}))
	g := newEventGen(42)
	ix := New(Config{})
	for range 300 {
		_, _, _ = apply(ix, g.next())
	}
	f.Add(snapshotOf(f, ix))
	f.Fuzz(func(t *testing.T, data []byte) {
		inputs := [][]byte{data}
		if len(data) >= 4 { // also with a valid checksum, so structure checks are reached
			fixed := bytes.Clone(data)
			binary.LittleEndian.PutUint32(fixed[len(fixed)-4:], crc32.Checksum(fixed[:len(fixed)-4], castagnoli))
			inputs = append(inputs, fixed)
		}
		for _, in := range inputs {
			ix := New(Config{})
			n, err := ix.ReadFrom(bytes.NewReader(in))
			if err != nil {
				if !errors.Is(err, ErrCorruptSnapshot) {
					t.Fatalf("error %v does not wrap ErrCorruptSnapshot", err)
				}
				continue
			}
			if n > int64(len(in)) {
				t.Fatalf("ReadFrom claims %d bytes of a %d-byte input", n, len(in))
			}
			if err := checkInvariants(ix); err != nil {
				t.Fatalf("accepted snapshot breaks invariants: %v", err)
			}
			if again := restore(t, snapshotOf(t, ix)); again.Digest() != ix.Digest() {
				t.Fatalf("accepted snapshot does not round-trip: %x", in)
			}
		}
	})
}
