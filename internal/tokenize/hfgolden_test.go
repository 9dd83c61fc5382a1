package tokenize

import (
	"bufio"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/kvindex/kvindex/internal/tokenize/tokenizetest"
)

// The real tokenizer files are fetched by scripts/fetch-tokenizers.sh into
// <repo>/.cache/tokenizers (or $KVINDEX_TEST_TOKENIZERS); the golden ids under
// testdata/hf were produced from the same files by Hugging Face's Rust library
// (testdata/gen/encode.js).

// tokenizersDir returns the directory holding qwen3/ and llama3/.
func tokenizersDir(t testing.TB) string { return tokenizetest.Dir(t) }

// variant is one entry of testdata/hf/variants.json: a real file, possibly with some
// pipeline parts replaced.
type variant struct {
	Name             string                     `json:"name"`
	Base             string                     `json:"base"`
	Vocab            bool                       `json:"vocab"`
	Set              map[string]json.RawMessage `json:"set"`
	AddedTokensSet   map[string]map[string]any  `json:"added_tokens_set"`
	AddedTokensAdded []map[string]any           `json:"added_tokens_append"`
}

func readVariants(t testing.TB) []variant {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", "hf", "variants.json"))
	if err != nil {
		t.Fatal(err)
	}
	var vs []variant
	if err := json.Unmarshal(data, &vs); err != nil {
		t.Fatal(err)
	}
	return vs
}

func findVariant(t testing.TB, name string) variant {
	t.Helper()
	for _, v := range readVariants(t) {
		if v.Name == name {
			return v
		}
	}
	t.Fatalf("no variant %q in testdata/hf/variants.json", name)
	return variant{}
}

