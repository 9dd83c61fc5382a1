package raftstore

import (
	"encoding/hex"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/internal/ingest"
	"github.com/kvindex/kvindex/internal/radix"
	"github.com/kvindex/kvindex/internal/workerspec"
)

var update = flag.Bool("update", false, "rewrite golden files in testdata")

func ws(worker string, rank uint32) ingest.Stream { return ingest.Stream{Worker: worker, DPRank: rank} }

// sampleBatches covers every op kind and flag, two workers sharing the name table,
// and a hash/key length mismatch that the log must carry as it is.
func sampleBatches() []ingest.StreamBatch {
	return []ingest.StreamBatch{
		{Stream: ws("vllm-0", 0), Seq: 7, Epoch: 0, Ops: []ingest.Op{
			{Kind: ingest.OpStored, Namespace: 0xabcdef, Hashes: []uint64{1, 2, 3}, Keys: []uint64{11, 12, 13}, Tier: radix.TierGPU},
			{Kind: ingest.OpStored, Namespace: 0xabcdef, Parent: 3, HasParent: true, Hashes: []uint64{4}, Keys: []uint64{14}, Tier: radix.TierCPU},
		}},
		{Stream: ws("vllm-1", 3), Seq: 1 << 40, Epoch: 2, Reset: true, Ops: []ingest.Op{
			{Kind: ingest.OpRemoved, Hashes: []uint64{^uint64(0)}, Tier: radix.TierDisk},
			{Kind: ingest.OpCleared},
		}},
		{Stream: ws("vllm-0", 1), Seq: 8, Ops: []ingest.Op{
			{Kind: ingest.OpStored, Hashes: []uint64{5, 6}, Keys: []uint64{15}, Tier: radix.TierGPU},
		}},
		{Stream: ws("vllm-0", 0), Seq: 9},
	}
}

func sampleWorker() workerspec.Spec {
	return workerspec.Spec{
		ID: "vllm-0", Model: "meta-llama/Llama-3.1-8B", BlockSize: 16, DPSize: 2,
		Endpoint: "tcp://10.0.0.7:5557", Topic: "kv@vllm-0", Replay: "tcp://10.0.0.7:5558",
		HTTP: "http://10.0.0.7:8000", Role: "prefill", Labels: map[string]string{"zone": "a", "pool": "h100"},
	}
}

func TestEntryRoundTrip(t *testing.T) {
	tests := []struct {
		name  string
		entry Entry
	}{
		{"batches", Entry{Type: EntryStreamBatches, Batches: sampleBatches()}},
		{"no batches", Entry{Type: EntryStreamBatches, Batches: []ingest.StreamBatch{}}},
		{"register", Entry{Type: EntryRegisterWorker, Worker: sampleWorker()}},
		{"register without labels", Entry{Type: EntryRegisterWorker, Worker: workerspec.Spec{ID: "w", Model: "m", BlockSize: 32}}},
		{"unregister", Entry{Type: EntryUnregisterWorker, ID: "vllm-0"}},
		{"unregister, fencing", Entry{Type: EntryUnregisterFenced, ID: "vllm-0"}},
		{"replace", Entry{Type: EntryReplaceWorker, Expected: sampleWorker(), Worker: workerspec.Spec{ID: "vllm-0", Model: "m", DPSize: 4}}},
		{"member address", Entry{Type: EntryMemberAddr, ID: "node-2", GRPCAddr: "10.0.0.2:7070"}},
		{"worker dead", Entry{Type: EntryWorkerDead, ID: "vllm-0"}},
		{"worker alive", Entry{Type: EntryWorkerAlive, ID: "vllm-0"}},
		{"member removed", Entry{Type: EntryMemberRemoved, ID: "node-2"}},
		{"known type marked ignorable", Entry{Type: EntryMemberRemoved, Ignorable: true, ID: "node-2"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			data, err := EncodeEntry(nil, &tc.entry)
			if err != nil {
				t.Fatalf("encode: %v", err)
			}
			got, err := DecodeEntry(data)
			if err != nil {
				t.Fatalf("decode: %v", err)
			}
			if !reflect.DeepEqual(got, tc.entry) {
				t.Errorf("round trip changed the entry:\n got %+v\nwant %+v", got, tc.entry)
			}
		})
	}
}

