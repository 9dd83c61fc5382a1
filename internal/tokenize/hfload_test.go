package tokenize

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
)

// tinyTokenizer is a byte-level BPE tokenizer.json small enough to write by hand: the
// 256 byte tokens (id = byte), then ab=256 bc=257 abc=258 aa=259 aaaa=260 and the
// special token <|s|>=261, with merges ranked "b c" < "a b" < "a bc" < "a a" < "aa aa".
func tinyTokenizer() map[string]any {
	vocab := map[string]any{}
	for b := 0; b < 256; b++ {
		vocab[string(byteLevelRunes[b])] = b
	}
	for i, tok := range []string{"ab", "bc", "abc", "aa", "aaaa"} {
		vocab[tok] = 256 + i
	}
	return map[string]any{
		"version":    "1.0",
		"normalizer": map[string]any{"type": "NFC"},
		"pre_tokenizer": map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "Split", "pattern": map[string]any{"Regex": patternQwen2}, "behavior": "Isolated", "invert": false},
			map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
		}},
		"model": map[string]any{
			"type": "BPE", "dropout": nil, "unk_token": nil, "continuing_subword_prefix": "", "end_of_word_suffix": "",
			"fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
			"vocab":  vocab,
			"merges": []any{"b c", "a b", "a bc", "a a", "aa aa"},
		},
		"added_tokens":   []any{map[string]any{"id": 261, "content": "<|s|>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}},
		"post_processor": map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
		"decoder":        map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
	}
}

// set assigns value at a dotted path of nested maps.
func set(m map[string]any, path string, value any) {
	keys := strings.Split(path, ".")
	for _, k := range keys[:len(keys)-1] {
		m = m[k].(map[string]any)
	}
	m[keys[len(keys)-1]] = value
}

func newTiny(t *testing.T, mutate func(map[string]any), config string) (*HFTokenizer, error) {
	t.Helper()
	m := tinyTokenizer()
	if mutate != nil {
		mutate(m)
	}
	data, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return NewHFTokenizer("tiny", HFFiles{TokenizerJSON: data, Config: []byte(config)}, Options{})
}

