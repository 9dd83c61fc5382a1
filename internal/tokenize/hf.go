package tokenize

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// HFTokenizer is a Hugging Face byte-level BPE tokenizer (tokenizer.json) with the chat
// template of its tokenizer_config.json. Encode gives the ids Hugging Face's tokenizers
// library gives for the same file — the ids vLLM computes — which the tests check on
// the Qwen3 and Llama 3 files token for token.
//
// Encoding pipeline, as in the tokenizers library:
//  1. added tokens that are not "normalized" are cut out of the raw text, leftmost
//     longest first (with their lstrip/rstrip whitespace);
//  2. each remaining segment is normalized (NFC when the file says so), and added
//     tokens that are "normalized" are cut out of it;
//  3. the pre-tokenizer splits the rest into words;
//  4. BPE encodes each word from its bytes;
//  5. with addSpecialTokens, the post-processor's prefix and suffix ids are added.
//
// It is safe for concurrent use.
type HFTokenizer struct {
	*hfModel
	cache  *Cache
	states sync.Pool
}

// hfModel is the immutable part of a tokenizer, shared by the tokenizers WithCache and
// WithChatTemplate derive.
type hfModel struct {
	model string
	nfc   bool
	// addedRaw and addedNormalized match the added tokens of steps 1 and 2; either
	// may be nil.
	addedRaw, addedNormalized *addedMatcher
	added                     map[uint32]addedToken
	pre                       *preTokenizer
	bpe                       *bpe
	prefix, suffix            []uint32
	vocabSize                 int
	// The bytes id decodes to are tokenBytes[tokenOffsets[id]:tokenOffsets[id+1]];
	// tokenKinds tells model tokens, added tokens and unused ids apart.
	tokenBytes   []byte
	tokenOffsets []uint32
	tokenKinds   []uint8
	config       *tokenizerConfig
	// contentFormat is Options.ContentFormat, which WithChatTemplate applies too.
	contentFormat ContentFormat
	chat          *chatTemplate
}

var _ Tokenizer = (*HFTokenizer)(nil)

const (
	kindUnused uint8 = iota
	kindModel
	kindAdded
)

// Options configure a loaded tokenizer.
type Options struct {
	// Cache, when set, memoizes the ids of text segments (the text between added
	// tokens, such as one chat message) under the tokenizer's model name.
	Cache *Cache
	// ContentFormat is how chat templates receive message content (vLLM's
	// --chat-template-content-format); empty is ContentFormatAuto.
	ContentFormat ContentFormat
}

// HFFiles are the Hugging Face files a tokenizer is built from.
type HFFiles struct {
	// TokenizerJSON is tokenizer.json (required).
	TokenizerJSON []byte
	// Config is tokenizer_config.json: special tokens and, usually, the chat template.
	// Optional.
	Config []byte
	// ChatTemplate is chat_template.jinja, which newer checkpoints ship instead of (and
	// which takes precedence over) Config's chat_template. Optional.
	ChatTemplate []byte
}

// LoadDir reads tokenizer.json, tokenizer_config.json and chat_template.jinja (the last
// two optional) from dir. model names the tokenizer in cache keys and messages.
func LoadDir(model, dir string, opts Options) (*HFTokenizer, error) {
	var files HFFiles
	var err error
	if files.TokenizerJSON, err = os.ReadFile(filepath.Join(dir, "tokenizer.json")); err != nil {
		return nil, fmt.Errorf("tokenize: model %q: %w", model, err)
	}
	for _, opt := range []struct {
		name string
		dst  *[]byte
	}{{"tokenizer_config.json", &files.Config}, {"chat_template.jinja", &files.ChatTemplate}} {
		data, err := os.ReadFile(filepath.Join(dir, opt.name))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("tokenize: model %q: %w", model, err)
		}
		*opt.dst = data
	}
	t, err := NewHFTokenizer(model, files, opts)
	if err != nil {
		return nil, fmt.Errorf("tokenize: model %q from %s: %w", model, dir, err)
	}
	return t, nil
}