func TestEntryDropsParentWithoutHasParent(t *testing.T) {
	in := Entry{Type: EntryStreamBatches, Batches: []ingest.StreamBatch{{Stream: ws("w", 0), Seq: 1, Ops: []ingest.Op{
		{Kind: ingest.OpStored, Parent: 99, Hashes: []uint64{1}, Keys: []uint64{2}},
	}}}}
	data, err := EncodeEntry(nil, &in)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeEntry(data)
	if err != nil {
		t.Fatal(err)
	}
	if op := got.Batches[0].Ops[0]; op.Parent != 0 || op.HasParent {
		t.Errorf("parent without HasParent came back as %d/%v, want 0/false (the index ignores it)", op.Parent, op.HasParent)
	}
}

// TestEntryGolden pins the version 1 encoding: a replica of another build must read
// the same bytes the same way. Run with -update only for a deliberate format change
// (which needs a new version byte).
func TestEntryGolden(t *testing.T) {
	entries := map[string]Entry{
		"batches":           {Type: EntryStreamBatches, Batches: sampleBatches()},
		"register":          {Type: EntryRegisterWorker, Worker: sampleWorker()},
		"unregister":        {Type: EntryUnregisterWorker, ID: "vllm-0"},
		"unregister_fenced": {Type: EntryUnregisterFenced, ID: "vllm-0"},
		"replace":           {Type: EntryReplaceWorker, Expected: sampleWorker(), Worker: workerspec.Spec{ID: "vllm-0", Model: "m", DPSize: 4}},
		"member":            {Type: EntryMemberAddr, ID: "node-2", GRPCAddr: "10.0.0.2:7070"},
		"dead":              {Type: EntryWorkerDead, ID: "vllm-0"},
		"alive":             {Type: EntryWorkerAlive, ID: "vllm-0"},
	}
	for name, e := range entries {
		t.Run(name, func(t *testing.T) {
			data, err := EncodeEntry(nil, &e)
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join("testdata", "entry_v1_"+name+".hex")
			if *update {
				if err := os.WriteFile(path, []byte(hex.EncodeToString(data)+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			golden, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			want, err := hex.DecodeString(strings.TrimSpace(string(golden)))
			if err != nil {
				t.Fatal(err)
			}
			if string(data) != string(want) {
				t.Errorf("encoding changed:\n got %x\nwant %x", data, want)
			}
			got, err := DecodeEntry(want)
			if err != nil || !reflect.DeepEqual(got, e) {
				t.Errorf("golden bytes decode to %+v, %v; want %+v", got, err, e)
			}
		})
	}
}

func TestDecodeEntryErrors(t *testing.T) {
	valid, err := EncodeEntry(nil, &Entry{Type: EntryStreamBatches, Batches: sampleBatches()})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name      string
		data      []byte
		want      error
		ignorable bool
	}{
		{"empty", nil, ErrCorruptEntry, false},
		{"header only byte", []byte{1}, ErrCorruptEntry, false},
		{"newer version", []byte{2, 1, 0, 0}, ErrUnknownEntryType, false},
		{"unknown type", []byte{1, 0x7f, 1, 2, 3}, ErrUnknownEntryType, false},
		{"unknown ignorable type", []byte{1, 0x80 | 0x7f, 1, 2, 3}, ErrUnknownEntryType, true},
		{"trailing byte", append(append([]byte{}, valid...), 0), ErrCorruptEntry, false},
		{"worker count beyond data", []byte{1, 1, 0x7f}, ErrCorruptEntry, false},
		{"batch names missing worker", []byte{1, 1, 1, 1, 'w', 1, 5, 0, 0, 0, 0, 0}, ErrCorruptEntry, false},
		{"empty worker name", []byte{1, 1, 1, 0, 0}, ErrInvalidEntry, false},
		{"worker name over the limit", append(appendString([]byte{1, 1, 1}, strings.Repeat("w", maxNameLen+1)), 0), ErrInvalidEntry, false},
		{"string length beyond data", []byte{1, 3, 5, 'w'}, ErrCorruptEntry, false},
		{"unknown batch flag", []byte{1, 1, 1, 1, 'w', 1, 0, 0, 1, 0, 2, 0}, ErrCorruptEntry, false},
		{"unknown op kind", []byte{1, 1, 1, 1, 'w', 1, 0, 0, 1, 0, 0, 1, 9}, ErrCorruptEntry, false},
		{"varint overflow", []byte{1, 3, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}, ErrCorruptEntry, false},
		{"dp rank over 32 bits", []byte{1, 1, 1, 1, 'w', 1, 0, 0x80, 0x80, 0x80, 0x80, 0x10, 1, 0, 0, 0}, ErrCorruptEntry, false},
		{"empty unregister id", []byte{1, 3, 0}, ErrInvalidEntry, false},
		{"unregister id over the limit", rawIDEntry(EntryUnregisterWorker, strings.Repeat("x", maxNameLen+1)), ErrInvalidEntry, false},
		{"member address over the limit", appendString(rawIDEntry(EntryMemberAddr, "n"), strings.Repeat("a", maxStringLen+1)), ErrInvalidEntry, false},
		{"empty id then a trailing byte", []byte{1, 3, 0, 0}, ErrCorruptEntry, false},
		{"replace changing the id", appendWorker(appendWorker([]byte{1, 6}, &workerspec.Spec{ID: "a"}), &workerspec.Spec{ID: "b"}), ErrInvalidEntry, false},
		{"bad has-parent byte", []byte{1, 1, 1, 1, 'w', 1, 0, 0, 1, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2}, ErrCorruptEntry, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e, err := DecodeEntry(tc.data)
			if !errors.Is(err, tc.want) {
				t.Fatalf("error %v, want %v", err, tc.want)
			}
			if e.Ignorable != tc.ignorable {
				t.Errorf("Ignorable = %v, want %v", e.Ignorable, tc.ignorable)
			}
		})
	}
	for i := range valid {
		if _, err := DecodeEntry(valid[:i]); !errors.Is(err, ErrCorruptEntry) {
			t.Fatalf("entry cut to %d of %d bytes: error %v, want ErrCorruptEntry", i, len(valid), err)
		}
	}
}

func TestEncodeEntryRejectsWhatTheLogCannotCarry(t *testing.T) {
	tests := []struct {
		name  string
		batch ingest.StreamBatch
	}{
		{"unknown op kind", ingest.StreamBatch{Stream: ws("w", 0), Ops: []ingest.Op{{Kind: 9}}}},
		{"empty worker name", ingest.StreamBatch{Stream: ws("", 0)}},
		{"worker name over the snapshot limit", ingest.StreamBatch{Stream: ws(strings.Repeat("x", maxNameLen+1), 0)}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := EncodeEntry(nil, &Entry{Type: EntryStreamBatches, Batches: []ingest.StreamBatch{tc.batch}})
			if !errors.Is(err, ErrInvalidBatch) {
				t.Errorf("error %v, want ErrInvalidBatch", err)
			}
		})
	}
	for _, w := range []workerspec.Spec{{ID: ""}, {ID: "w", BlockSize: -1}, {ID: "w", Labels: map[string]string{"k": strings.Repeat("v", maxStringLen+1)}}} {
		if _, err := EncodeEntry(nil, &Entry{Type: EntryRegisterWorker, Worker: w}); !errors.Is(err, ErrInvalidWorker) {
			t.Errorf("register %+.60v: error %v, want ErrInvalidWorker", w, err)
		}
	}
	long, huge := strings.Repeat("x", maxNameLen+1), strings.Repeat("a", maxStringLen+1)
	for _, e := range []Entry{
		{Type: EntryUnregisterWorker, ID: long},
		{Type: EntryUnregisterWorker, ID: ""},
		{Type: EntryMemberRemoved, ID: long},
		{Type: EntryWorkerDead, ID: ""},
		{Type: EntryWorkerAlive, ID: long},
		{Type: EntryMemberAddr, ID: "", GRPCAddr: "a:1"},
		{Type: EntryMemberAddr, ID: long, GRPCAddr: "a:1"},
		{Type: EntryMemberAddr, ID: "n", GRPCAddr: huge},
	} {
		if _, err := EncodeEntry(nil, &e); !errors.Is(err, ErrInvalidEntry) {
			t.Errorf("%v with a %d-byte id and a %d-byte address: error %v, want ErrInvalidEntry", e.Type, len(e.ID), len(e.GRPCAddr), err)
		}
	}
	if _, err := EncodeEntry(nil, &Entry{Type: 0x55}); !errors.Is(err, ErrUnknownEntryType) {
		t.Errorf("unknown type: error %v, want ErrUnknownEntryType", err)
	}
}

