package wire

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

// FuzzDecode checks that no input panics, that every error is a sentinel one, and
// that whatever decodes survives a round trip through every wire form unchanged.
func FuzzDecode(f *testing.F) {
	files, err := filepath.Glob(filepath.Join("testdata", "decode", "*.hex"))
	if err != nil || len(files) == 0 {
		f.Fatalf("golden files: %v (%d found)", err, len(files))
	}
	for _, name := range files {
		text, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		payload, err := parseAnnotatedHex(string(text))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(payload)
	}
	batch, _ := benchBatch()
	f.Add(encodeBatch(batch, false, false))
	f.Add(encodeBatch(batch, true, true))
	f.Add(h("92 cb 0000000000000000 dd ffffffff"))

	dec := NewDecoder(1 << 20)
	f.Fuzz(func(t *testing.T, payload []byte) {
		got, _, err := dec.Decode(payload)
		if err != nil {
			if !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrOversize) {
				t.Fatalf("error %v wraps no sentinel", err)
			}
			return
		}
		if math.IsNaN(got.TS) {
			got.TS = 0 // NaN != NaN would fail the comparison below for no fault
		}
		for _, batchAsMap := range []bool{false, true} {
			for _, eventsAsMap := range []bool{false, true} {
				again, _, err := NewDecoder(0).Decode(encodeBatch(got, batchAsMap, eventsAsMap))
				if err != nil {
					t.Fatalf("re-encoded batch (map batch %v, map events %v) does not decode: %v", batchAsMap, eventsAsMap, err)
				}
				if !reflect.DeepEqual(again, got) {
					t.Fatalf("round trip (map batch %v, map events %v) changed the batch:\n got %+v\nwant %+v",
						batchAsMap, eventsAsMap, again, got)
				}
			}
		}
	})
}
