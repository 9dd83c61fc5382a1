package fakeengine

import (
	"testing"
)

func FuzzFaultsPatch(f *testing.F) {
	for _, s := range []string{`{}`, `{"fail_rate":0.5}`, `{"hang_before_first_token":"1s"}`, `{"fail_status":429}`, `[`, `{"drop_every_n_batches":-1}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		got, err := DefaultConfig().Faults.patch(raw)
		if err == nil {
			if verr := got.validate(); verr != nil {
				t.Fatalf("patch(%q) accepted invalid faults %+v: %v", raw, got, verr)
			}
		}
	})
}