// TestBatchEncoderKeepsNothingOfARefusedBatch checks that a refused batch leaves
// the entry being filled as it was, so the batches before it still decode.
func TestBatchEncoderKeepsNothingOfARefusedBatch(t *testing.T) {
	var be batchEncoder
	good := sampleBatches()
	if err := be.add(&good[0]); err != nil {
		t.Fatal(err)
	}
	bad := ingest.StreamBatch{Stream: ws("new-worker", 0), Ops: []ingest.Op{{Kind: ingest.OpCleared}, {Kind: 42}}}
	if err := be.add(&bad); !errors.Is(err, ErrInvalidBatch) {
		t.Fatalf("error %v, want ErrInvalidBatch", err)
	}
	got, err := DecodeEntry(be.finish(nil))
	if err != nil {
		t.Fatal(err)
	}
	if want := good[:1]; !reflect.DeepEqual(got.Batches, want) {
		t.Errorf("entry holds %+v, want %+v", got.Batches, want)
	}
}

// The decoder cuts every list of an entry from shared slabs: growing one
// decoded list (or op list) must never write into the next one.
func TestDecodedListsDoNotShareCapacity(t *testing.T) {
	data, err := EncodeEntry(nil, &Entry{Type: EntryStreamBatches, Batches: sampleBatches()})
	if err != nil {
		t.Fatal(err)
	}
	e, err := DecodeEntry(data)
	if err != nil {
		t.Fatal(err)
	}
	for i := range e.Batches {
		b := &e.Batches[i]
		if cap(b.Ops) != len(b.Ops) {
			t.Errorf("batch %d: ops have capacity %d beyond their %d", i, cap(b.Ops), len(b.Ops))
		}
		for j := range b.Ops {
			_ = append(b.Ops[j].Hashes, 0xdead)
			_ = append(b.Ops[j].Keys, 0xbeef)
		}
		_ = append(b.Ops, ingest.Op{Kind: ingest.OpCleared})
	}
	if want := sampleBatches(); !reflect.DeepEqual(e.Batches, want) {
		t.Fatalf("appending to decoded lists changed the entry:\n got %+v\nwant %+v", e.Batches, want)
	}
}

