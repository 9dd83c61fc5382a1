package traces

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// TestGeneratorsGolden pins every generator's summary under seed 7: a change in
// any generator's output (tokens, arrivals, sessions) changes its digest.
func TestGeneratorsGolden(t *testing.T) {
	golden := map[string]Summary{
		"agentic":       {300, 20, 44, 1408631, 15515, 87909, 5105, 38424966813, 0x37b42a0b39d476f7},
		"burst":         {300, 49, 49, 404707, 59851, 25153, 4111, 30351796884, 0x97b2dbe350eb5da4},
		"chat":          {300, 47, 0, 363448, 50034, 22582, 5424, 95943273058, 0x726dc0a0cfdb3f8a},
		"document":      {300, 150, 0, 1732878, 60149, 108167, 14126, 40863290018, 0x5da444f8514dcf0},
		"shared-system": {300, 300, 0, 498287, 46374, 31000, 4805, 26959331534, 0xd18a3a24d65f7f41},
		"unique":        {300, 300, 0, 53318, 34509, 3183, 3183, 34057494197, 0xd4a92fa97832aa32},
	}
	if len(golden) != len(Names()) {
		t.Fatalf("golden covers %d generators, there are %d", len(golden), len(Names()))
	}
	for _, name := range Names() {
		t.Run(name, func(t *testing.T) {
			got := Summarize(generators[name](Options{Seed: 7, Requests: 300, Rate: 10}))
			if got != golden[name] {
				t.Errorf("summary\n got  %+v\n want %+v", got, golden[name])
			}
		})
	}
}

func TestGeneratorsAreDeterministicAndSeeded(t *testing.T) {
	for _, name := range Names() {
		t.Run(name, func(t *testing.T) {
			o := Options{Seed: 11, Requests: 120, Rate: 30}
			a, b := Summarize(generators[name](o)), Summarize(generators[name](o))
			if a != b {
				t.Fatalf("same seed, different traces: %+v vs %+v", a, b)
			}
			o.Seed = 12
			if c := Summarize(generators[name](o)); c.Digest == a.Digest {
				t.Fatalf("seeds 11 and 12 give the same trace")
			}
		})
	}
}

// TestGeneratorsInvariants checks what the bench relies on: the requested count,
// arrival order, ids, token range, sessions, and equal arrivals within a group.
func TestGeneratorsInvariants(t *testing.T) {
	for _, name := range Names() {
		t.Run(name, func(t *testing.T) {
			tr := generators[name](Options{Seed: 3, Requests: 250, Rate: 15})
			if tr.Name != name || len(tr.Requests) != 250 {
				t.Fatalf("name %q, %d requests", tr.Name, len(tr.Requests))
			}
			groupAt := map[int]time.Duration{}
			for i, r := range tr.Requests {
				if r.ID != i || r.Session == "" || len(r.Prompt) == 0 || r.OutputTokens <= 0 {
					t.Fatalf("request %d: %+v", i, r)
				}
				if i > 0 && r.Arrival < tr.Requests[i-1].Arrival {
					t.Fatalf("request %d arrives before %d", i, i-1)
				}
				for _, tok := range r.Prompt {
					if tok >= 256 {
						t.Fatalf("request %d: token %d", i, tok)
					}
				}
				if r.Group != 0 {
					if at, ok := groupAt[r.Group]; ok && at != r.Arrival {
						t.Fatalf("group %d: arrivals %v and %v", r.Group, at, r.Arrival)
					}
					groupAt[r.Group] = r.Arrival
				}
			}
		})
	}
}