// variantFiles applies a variant to its base files, as encode.js does.
func variantFiles(t testing.TB, v variant) HFFiles {
	t.Helper()
	dir := filepath.Join(tokenizersDir(t), v.Base)
	tokJSON, err := os.ReadFile(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := os.ReadFile(filepath.Join(dir, "tokenizer_config.json"))
	if err != nil {
		t.Fatal(err)
	}
	if len(v.Set) == 0 && len(v.AddedTokensSet) == 0 && len(v.AddedTokensAdded) == 0 {
		return HFFiles{TokenizerJSON: tokJSON, Config: cfg}
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(tokJSON, &top); err != nil {
		t.Fatal(err)
	}
	for k, val := range v.Set {
		top[k] = val
	}
	if len(v.AddedTokensSet) > 0 || len(v.AddedTokensAdded) > 0 {
		var added []map[string]any
		if err := json.Unmarshal(top["added_tokens"], &added); err != nil {
			t.Fatal(err)
		}
		for content, fields := range v.AddedTokensSet {
			i := slices.IndexFunc(added, func(a map[string]any) bool { return a["content"] == content })
			if i < 0 {
				t.Fatalf("variant %s: no added token %q", v.Name, content)
			}
			for k, val := range fields {
				added[i][k] = val
			}
		}
		added = append(added, v.AddedTokensAdded...)
		if top["added_tokens"], err = json.Marshal(added); err != nil {
			t.Fatal(err)
		}
	}
	if tokJSON, err = json.Marshal(top); err != nil {
		t.Fatal(err)
	}
	return HFFiles{TokenizerJSON: tokJSON, Config: cfg}
}

// Loaded tokenizers are shared by the tests of a run: loading Qwen3's takes a while.
var (
	variantTokenizersMu sync.Mutex
	variantTokenizers   = map[string]*HFTokenizer{}
)

func variantTokenizer(t testing.TB, name string) *HFTokenizer {
	t.Helper()
	variantTokenizersMu.Lock()
	defer variantTokenizersMu.Unlock()
	if tok, ok := variantTokenizers[name]; ok {
		return tok
	}
	tok, err := NewHFTokenizer(name, variantFiles(t, findVariant(t, name)), Options{})
	if err != nil {
		t.Fatalf("loading %s: %v", name, err)
	}
	variantTokenizers[name] = tok
	return tok
}

// goldenRecord is one line of testdata/hf/<variant>.jsonl.gz.
type goldenRecord struct {
	Text       string   `json:"text"`
	IDs        []uint32 `json:"ids"`
	SpecialIDs []uint32 `json:"special_ids"`
	Decoded    *string  `json:"decoded"`
	Vocab      *uint32  `json:"vocab"`
}

func readGzip(t testing.TB, path string) *bufio.Scanner {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(zr)
	sc.Buffer(make([]byte, 1<<20), 1<<26)
	return sc
}

func readGolden(t testing.TB, name string) []goldenRecord {
	t.Helper()
	sc := readGzip(t, filepath.Join("testdata", "hf", name+".jsonl.gz"))
	var header struct {
		Variant    string `json:"variant"`
		BaseSHA256 string `json:"base_sha256"`
	}
	if !sc.Scan() {
		t.Fatalf("%s: empty golden file", name)
	}
	if err := json.Unmarshal(sc.Bytes(), &header); err != nil || header.Variant != name {
		t.Fatalf("%s: bad header %q (%v)", name, sc.Text(), err)
	}
	var recs []goldenRecord
	for sc.Scan() {
		var r goldenRecord
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		recs = append(recs, r)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return recs
}

// mismatches collects failures and reports the first few in full.
type mismatches struct {
	t     *testing.T
	count int
}

func (m *mismatches) add(format string, args ...any) {
	m.count++
	if m.count <= 10 {
		m.t.Errorf(format, args...)
	}
}

func (m *mismatches) done(total int) {
	if m.count > 10 {
		m.t.Errorf("... %d mismatches of %d in all", m.count, total)
	}
}

func short(s string) string {
	if len(s) > 120 {
		return fmt.Sprintf("%q... (%d bytes)", s[:120], len(s))
	}
	return fmt.Sprintf("%q", s)
}

func TestEncodeMatchesHuggingFace(t *testing.T) {
	for _, v := range readVariants(t) {
		t.Run(v.Name, func(t *testing.T) {
			tok := variantTokenizer(t, v.Name)
			recs := readGolden(t, v.Name)
			corpus, vocab := 0, 0
			m := mismatches{t: t}
			for _, r := range recs {
				if r.Vocab != nil {
					vocab++
				} else {
					corpus++
				}
				got := tok.Encode(r.Text, false)
				if !slices.Equal(got, r.IDs) {
					m.add("Encode(%s) =\n%v\nwant\n%v", short(r.Text), got, r.IDs)
					continue
				}
				wantSpecial := r.IDs
				if r.SpecialIDs != nil {
					wantSpecial = r.SpecialIDs
				}
				if got := tok.Encode(r.Text, true); !slices.Equal(got, wantSpecial) {
					m.add("Encode(%s, addSpecialTokens) =\n%v\nwant\n%v", short(r.Text), got, wantSpecial)
				}
				wantText := r.Text
				if r.Decoded != nil {
					wantText = *r.Decoded
				}
				if got, err := tok.Decode(r.IDs); err != nil || got != wantText {
					m.add("Decode(ids of %s) = %s, %v; want %s", short(r.Text), short(got), err, short(wantText))
				}
			}
			m.done(len(recs))
			if corpus < 300 || (v.Vocab && vocab < 100_000) {
				t.Fatalf("golden file has %d corpus strings and %d vocabulary entries; want >= 300 (and >= 100000 for full vocabularies)", corpus, vocab)
			}
		})
	}
}

func TestDecodeEveryIDMatchesHuggingFace(t *testing.T) {
	for _, v := range readVariants(t) {
		if !v.Vocab {
			continue
		}
		t.Run(v.Name, func(t *testing.T) {
			tok := variantTokenizer(t, v.Name)
			sc := readGzip(t, filepath.Join("testdata", "hf", v.Name+".decode.json.gz"))
			sc.Split(bufio.ScanLines)
			var all []byte
			for sc.Scan() {
				all = append(all, sc.Bytes()...)
			}
			var want []string
			if err := json.Unmarshal(all, &want); err != nil {
				t.Fatal(err)
			}
			if len(want) != tok.VocabSize() {
				t.Fatalf("VocabSize() = %d, Hugging Face's is %d", tok.VocabSize(), len(want))
			}
			m := mismatches{t: t}
			for id, w := range want {
				if got, err := tok.Decode([]uint32{uint32(id)}); err != nil || got != w {
					m.add("Decode([%d]) = %q, %v; want %q", id, got, err, w)
				}
			}
			m.done(len(want))
		})
	}
}