// NewHFTokenizer builds a tokenizer from the contents of its files. A pipeline this
// package does not implement exactly is an error wrapping ErrNotSupported; a malformed
// file is an error wrapping ErrBadTokenizerFile.
func NewHFTokenizer(model string, files HFFiles, opts Options) (*HFTokenizer, error) {
	var tf tokenizerFile
	if err := json.Unmarshal(files.TokenizerJSON, &tf); err != nil {
		return nil, fmt.Errorf("%w: tokenizer.json: %v", ErrBadTokenizerFile, err)
	}
	cfg, err := parseConfig(files.Config)
	if err != nil {
		return nil, err
	}
	t := &hfModel{model: model, config: cfg, contentFormat: opts.ContentFormat}
	if t.nfc, err = parseNormalizer(tf.Normalizer); err != nil {
		return nil, err
	}
	if t.pre, err = parsePreTokenizer(tf.PreTokenizer); err != nil {
		return nil, err
	}
	var tokens []string
	if t.bpe, tokens, err = parseBPE(tf.Model); err != nil {
		return nil, err
	}
	if t.prefix, t.suffix, err = parsePostProcessor(tf.PostProcessor); err != nil {
		return nil, err
	}
	if err := checkDecoder(tf.Decoder); err != nil {
		return nil, err
	}
	if t.addedRaw, t.addedNormalized, t.added, err = parseAddedTokens(tf.AddedTokens, t.nfc); err != nil {
		return nil, err
	}
	t.buildDecodeTables(tokens)
	if err := t.applyConfigPostProcessor(cfg); err != nil {
		return nil, err
	}
	if t.chat, err = newChatTemplate(cfg, files.ChatTemplate, opts.ContentFormat); err != nil {
		return nil, err
	}
	return newHFTokenizer(t, opts.Cache), nil
}

func newHFTokenizer(m *hfModel, cache *Cache) *HFTokenizer {
	t := &HFTokenizer{hfModel: m, cache: cache}
	t.states.New = func() any { return new(encodeState) }
	return t
}

// WithCache returns a tokenizer that shares t's tables and memoizes segments in cache
// (nil: none).
func (t *HFTokenizer) WithCache(cache *Cache) *HFTokenizer {
	return newHFTokenizer(t.hfModel, cache)
}

// WithChatTemplate returns a tokenizer that shares t's tables and renders chats with
// the given Jinja source instead of the file's template (as vLLM's --chat-template
// does). A template that does not compile is an error wrapping ErrNotSupported.
func (t *HFTokenizer) WithChatTemplate(source string) (*HFTokenizer, error) {
	chat, err := newChatTemplate(t.config, []byte(source), t.contentFormat)
	if err != nil {
		return nil, err
	}
	m := *t.hfModel
	m.chat = chat
	return newHFTokenizer(&m, t.cache), nil
}

// buildDecodeTables lays out the bytes every id decodes to. Like Hugging Face's
// ByteLevel decoder, a token whose characters all spell bytes decodes to those bytes and
// any other token to its own UTF-8; added tokens go through the same mapping (as they
// do in Hugging Face's decode), with the content they are matched by.
func (t *hfModel) buildDecodeTables(tokens []string) {
	size := len(tokens)
	for id := range t.added {
		size = max(size, int(id)+1)
	}
	t.vocabSize = size
	t.tokenKinds = make([]uint8, size)
	t.tokenOffsets = make([]uint32, size+1)
	for id := range size {
		t.tokenOffsets[id] = uint32(len(t.tokenBytes))
		tok := ""
		if a, ok := t.added[uint32(id)]; ok {
			tok, t.tokenKinds[id] = a.pattern, kindAdded
		} else if id < len(tokens) && tokens[id] != "" {
			tok, t.tokenKinds[id] = tokens[id], kindModel
		}
		if raw, ok := byteLevelBytes(tok); ok {
			t.tokenBytes = append(t.tokenBytes, raw...)
		} else {
			t.tokenBytes = append(t.tokenBytes, tok...)
		}
	}
	t.tokenOffsets[size] = uint32(len(t.tokenBytes))
}