// TestScratchDecodesEveryEntryAsAFreshDecoderDoes: the FSM decodes entry after
// entry into the same memory, so nothing of an earlier entry may show through
// in a later one: a reset flag, a stored op's parent or keys in the slot of a
// removed op, lists of another length.
func TestScratchDecodesEveryEntryAsAFreshDecoderDoes(t *testing.T) {
	batches := sampleBatches()
	reversed := slices.Clone(batches)
	slices.Reverse(reversed)
	for i := range reversed {
		reversed[i].Ops = slices.Clone(reversed[i].Ops)
		slices.Reverse(reversed[i].Ops)
	}
	entries := []Entry{
		{Type: EntryStreamBatches, Batches: batches},
		{Type: EntryStreamBatches, Batches: reversed},
		{Type: EntryRegisterWorker, Worker: sampleWorker()},
		{Type: EntryStreamBatches, Batches: batches[1:2]},
		{Type: EntryStreamBatches, Batches: []ingest.StreamBatch{}},
		{Type: EntryStreamBatches, Batches: batches},
	}
	var scratch decodeScratch
	for i, e := range entries {
		data, err := EncodeEntry(nil, &e)
		if err != nil {
			t.Fatal(err)
		}
		want, err := DecodeEntry(data)
		if err != nil {
			t.Fatal(err)
		}
		got, err := decodeEntry(data, &scratch)
		if err != nil {
			t.Fatalf("entry %d: %v", i, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("entry %d decoded into scratch memory as\n%+v\nwant\n%+v", i, got, want)
		}
	}
}

// TestScratchDecodingAllocatesOnlyTheNames: once a scratch has decoded an
// entry, decoding another of its size allocates only the worker name table
// (the slice and one string per name): the lists, ops and batches are reused,
// and no error label is built unless there is an error.
func TestScratchDecodingAllocatesOnlyTheNames(t *testing.T) {
	data, err := EncodeEntry(nil, &Entry{Type: EntryStreamBatches, Batches: sampleBatches()})
	if err != nil {
		t.Fatal(err)
	}
	var scratch decodeScratch
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := decodeEntry(data, &scratch); err != nil {
			t.Fatal(err)
		}
	})
	const names = 2 // vllm-0, vllm-1
	if allocs > 1+names {
		t.Errorf("%.0f allocations per decode into a warm scratch, want at most %d", allocs, 1+names)
	}
}

