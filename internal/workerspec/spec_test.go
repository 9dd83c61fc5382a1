package workerspec

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestParseWorkerFlag(t *testing.T) {
	for _, c := range []struct {
		in   string
		want Spec
		err  string
	}{
		{
			in: "id=w1,endpoint=tcp://10.0.0.5:5557,replay=tcp://10.0.0.5:5558,model=M,block-size=16,dp-size=2",
			want: Spec{ID: "w1", Endpoint: "tcp://10.0.0.5:5557", Replay: "tcp://10.0.0.5:5558", Model: "M",
				BlockSize: 16, DPSize: 2},
		},
		{
			in:   "id=pod-7,model=meta/llama@v1,topic=kv@pod-7@meta/llama,role=prefill,http=http://pod-7:8000,label.zone=a",
			want: Spec{ID: "pod-7", Model: "meta/llama@v1", Topic: "kv@pod-7@meta/llama", Role: "prefill", HTTP: "http://pod-7:8000", Labels: map[string]string{"zone": "a"}},
		},
		{in: "id=w1", err: "model must not be empty"},
		{in: "model=M", err: "id must not be empty"},
		{in: "id=w 1,model=M", err: "whitespace"},
		{in: "id=w1,model=M,colour=red", err: `unknown key "colour"`},
		{in: "id=w1,model=M,id=w2", err: "id given twice"},
		{in: "id=w1,model=M,block-size=x", err: "not an integer"},
		{in: "id=w1,model=M,block-size=-1", err: "block-size=-1"},
		{in: "id=w1,model=M,dp-size=5000", err: "dp-size=5000"},
		{in: "id=w1,model=M,role=boss", err: `role="boss"`},
		{in: "id=w1,model=M,endpoint=10.0.0.5:5557", err: "want a tcp://, ipc:// or inproc://"},
		{in: "id=w1,model=M,endpoint=tcp://h:65535,dp-size=2", err: "dp rank 1"},
		{in: "id=w1,model=M,replay=tcp://:5558", err: "empty host"},
		{in: "id=w1,model", err: "not key=value"},
		{in: "id=" + strings.Repeat("w", MaxNameBytes+1) + ",model=M", err: "id is 257 bytes"},
		{in: "id=w1,model=" + strings.Repeat("m", MaxNameBytes+1), err: "model is 257 bytes"},
	} {
		got, err := Parse(c.in)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) || !errors.Is(err, ErrInvalid) {
				t.Errorf("Parse(%q) error = %v, want ErrInvalid mentioning %q", c.in, err, c.err)
			}
			continue
		}
		if err != nil || !got.Equal(c.want) {
			t.Errorf("Parse(%q) = %+v, %v; want %+v", c.in, got, err, c.want)
			continue
		}
		back, err := Parse(got.String())
		if err != nil || !back.Equal(got) {
			t.Errorf("String() of %q does not parse back: %q -> %+v, %v", c.in, got.String(), back, err)
		}
	}
}

func TestOffsetEndpointPerRank(t *testing.T) {
	for _, c := range []struct {
		ep   string
		rank uint32
		want string
	}{
		{"tcp://10.0.0.5:5557", 0, "tcp://10.0.0.5:5557"},
		{"tcp://10.0.0.5:5557", 3, "tcp://10.0.0.5:5560"},
		{"tcp://[::1]:5557", 1, "tcp://[::1]:5558"},
		{"ipc:///tmp/kv", 0, "ipc:///tmp/kv"},
		{"ipc:///tmp/kv", 2, "ipc:///tmp/kv_dp2"},
		{"inproc://kv", 1, "inproc://kv_dp1"},
	} {
		got, err := OffsetEndpoint(c.ep, c.rank)
		if err != nil || got != c.want {
			t.Errorf("OffsetEndpoint(%q, %d) = %q, %v; want %q", c.ep, c.rank, got, err, c.want)
		}
	}
	for _, bad := range []string{"tcp://host", "tcp://host:x", "tcp://host:0", "udp://h:1", "ipc://"} {
		if _, err := OffsetEndpoint(bad, 0); err == nil {
			t.Errorf("OffsetEndpoint(%q) accepted", bad)
		}
	}
}