// applyConfigPostProcessor does what transformers' LlamaTokenizerFast does on load:
// it replaces the post-processor with BOS/EOS per add_bos_token and add_eos_token.
func (t *hfModel) applyConfigPostProcessor(cfg *tokenizerConfig) error {
	if cfg.TokenizerClass != "LlamaTokenizerFast" {
		return nil
	}
	addBOS := cfg.AddBOSToken == nil || *cfg.AddBOSToken
	addEOS := cfg.AddEOSToken != nil && *cfg.AddEOSToken
	t.prefix, t.suffix = nil, nil
	for _, want := range []struct {
		add  bool
		name string
		tok  *string
		dst  *[]uint32
	}{{addBOS, "bos_token", cfg.special["bos_token"], &t.prefix}, {addEOS, "eos_token", cfg.special["eos_token"], &t.suffix}} {
		if !want.add {
			continue
		}
		if want.tok == nil {
			return fmt.Errorf("%w: tokenizer_config.json asks to add %s but defines none", ErrBadTokenizerFile, want.name)
		}
		id, ok := t.addedID(*want.tok)
		if !ok {
			return fmt.Errorf("%w: %s %q is not an added token", ErrBadTokenizerFile, want.name, *want.tok)
		}
		*want.dst = []uint32{id}
	}
	return nil
}

func (t *hfModel) addedID(content string) (uint32, bool) {
	for id, tok := range t.added {
		if tok.content == content {
			return id, true
		}
	}
	return 0, false
}

// Model returns the model name the tokenizer was loaded for.
func (t *HFTokenizer) Model() string { return t.model }

// VocabSize is one more than the largest model or added token id.
func (t *HFTokenizer) VocabSize() int { return t.vocabSize }

// encodeState is the scratch space of one Encode call.
type encodeState struct {
	pieces, spare []span
	bpe           bpeScratch
}

// Encode tokenizes text like Hugging Face's encode(text, add_special_tokens). Any byte
// string is accepted: invalid UTF-8 bytes are encoded as the byte tokens they are.
func (t *HFTokenizer) Encode(text string, addSpecialTokens bool) []uint32 {
	st := t.states.Get().(*encodeState)
	ids := make([]uint32, 0, len(text)/4+len(t.prefix)+len(t.suffix)+4)
	if addSpecialTokens {
		ids = append(ids, t.prefix...)
	}
	ids = t.appendAddedSplit(ids, text, t.addedRaw, false, st)
	if addSpecialTokens {
		ids = append(ids, t.suffix...)
	}
	t.states.Put(st)
	return ids
}

// appendAddedSplit cuts the added tokens m matches out of text and encodes the rest:
// raw segments (step 1) through the segment cache and normalization, normalized ones
// (step 2) straight to pre-tokenization.
func (t *HFTokenizer) appendAddedSplit(ids []uint32, text string, m *addedMatcher, normalized bool, st *encodeState) []uint32 {
	rest := func(ids []uint32, s string) []uint32 {
		if normalized {
			return t.appendWords(ids, s, st)
		}
		return t.appendSegment(ids, s, st)
	}
	if m == nil {
		if text == "" {
			return ids
		}
		return rest(ids, text)
	}
	textStart, from := 0, 0
	for {
		start, end, tok, ok := m.find(text, from)
		if !ok {
			break
		}
		if tok.lstrip {
			start = max(whitespaceStartAtEnd(text[:start]), textStart)
		}
		if tok.rstrip {
			end += whitespaceLenAtStart(text[end:])
		}
		if textStart < start {
			ids = rest(ids, text[textStart:start])
		}
		ids = append(ids, tok.id)
		textStart, from = end, end
	}
	if textStart < len(text) {
		ids = rest(ids, text[textStart:])
	}
	return ids
}

// minCachedSegment keeps short segments (role names, separators) out of the shared
// cache: encoding them is cheaper than hashing and looking them up.
const minCachedSegment = 32