func FuzzDecodeEntry(f *testing.F) {
	for _, e := range []Entry{
		{Type: EntryStreamBatches, Batches: sampleBatches()},
		{Type: EntryRegisterWorker, Worker: sampleWorker()},
		{Type: EntryUnregisterWorker, ID: "w"},
		{Type: EntryMemberAddr, ID: "n", GRPCAddr: "a:1"},
		{Type: EntryMemberRemoved, ID: "n"},
		{Type: EntryWorkerDead, ID: "w"},
	} {
		data, err := EncodeEntry(nil, &e)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte{1, 0xff})
	primer, err := EncodeEntry(nil, &Entry{Type: EntryStreamBatches, Batches: sampleBatches()})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		e, err := DecodeEntry(data)
		// The same input decoded into memory that held another entry.
		var scratch decodeScratch
		if _, err := decodeEntry(primer, &scratch); err != nil {
			t.Fatal(err)
		}
		if e2, err2 := decodeEntry(data, &scratch); !reflect.DeepEqual(e2, e) || (err == nil) != (err2 == nil) {
			t.Fatalf("decoded into scratch memory: %+v, %v; fresh: %+v, %v", e2, err2, e, err)
		}
		if err != nil {
			if !errors.Is(err, ErrCorruptEntry) && !errors.Is(err, ErrUnknownEntryType) && !errors.Is(err, ErrInvalidEntry) {
				t.Fatalf("error %v wraps no sentinel", err)
			}
			return
		}
		again, err := EncodeEntry(nil, &e)
		if err != nil {
			t.Fatalf("decoded entry %+v does not encode: %v", e, err)
		}
		e2, err := DecodeEntry(again)
		if err != nil {
			t.Fatalf("re-encoded entry does not decode: %v", err)
		}
		if !reflect.DeepEqual(e, e2) {
			t.Fatalf("round trip changed the entry:\n%+v\n%+v", e, e2)
		}
	})
}

// rawIDEntry is a t entry holding id as versions before the encoder checked ids
// wrote it, whatever its length.
func rawIDEntry(t EntryType, id string) []byte {
	return appendString(appendHeader(nil, t), id)
}

// FuzzEncodeEntry: whatever entry EncodeEntry writes, DecodeEntry reads back as
// it was; whatever it refuses, it refuses with the sentinel of its kind. The
// lengths are fuzzed apart from the bytes so that ids and addresses reach the
// limits (1024 and 64 KiB) and step over them.
func FuzzEncodeEntry(f *testing.F) {
	for _, n := range []uint32{0, 1, maxNameLen - 1, maxNameLen, maxNameLen + 1} {
		for typ := range uint8(10) {
			f.Add(typ, "w", n, "a:1", uint32(3))
		}
	}
	f.Add(uint8(EntryMemberAddr), "n", uint32(1), "a", uint32(maxStringLen))
	f.Add(uint8(EntryMemberAddr), "n", uint32(1), "a", uint32(maxStringLen+1))
	f.Add(uint8(EntryRegisterWorker), "w", uint32(4), "m", uint32(maxStringLen+1))
	f.Fuzz(func(t *testing.T, typ uint8, id string, idLen uint32, addr string, addrLen uint32) {
		// A string of n bytes, cycling through s (or 'x' when s is empty).
		sized := func(s string, n uint32) string {
			if s == "" {
				s = "x"
			}
			return strings.Repeat(s, int(n)/len(s)+1)[:n]
		}
		id, addr = sized(id, idLen%(2*maxNameLen)), sized(addr, addrLen%(maxStringLen+maxNameLen))
		spec := workerspec.Spec{ID: id, Model: addr, BlockSize: 16, Labels: map[string]string{"k": addr}}
		e := Entry{Type: EntryType(typ), ID: id}
		switch e.Type {
		case EntryStreamBatches:
			e.Batches = []ingest.StreamBatch{{Stream: ws(id, 1), Seq: 2, Ops: []ingest.Op{{Kind: ingest.OpCleared}}}}
			e.ID = ""
		case EntryRegisterWorker:
			e.Worker, e.ID = spec, ""
		case EntryReplaceWorker:
			e.Expected, e.Worker, e.ID = workerspec.Spec{ID: id}, spec, ""
		case EntryMemberAddr:
			e.GRPCAddr = addr
		}
		data, err := EncodeEntry(nil, &e)
		if err != nil {
			if !errors.Is(err, ErrInvalidEntry) && !errors.Is(err, ErrInvalidBatch) && !errors.Is(err, ErrInvalidWorker) && !errors.Is(err, ErrUnknownEntryType) {
				t.Fatalf("%v: error %v wraps no sentinel", e.Type, err)
			}
			return
		}
		got, err := DecodeEntry(data)
		if err != nil {
			t.Fatalf("%v with a %d-byte id and a %d-byte address: encoded, but the decoder refuses it: %v", e.Type, len(id), len(addr), err)
		}
		if !reflect.DeepEqual(got, e) {
			t.Fatalf("%v: round trip changed the entry", e.Type)
		}
	})
}