func TestMooncakeSample(t *testing.T) {
	tr, err := LoadMooncakeFile("testdata/mooncake_sample.jsonl", MooncakeOptions{SpeedUp: 2})
	if err != nil {
		t.Fatal(err)
	}
	wantLens := []int{1200, 1536, 100, 2049, 512}
	wantAt := []time.Duration{0, 750 * time.Millisecond, 750 * time.Millisecond, 1513500 * time.Microsecond, 2 * time.Second}
	wantOut := []int{40, 12, 5, 200, 1} // output_length 0 becomes 1 token
	if len(tr.Requests) != len(wantLens) {
		t.Fatalf("%d requests, want %d", len(tr.Requests), len(wantLens))
	}
	for i, r := range tr.Requests {
		if len(r.Prompt) != wantLens[i] || r.Arrival != wantAt[i] || r.OutputTokens != wantOut[i] {
			t.Errorf("request %d: %d tokens at %v, %d out; want %d at %v, %d", i, len(r.Prompt), r.Arrival, r.OutputTokens, wantLens[i], wantAt[i], wantOut[i])
		}
	}
	blk := func(r, i int) []uint32 {
		p := tr.Requests[r].Prompt
		return p[i*512 : min((i+1)*512, len(p))]
	}
	eq := func(a, b []uint32) bool {
		if len(a) != len(b) {
			return false
		}
		for i := range a {
			if a[i] != b[i] {
				return false
			}
		}
		return true
	}
	cases := []struct {
		name      string
		a, b      []uint32
		wantEqual bool
	}{
		{"id 0 shared by requests 0 and 1", blk(0, 0), blk(1, 0), true},
		{"id 1 shared by requests 0 and 1", blk(0, 1), blk(1, 1), true},
		{"id 3 full in request 1 and 3", blk(1, 2), blk(3, 2), true},
		{"ids 2 and 3 differ", blk(0, 2)[:176], blk(1, 2)[:176], false},
		{"ids 0 and 4 differ", blk(0, 0)[:100], blk(2, 0), false},
		{"partial id 2 holds 176 tokens", blk(0, 2), blk(0, 2)[:176], true},
		{"partial id 6 holds 1 token", blk(3, 4), blk(3, 4)[:1], true},
	}
	for _, c := range cases {
		if eq(c.a, c.b) != c.wantEqual {
			t.Errorf("%s: equal = %v", c.name, !c.wantEqual)
		}
	}
	if len(blk(0, 2)) != 176 || len(blk(3, 4)) != 1 {
		t.Errorf("partial last blocks: %d and %d tokens, want 176 and 1", len(blk(0, 2)), len(blk(3, 4)))
	}
}

func TestMooncakeRejectsBadLines(t *testing.T) {
	cases := []struct{ name, line, want string }{
		{"too few ids", `{"timestamp":0,"input_length":1025,"output_length":1,"hash_ids":[1,2]}`, "want ceil"},
		{"too many ids", `{"timestamp":0,"input_length":512,"output_length":1,"hash_ids":[1,2]}`, "want ceil"},
		{"missing length", `{"timestamp":0,"output_length":1,"hash_ids":[1]}`, "required"},
		{"not json", `{"timestamp":`, "line 1"},
		{"negative", `{"timestamp":-1,"input_length":1,"output_length":1,"hash_ids":[1]}`, "timestamp"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := LoadMooncake(strings.NewReader(c.line+"\n"), "x", MooncakeOptions{})
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err %v, want ErrInvalid mentioning %q", err, c.want)
			}
		})
	}
}

func TestOpen(t *testing.T) {
	o := Options{Seed: 1, Requests: 3, Rate: 2}
	tr, err := Open("mooncake:testdata/mooncake_sample.jsonl", o, true)
	if err != nil || len(tr.Requests) != 3 {
		t.Fatalf("%v, %d requests", err, len(tr.Requests))
	}
	if tr.Requests[1].Arrival == 750*time.Millisecond*2 {
		t.Errorf("poisson arrivals kept the file's timestamps")
	}
	if _, err := Open("nope", o, false); !errors.Is(err, ErrInvalid) {
		t.Errorf("unknown trace: %v", err)
	}
	if _, err := Open("chat", Options{Requests: 1}, false); !errors.Is(err, ErrInvalid) {
		t.Errorf("rate 0: %v", err)
	}
}