func TestParseWorkersFile(t *testing.T) {
	good := `workers:
  - id: w1
    model: M
    endpoint: tcp://10.0.0.5:5557
    replay: tcp://10.0.0.5:5558
    block-size: 16
    dp-size: 2
    labels: {zone: a}
  - id: w2
    model: M
`
	ws, err := ParseFile([]byte(good))
	if err != nil {
		t.Fatal(err)
	}
	want := []Spec{
		{ID: "w1", Model: "M", Endpoint: "tcp://10.0.0.5:5557", Replay: "tcp://10.0.0.5:5558", BlockSize: 16, DPSize: 2, Labels: map[string]string{"zone": "a"}},
		{ID: "w2", Model: "M"},
	}
	if len(ws) != len(want) || !ws[0].Equal(want[0]) || !ws[1].Equal(want[1]) {
		t.Errorf("ParseFile = %+v, want %+v", ws, want)
	}
	if ws, err := ParseFile(nil); err != nil || len(ws) != 0 {
		t.Errorf("empty file = %v, %v; want no workers", ws, err)
	}
	for _, c := range []struct{ yaml, err string }{
		{"workers:\n  - id: w1\n    model: M\n    colour: red\n", "colour"},
		{"workers:\n  - id: w1\n    model: M\n  - id: w1\n    model: M\n", "listed twice"},
		{"workers:\n  - id: w1\n", "workers[0]"},
		{"workers: [", "invalid worker"},
	} {
		if _, err := ParseFile([]byte(c.yaml)); err == nil || !strings.Contains(err.Error(), c.err) {
			t.Errorf("ParseFile(%q) error = %v, want %q", c.yaml, err, c.err)
		}
	}
	path := filepath.Join(t.TempDir(), "w.yaml")
	if err := os.WriteFile(path, []byte(good), 0o644); err != nil {
		t.Fatal(err)
	}
	if ws, err := LoadFile(path); err != nil || len(ws) != 2 {
		t.Errorf("LoadFile = %v, %v", ws, err)
	}
	if _, err := LoadFile(path + ".missing"); err == nil {
		t.Error("LoadFile of a missing file succeeded")
	}
}

// FuzzParse: any --worker value either fails with ErrInvalid or
// gives a valid spec that formats back to itself.
func FuzzParse(f *testing.F) {
	f.Add("id=w1,endpoint=tcp://10.0.0.5:5557,replay=tcp://10.0.0.5:5558,model=M,block-size=16,dp-size=2")
	f.Add("id=p,model=m,topic=kv@p@m,label.zone=a,role=decode")
	f.Add("id=,model==,=")
	f.Fuzz(func(t *testing.T, s string) {
		w, err := Parse(s)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("Parse(%q) error %v does not wrap ErrInvalid", s, err)
			}
			return
		}
		if err := w.Validate(); err != nil {
			t.Fatalf("Parse(%q) returned an invalid spec: %v", s, err)
		}
		if strings.ContainsAny(w.String(), "\x00") {
			return
		}
		back, err := Parse(w.String())
		if err == nil && !back.Equal(w) {
			t.Fatalf("%q -> %+v -> %q -> %+v", s, w, w.String(), back)
		}
	})
}

// FuzzParseFile: any workers file either fails with ErrInvalid or gives
// valid, distinct workers.
func FuzzParseFile(f *testing.F) {
	f.Add([]byte("workers:\n  - id: w1\n    model: M\n    endpoint: tcp://h:1\n"))
	f.Add([]byte("workers: [{id: a, model: b, dp-size: 3, labels: {x: y}}]"))
	f.Add([]byte(""))
	f.Fuzz(func(t *testing.T, data []byte) {
		ws, err := ParseFile(data)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
			return
		}
		seen := map[string]bool{}
		for _, w := range ws {
			if err := w.Validate(); err != nil || seen[w.ID] {
				t.Fatalf("ParseWorkers returned %+v (valid: %v, duplicate: %v)", w, err, seen[w.ID])
			}
			seen[w.ID] = true
		}
	})
}

func TestRoleBothIsAggregated(t *testing.T) {
	w, err := Parse("id=w,model=m,role=both")
	if err != nil || w.Role != "aggregated" {
		t.Errorf("Parse(role=both) = %+v, %v; want role aggregated", w, err)
	}
	ws, err := ParseFile([]byte("workers: [{id: w, model: m, role: both}]"))
	if err != nil || len(ws) != 1 || ws[0].Role != "aggregated" {
		t.Errorf("ParseFile(role: both) = %+v, %v; want role aggregated", ws, err)
	}
}

func TestParseListSplitsOnSemicolons(t *testing.T) {
	tests := []struct {
		in      string
		wantIDs []string
		wantErr bool
	}{
		{"id=a,model=M", []string{"a"}, false},
		{"id=a,model=M;id=b,model=M", []string{"a", "b"}, false},
		{" id=a,model=M ; ; id=b,model=M; ", []string{"a", "b"}, false},
		{" ; ", nil, true},
		{"id=a,model=M;model=M", nil, true}, // the second has no id
	}
	for _, tt := range tests {
		ws, err := ParseList(tt.in)
		var ids []string
		for _, w := range ws {
			ids = append(ids, w.ID)
		}
		if (err != nil) != tt.wantErr || !slices.Equal(ids, tt.wantIDs) {
			t.Errorf("ParseList(%q) = %v, %v; want ids %v, error %v", tt.in, ids, err, tt.wantIDs, tt.wantErr)
		}
	}
}
