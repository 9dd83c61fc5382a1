package tokenize

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// fuzzTokenizers are the pipelines fuzzed together: both real files, DeepSeek's
// scanners, and the regexp2 path.
var fuzzTokenizers = []string{"qwen3", "llama3", "deepseek_v3_pretokenizer", "gpt2_bytelevel_regex"}

var fuzzSeeds = []string{
	"", "hello world", "It's 12345 o'clock!\n\n", "  \t\r\n  x", "你好，世界 😀👍🏽", "e\u0301\u0323",
	"<|im_start|>user\nhi<|im_end|>", "<|begin_of_text|><|eot_id|>", "\xff\xfe\xc3", "a\u00a0b\u3000c\u2028",
	"'S 'LL x'd", "١٢٣ ①", "\x00\x01", "[!\"#]abc ?!.,\r\n", "\ue000\U0010ffff",
}

// FuzzEncodeDecode: any bytes encode without panicking to valid ids, the pieces of every
// pre-tokenizer cover the text, and valid UTF-8 comes back from Decode as it went in
// (normalized, for tokenizers with NFC).
func FuzzEncodeDecode(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add(s)
	}
	toks := make([]*HFTokenizer, len(fuzzTokenizers))
	for i, name := range fuzzTokenizers {
		toks[i] = variantTokenizer(f, name)
	}
	f.Fuzz(func(t *testing.T, s string) {
		for _, tok := range toks {
			ids := tok.Encode(s, true)
			for _, id := range ids {
				if int(id) >= tok.VocabSize() {
					t.Fatalf("%s: Encode(%q) gave id %d outside the vocabulary", tok.Model(), s, id)
				}
			}
			for _, step := range tok.pre.steps {
				checkPiecesCover(t, step, s)
			}
			back, err := tok.Decode(tok.Encode(s, false))
			if err != nil {
				t.Fatalf("%s: Decode(Encode(%q)): %v", tok.Model(), s, err)
			}
			if want, ok := roundTrip(tok, s); ok && back != want {
				t.Fatalf("%s: Decode(Encode(%q)) = %q, want %q", tok.Model(), s, back, want)
			}
		}
	})
}

// roundTrip is what Decode(Encode(s)) must give: s itself, with invalid UTF-8 replaced
// as Decode does, and normalized for tokenizers with NFC. Normalization runs on the
// text between added tokens, so for text that has both an added token and characters
// NFC changes the expectation is not simply NFC(s); ok is false then.
func roundTrip(tok *HFTokenizer, s string) (want string, ok bool) {
	if !tok.nfc {
		var sb strings.Builder
		appendLossyUTF8(&sb, []byte(s))
		return sb.String(), true
	}
	if !utf8.ValidString(s) {
		return "", false
	}
	if norm.NFC.IsNormalString(s) {
		return s, true
	}
	if tok.addedRaw != nil {
		if _, _, _, found := tok.addedRaw.find(s, 0); found {
			return "", false
		}
	}
	return norm.NFC.String(s), true
}

func checkPiecesCover(t *testing.T, sp splitter, s string) {
	t.Helper()
	pieces := sp.appendPieces(nil, s, 0)
	at := 0
	for _, p := range pieces {
		if p.start != at || p.end <= p.start || p.end > len(s) {
			t.Fatalf("%T pieces of %q: %v do not tile the text", sp, s, pieces)
		}
		at = p.end
	}
	if at != len(s) {
		t.Fatalf("%T pieces of %q: %v end at %d of %d", sp, s, pieces, at, len(s))
	}
}

// FuzzMergeAlgorithmsAgree: the linear merge loop (short words) and the heap (long
// words) are the same algorithm.
func FuzzMergeAlgorithmsAgree(f *testing.F) {
	for _, s := range []string{"hello", "aaaaaaaa", "      ", "the quick brown fox", "\xe4\xbd\xa0\xe5\xa5\xbd"} {
		f.Add(s)
	}
	tok := variantTokenizer(f, "qwen3")
	f.Fuzz(func(t *testing.T, word string) {
		if word == "" || len(word) > 512 {
			return
		}
		var sc bpeScratch
		linear := tok.bpe.mergeLinear(word, &sc)
		heap := tok.bpe.mergeHeap(word, &sc)
		if !slices.Equal(linear, heap) {
			t.Fatalf("word %q: linear merge %v, heap merge %v", word, linear, heap)
		}
	})
}

// FuzzChatRequest: any JSON a client sends as messages and tools either fails to
// decode or renders (or fails to render) without panicking.
func FuzzChatRequest(f *testing.F) {
	for _, c := range readChatCases(f) {
		f.Add(string(c.Messages), string(c.Tools))
	}
	f.Add(`[{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":"{\"a\":[1,2.5e3,{\"b\":null}]}"}}]}]`, `[{"function":{"name":"f","parameters":{"x":1e400}}}]`)
	tok := variantTokenizer(f, "qwen3")
	f.Fuzz(func(t *testing.T, messages, tools string) {
		var msgs []Message
		if json.Unmarshal([]byte(messages), &msgs) != nil {
			return
		}
		var opts ChatOptions
		if tools != "" && json.Unmarshal([]byte(tools), &opts.Tools) != nil {
			return
		}
		opts.AddGenerationPrompt = true
		_, _ = tok.ApplyChatTemplate(msgs, opts)
	})
}
