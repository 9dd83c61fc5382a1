package fakeengine

import (
	"bytes"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// readHexGolden reads a testdata .hex file: hex bytes, '#' starts a comment.
func readHexGolden(t *testing.T, name string) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	var digits strings.Builder
	for _, line := range strings.Split(string(data), "\n") {
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		digits.WriteString(strings.Join(strings.Fields(line), ""))
	}
	out, err := hex.DecodeString(digits.String())
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return out
}

func TestEncodeBatchMatchesGoldenPayloads(t *testing.T) {
	tests := []struct {
		golden string
		wire   WireFormat
		batch  Batch
	}{
		{"batch_map.hex", WireMap, Batch{TS: 1.5, DPRank: 1, Events: []Event{
			{Kind: BlockStored, BlockHashes: []uint64{0xfedcba9876543210}, TokenIDs: []uint32{1, 2, 3, 200},
				BlockSize: 4, Medium: MediumGPU, ExtraKeys: [][]string{nil}},
			{Kind: BlockRemoved, BlockHashes: []uint64{5}, Medium: MediumCPU},
			{Kind: AllBlocksCleared},
		}}},
		{"batch_array.hex", WireArray, Batch{TS: 2.25, DPRank: 2, Events: []Event{
			{Kind: BlockStored, BlockHashes: []uint64{1 << 63, 42}, ParentHash: 300, HasParent: true,
				TokenIDs: []uint32{0, 127, 128, 255, 256, 65535, 65536, 70000}, BlockSize: 4,
				LoRAID: 2, LoRAName: "sql", Medium: MediumCPU, ExtraKeys: [][]string{{"sql", "salt"}, {"sql"}}},
			{Kind: BlockRemoved, BlockHashes: []uint64{7}},
			{Kind: AllBlocksCleared},
		}}},
	}
	for _, tt := range tests {
		t.Run(tt.golden, func(t *testing.T) {
			want := readHexGolden(t, tt.golden)
			got, err := EncodeBatch(tt.batch, tt.wire)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("payload differs from %s\n got: % x\nwant: % x", tt.golden, got, want)
			}
			// A generic msgpack decoder reads it back as the same structure.
			var generic []any
			if err := msgpack.Unmarshal(got, &generic); err != nil || len(generic) != 3 {
				t.Fatalf("generic decode: %v, %v", generic, err)
			}
		})
	}
}

func TestEncodeBatchRejectsUnknownInput(t *testing.T) {
	if _, err := EncodeBatch(Batch{}, "yaml"); err == nil {
		t.Error("wire format yaml accepted")
	}
	if _, err := EncodeBatch(Batch{Events: []Event{{Kind: "BlockMoved"}}}, WireMap); err == nil {
		t.Error("unknown event kind accepted")
	}
}