func TestBPEMergesLowestRankFirstLeftmostOnTies(t *testing.T) {
	tok, err := newTiny(t, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("a", 50) // past linearMergeLimit: the heap path
	wantLong := append(slices.Repeat([]uint32{260}, 12), 259)
	tests := []struct {
		text string
		want []uint32
	}{
		{"abc", []uint32{258}},               // b+c (rank 0) before a+b (rank 1), then a+bc
		{"ab", []uint32{256}},                // a word that is one token
		{"aaa", []uint32{259, 'a'}},          // a+a at the leftmost of two equal pairs
		{"aaaa", []uint32{260}},              // aa+aa after both a+a
		{"abab", []uint32{256, 256}},         // no merge joins ab+ab
		{"a<|s|>b", []uint32{'a', 261, 'b'}}, // added token split out first
		{"y\u0301", []uint32{0xc3, 0xbd}},    // NFC composes ý, encoded as its two bytes
		{long, wantLong},                     // heap merging agrees
		{"\xff\xfe", []uint32{0xff, 0xfe}},   // invalid UTF-8 stays bytes
		{"", []uint32{}},                     // nothing
		{"ab abc", []uint32{256, ' ', 258}},  // " abc" is one word: b+c, a+bc, no merge with the space
	}
	for _, tt := range tests {
		if got := tok.Encode(tt.text, false); !slices.Equal(got, tt.want) {
			t.Errorf("Encode(%q) = %v, want %v", tt.text, got, tt.want)
		}
	}
}

func TestIgnoreMergesTakesWholeVocabularyWords(t *testing.T) {
	// "abc" would merge to [a, bc] if ranks were followed without "a bc"; with
	// ignore_merges a word in the vocabulary is its own token whatever the merges say.
	noABC := func(m map[string]any) { set(m, "model.merges", []any{"b c", "a b"}) }
	plain, err := newTiny(t, noABC, "")
	if err != nil {
		t.Fatal(err)
	}
	if got := plain.Encode("abc", false); !slices.Equal(got, []uint32{'a', 257}) {
		t.Fatalf("without ignore_merges Encode(abc) = %v, want [97 257]", got)
	}
	ignoring, err := newTiny(t, func(m map[string]any) { noABC(m); set(m, "model.ignore_merges", true) }, "")
	if err != nil {
		t.Fatal(err)
	}
	if got := ignoring.Encode("abc", false); !slices.Equal(got, []uint32{258}) {
		t.Fatalf("with ignore_merges Encode(abc) = %v, want [258]", got)
	}
}

func TestLlamaTokenizerFastConfigRebuildsPostProcessor(t *testing.T) {
	tok, err := newTiny(t, nil, `{"tokenizer_class": "LlamaTokenizerFast", "bos_token": "<|s|>", "eos_token": {"content": "<|s|>"}, "add_eos_token": true}`)
	if err != nil {
		t.Fatal(err)
	}
	if got := tok.Encode("ab", true); !slices.Equal(got, []uint32{261, 256, 261}) {
		t.Fatalf("Encode(ab, addSpecialTokens) = %v, want [261 256 261]", got)
	}
	if got := tok.Encode("ab", false); !slices.Equal(got, []uint32{256}) {
		t.Fatalf("Encode(ab) = %v, want [256]", got)
	}
	_, err = newTiny(t, nil, `{"tokenizer_class": "LlamaTokenizerFast", "bos_token": "<missing>"}`)
	if !errors.Is(err, ErrBadTokenizerFile) {
		t.Fatalf("bos_token that is no added token: error = %v, want ErrBadTokenizerFile", err)
	}
}

func TestUnsupportedOrMalformedFilesAreRefused(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(map[string]any)
		want   error
	}{
		{"NFKC normalizer", func(m map[string]any) { m["normalizer"] = map[string]any{"type": "NFKC"} }, ErrNotSupported},
		{"lowercase in a sequence", func(m map[string]any) {
			m["normalizer"] = map[string]any{"type": "Sequence", "normalizers": []any{map[string]any{"type": "NFC"}, map[string]any{"type": "Lowercase"}}}
		}, ErrNotSupported},
		{"Metaspace pre-tokenizer", func(m map[string]any) { m["pre_tokenizer"] = map[string]any{"type": "Metaspace", "replacement": "▁"} }, ErrNotSupported},
		{"no pre-tokenizer", func(m map[string]any) { m["pre_tokenizer"] = nil }, ErrNotSupported},
		{"split without byte level", func(m map[string]any) {
			m["pre_tokenizer"] = map[string]any{"type": "Split", "pattern": map[string]any{"Regex": `\s+`}, "behavior": "Isolated", "invert": false}
		}, ErrNotSupported},
		{"split removing matches", func(m map[string]any) {
			set(m, "pre_tokenizer.pretokenizers", []any{
				map[string]any{"type": "Split", "pattern": map[string]any{"Regex": `\s+`}, "behavior": "Removed", "invert": false},
				map[string]any{"type": "ByteLevel", "add_prefix_space": false, "use_regex": false},
			})
		}, ErrNotSupported},
		{"split pattern that does not compile", func(m map[string]any) {
			set(m, "pre_tokenizer.pretokenizers", []any{
				map[string]any{"type": "Split", "pattern": map[string]any{"Regex": `(unclosed`}, "behavior": "Isolated", "invert": false},
				map[string]any{"type": "ByteLevel", "add_prefix_space": false, "use_regex": false},
			})
		}, ErrNotSupported},
		{"byte level with prefix space", func(m map[string]any) {
			m["pre_tokenizer"] = map[string]any{"type": "ByteLevel", "add_prefix_space": true, "use_regex": true}
		}, ErrNotSupported},
		{"WordPiece model", func(m map[string]any) { set(m, "model.type", "WordPiece") }, ErrNotSupported},
		{"byte fallback", func(m map[string]any) { set(m, "model.byte_fallback", true) }, ErrNotSupported},
		{"dropout", func(m map[string]any) { set(m, "model.dropout", 0.1) }, ErrNotSupported},
		{"subword prefix", func(m map[string]any) { set(m, "model.continuing_subword_prefix", "##") }, ErrNotSupported},
		{"vocabulary without every byte", func(m map[string]any) { delete(m["model"].(map[string]any)["vocab"].(map[string]any), "Ġ") }, ErrNotSupported},
		{"merge of unknown tokens", func(m map[string]any) { set(m, "model.merges", []any{"q z"}) }, ErrBadTokenizerFile},
		{"merge line with three tokens", func(m map[string]any) { set(m, "model.merges", []any{"a b c"}) }, ErrBadTokenizerFile},
		{"Metaspace decoder", func(m map[string]any) { m["decoder"] = map[string]any{"type": "Metaspace"} }, ErrNotSupported},
		{"no decoder", func(m map[string]any) { m["decoder"] = nil }, ErrNotSupported},
		{"Roberta post-processor", func(m map[string]any) {
			m["post_processor"] = map[string]any{"type": "RobertaProcessing", "sep": []any{"</s>", 2}, "cls": []any{"<s>", 0}}
		}, ErrNotSupported},
		{"template with an undefined token", func(m map[string]any) {
			m["post_processor"] = map[string]any{"type": "TemplateProcessing",
				"single":         []any{map[string]any{"SpecialToken": map[string]any{"id": "<bos>", "type_id": 0}}, map[string]any{"Sequence": map[string]any{"id": "A", "type_id": 0}}},
				"special_tokens": map[string]any{}}
		}, ErrBadTokenizerFile},
		{"single-word added token", func(m map[string]any) {
			m["added_tokens"].([]any)[0].(map[string]any)["single_word"] = true
		}, ErrNotSupported},
		{"model is not an object", func(m map[string]any) { m["model"] = "BPE" }, ErrBadTokenizerFile},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := newTiny(t, tt.mutate, ""); !errors.Is(err, tt.want) {
				t.Fatalf("error = %v, want one wrapping %v", err, tt.want)
			}
		})
	}
	if _, err := NewHFTokenizer("x", HFFiles{TokenizerJSON: []byte("{")}, Options{}); !errors.Is(err, ErrBadTokenizerFile) {
		t.Fatalf("truncated tokenizer.json: error = %v, want ErrBadTokenizerFile", err)
	}
	data, _ := json.Marshal(tinyTokenizer())
	if _, err := NewHFTokenizer("x", HFFiles{TokenizerJSON: data, Config: []byte(`{"chat_template": 5}`)}, Options{}); !errors.Is(err, ErrBadTokenizerFile) {
		t.Fatalf("chat_template that is a number: error = %v, want ErrBadTokenizerFile", err)
	}
	if _, err := NewHFTokenizer("x", HFFiles{TokenizerJSON: data, ChatTemplate: []byte("{% if %}")}, Options{}); !errors.Is(err, ErrNotSupported) {
		t.Fatalf("chat template that does not compile: error = %v, want ErrNotSupported", err)
	}
}