// appendSegment encodes text between raw added tokens, through the cache if any.
func (t *HFTokenizer) appendSegment(ids []uint32, seg string, st *encodeState) []uint32 {
	if t.cache == nil || len(seg) < minCachedSegment {
		return t.appendNormalized(ids, seg, st)
	}
	if cached, ok := t.cache.segment(t.model, seg); ok {
		return append(ids, cached...)
	}
	n := len(ids)
	ids = t.appendNormalized(ids, seg, st)
	t.cache.setSegment(t.model, seg, ids[n:])
	return ids
}

func (t *HFTokenizer) appendNormalized(ids []uint32, seg string, st *encodeState) []uint32 {
	if t.nfc && !isASCII(seg) {
		seg = norm.NFC.String(seg)
	}
	if t.addedNormalized != nil {
		return t.appendAddedSplit(ids, seg, t.addedNormalized, true, st)
	}
	return t.appendWords(ids, seg, st)
}

// appendWords pre-tokenizes s and encodes every word.
func (t *HFTokenizer) appendWords(ids []uint32, s string, st *encodeState) []uint32 {
	st.pieces, st.spare = t.pre.split(s, st.pieces, st.spare)
	for _, p := range st.pieces {
		ids = t.bpe.appendWord(ids, s[p.start:p.end], &st.bpe)
	}
	return ids
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

// Decode turns ids into text like Hugging Face's decode(ids, skip_special_tokens=False):
// the tokens' bytes through the byte-level decoder, with invalid UTF-8 replaced by
// U+FFFD per maximal invalid subsequence. transformers' clean_up_tokenization_spaces is
// not applied. An id no token has is an error wrapping ErrInvalidTokenID.
func (t *HFTokenizer) Decode(ids []uint32) (string, error) {
	n := 0
	for i, id := range ids {
		if int(id) >= t.vocabSize || t.tokenKinds[id] == kindUnused {
			return "", fmt.Errorf("%w: ids[%d]=%d, vocabulary size is %d", ErrInvalidTokenID, i, id, t.vocabSize)
		}
		n += int(t.tokenOffsets[id+1] - t.tokenOffsets[id])
	}
	raw := make([]byte, 0, n)
	for _, id := range ids {
		raw = append(raw, t.tokenBytes[t.tokenOffsets[id]:t.tokenOffsets[id+1]]...)
	}
	if utf8.Valid(raw) {
		return string(raw), nil
	}
	var sb strings.Builder
	sb.Grow(len(raw) + 8)
	appendLossyUTF8(&sb, raw)
	return sb.String(), nil
}

// appendLossyUTF8 writes b with each maximal invalid subsequence replaced by U+FFFD,
// as Rust's String::from_utf8_lossy does.
func appendLossyUTF8(sb *strings.Builder, b []byte) {
	for len(b) > 0 {
		r, w := utf8.DecodeRune(b)
		if r != utf8.RuneError || w > 1 {
			sb.Write(b[:w])
			b = b[w:]
			continue
		}
		sb.WriteRune(utf8.RuneError)
		b = b[maximalInvalidPrefix(b):]
	}
}

// maximalInvalidPrefix is the length of the ill-formed sequence at the start of b: its
// lead byte and the continuation bytes that could still have completed it (Unicode
// 3.9, table 3-7).
func maximalInvalidPrefix(b []byte) int {
	lo, hi, need := byte(0x80), byte(0xbf), 0
	switch c := b[0]; {
	case c >= 0xc2 && c <= 0xdf:
		need = 1
	case c == 0xe0:
		lo, need = 0xa0, 2
	case c == 0xed:
		hi, need = 0x9f, 2
	case c >= 0xe1 && c <= 0xef:
		need = 2
	case c == 0xf0:
		lo, need = 0x90, 3
	case c == 0xf4:
		hi, need = 0x8f, 3
	case c >= 0xf1 && c <= 0xf3:
		need = 3
	default:
		return 1
	}
	n := 1
	for k := 0; k < need && n < len(b); k++ {
		c := b[n]
		if k > 0 {
			lo, hi = 0x80, 0xbf
		}
		if c < lo || c > hi {
			break
		}
		n++
	}
	return n
}
