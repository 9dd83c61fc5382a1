package wire

import (
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

// vllmGolden is one entry of testdata/vllm/vllm_goldens.json (see the README
// beside it): a payload encoded by the real msgspec with one vLLM revision's
// structs, and what it must decode to.
type vllmGolden struct {
	Name       string `json:"name"`
	Revision   string `json:"vllm_revision"`
	Form       string `json:"form"`
	PayloadHex string `json:"payload_hex"`
	Expect     struct {
		TS     float64        `json:"ts"`
		DPRank *uint32        `json:"data_parallel_rank"`
		Events []goldenExpect `json:"events"`
	} `json:"expect"`
}

type goldenExpect struct {
	Type          string          `json:"type"`
	HashKind      string          `json:"hash_kind"`
	BlockHashes   []string        `json:"block_hashes"`
	Parent        *string         `json:"parent_block_hash"`
	TokenIDs      []uint32        `json:"token_ids"`
	BlockSize     int             `json:"block_size"`
	LoRAID        *int64          `json:"lora_id"`
	Medium        *string         `json:"medium"`
	LoRAName      *string         `json:"lora_name"`
	ExtraKeys     json.RawMessage `json:"extra_keys"`
	GroupIdx      *int64          `json:"group_idx"`
	SpecKind      *string         `json:"kv_cache_spec_kind"`
	SlidingWindow *int64          `json:"kv_cache_spec_sliding_window"`
	Locality      *string         `json:"locality"`
}

// goldenSalts are the cache salts the decoder must find in extra_keys (the
// request's first block carries it after the LoRA name).
var goldenSalts = map[string]string{
	"extrakeys_stored_cache_salt":    "salt-7f3a",
	"map_stored_lora_mm_salt_embeds": "salt-1b2c",
}

func loadVLLMGoldens(t testing.TB) []vllmGolden {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("testdata", "vllm", "vllm_goldens.json"))
	if err != nil {
		t.Fatalf("vLLM goldens: %v", err)
	}
	var gs []vllmGolden
	if err := json.Unmarshal(raw, &gs); err != nil {
		t.Fatalf("vLLM goldens: %v", err)
	}
	if len(gs) != 25 {
		t.Fatalf("vLLM goldens: %d entries, want 25", len(gs))
	}
	return gs
}

// goldenHash normalises a golden's hash as docs/contracts.md says: ints as
// uint64 (negative ones reinterpreted), bytes as their last 8 bytes, big-endian.
func goldenHash(t *testing.T, kind, s string) uint64 {
	t.Helper()
	if kind == "bytes" {
		b, err := hex.DecodeString(s)
		if err != nil || len(b) < 8 {
			t.Fatalf("golden bytes hash %q: %v", s, err)
		}
		return binary.BigEndian.Uint64(b[len(b)-8:])
	}
	if strings.HasPrefix(s, "-") {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatalf("golden int hash %q: %v", s, err)
		}
		return uint64(v)
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		t.Fatalf("golden int hash %q: %v", s, err)
	}
	return v
}

func (g *vllmGolden) want(t *testing.T) EventBatch {
	t.Helper()
	b := EventBatch{TS: g.Expect.TS}
	if g.Expect.DPRank != nil {
		b.DPRank, b.HasDPRank = *g.Expect.DPRank, true
	}
	for _, x := range g.Expect.Events {
		ev := Event{Kind: kindOf([]byte(x.Type))}
		for _, h := range x.BlockHashes {
			ev.BlockHashes = append(ev.BlockHashes, goldenHash(t, x.HashKind, h))
		}
		if x.Parent != nil {
			ev.Parent, ev.HasParent = goldenHash(t, x.HashKind, *x.Parent), true
		}
		ev.TokenIDs, ev.BlockSize = x.TokenIDs, x.BlockSize
		if x.LoRAID != nil {
			ev.LoRAID, ev.HasLoRAID = *x.LoRAID, true
		}
		if x.Medium != nil {
			m, ok := mediumNamed(*x.Medium)
			if !ok {
				t.Fatalf("%s: golden medium %q is not one of ours", g.Name, *x.Medium)
			}
			ev.Medium = m
		}
		if x.LoRAName != nil {
			ev.LoRAName = *x.LoRAName
		}
		if x.GroupIdx != nil {
			ev.GroupIdx, ev.HasGroupIdx = *x.GroupIdx, true
		}
		if x.SpecKind != nil {
			ev.KVCacheSpecKind = *x.SpecKind
		}
		if x.SlidingWindow != nil {
			ev.SlidingWindow, ev.HasSlidingWindow = *x.SlidingWindow, true
		}
		if x.Locality != nil {
			ev.Locality = *x.Locality
		}
		if ev.Kind == BlockStored {
			ev.CacheSalt = goldenSalts[g.Name]
		}
		b.Events = append(b.Events, ev)
	}
	return b
}

func mediumNamed(s string) (Medium, bool) {
	for m, n := range mediumNames {
		if n == s {
			return Medium(m), true
		}
	}
	return 0, false
}

// TestDecodesEveryVLLMRevision decodes the payloads that the real msgspec
// encoded with vLLM's structs of every KV-event revision, from the first (v0,
// batch [ts, events]) to the current one (map events with locality), and
// compares every field with what the revision declared.
func TestDecodesEveryVLLMRevision(t *testing.T) {
	forms := map[string]int{}
	for _, g := range loadVLLMGoldens(t) {
		forms[g.Form]++
		t.Run(g.Name, func(t *testing.T) {
			payload, err := hex.DecodeString(g.PayloadHex)
			if err != nil {
				t.Fatal(err)
			}
			got, stats, err := NewDecoder(0).Decode(payload)
			if err != nil {
				t.Fatalf("vLLM %s (%s form): %v", g.Revision[:12], g.Form, err)
			}
			if stats.UnknownEvents != 0 || stats.UnknownMedia != 0 {
				t.Errorf("stats = %+v, want no unknown events or media", stats)
			}
			if want := g.want(t); !reflect.DeepEqual(got, want) {
				t.Errorf("vLLM %s decoded\n got %+v\nwant %+v", g.Revision[:12], got, want)
			}
		})
	}
	if forms["array"] == 0 || forms["map"] == 0 {
		t.Errorf("goldens by form = %v, want both array and map", forms)
	}
}