func TestDecodeRejectsUnknownIDsAndReplacesInvalidUTF8(t *testing.T) {
	tok, err := newTiny(t, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tok.Decode([]uint32{'a', 262}); !errors.Is(err, ErrInvalidTokenID) {
		t.Fatalf("Decode(262) error = %v, want ErrInvalidTokenID", err)
	}
	tests := []struct {
		ids  []uint32
		want string
	}{
		{[]uint32{0xe4, 0xb8}, "\ufffd"},                   // a truncated three-byte sequence is one replacement
		{[]uint32{0xe4, 0xb8, 'a'}, "\ufffda"},             // ... also before ASCII
		{[]uint32{0xff, 0xfe}, "\ufffd\ufffd"},             // bytes that never start a sequence: one each
		{[]uint32{0xed, 0xa0, 0x80}, "\ufffd\ufffd\ufffd"}, // a surrogate's encoding is three bad bytes
		{[]uint32{0xf0, 0x9f, 0x98}, "\ufffd"},             // truncated emoji
		{[]uint32{256, 261, 0xc3, 0xa9}, "ab<|s|>é"},       // added token content, then a whole character
	}
	for _, tt := range tests {
		if got, err := tok.Decode(tt.ids); err != nil || got != tt.want {
			t.Errorf("Decode(%v) = %q, %v; want %q", tt.ids, got, err, tt.want)
		}
	}
}
