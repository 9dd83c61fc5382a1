package tokenize

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strings"

	"golang.org/x/text/unicode/norm"
)

// This file reads tokenizer.json: the Hugging Face "tokenizers" serialization of a
// whole pipeline (added tokens, normalizer, pre-tokenizer, model, post-processor,
// decoder). Only the byte-level BPE pipelines of the model families we serve are
// accepted; anything else is refused with an error wrapping ErrNotSupported rather
// than encoded differently from the engine.

type tokenizerFile struct {
	AddedTokens   []addedTokenJSON `json:"added_tokens"`
	Normalizer    json.RawMessage  `json:"normalizer"`
	PreTokenizer  json.RawMessage  `json:"pre_tokenizer"`
	Model         json.RawMessage  `json:"model"`
	PostProcessor json.RawMessage  `json:"post_processor"`
	Decoder       json.RawMessage  `json:"decoder"`
	// truncation and padding are ignored: transformers overrides both on every call,
	// and vLLM asks for neither when it tokenizes a prompt.
}

type addedTokenJSON struct {
	ID         uint32 `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized bool   `json:"normalized"`
}

type bpeModelJSON struct {
	Type                    string            `json:"type"`
	Dropout                 *float64          `json:"dropout"`
	UnkToken                *string           `json:"unk_token"`
	ContinuingSubwordPrefix *string           `json:"continuing_subword_prefix"`
	EndOfWordSuffix         *string           `json:"end_of_word_suffix"`
	ByteFallback            bool              `json:"byte_fallback"`
	IgnoreMerges            bool              `json:"ignore_merges"`
	Vocab                   map[string]uint32 `json:"vocab"`
	Merges                  json.RawMessage   `json:"merges"`
}

// component is the common head of normalizers, pre-tokenizers, processors, decoders.
type component struct {
	Type string `json:"type"`
}

func isNull(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return len(t) == 0 || string(t) == "null"
}

func componentType(raw json.RawMessage, what string) (string, error) {
	var c component
	if err := json.Unmarshal(raw, &c); err != nil {
		return "", fmt.Errorf("%w: %s: %v", ErrBadTokenizerFile, what, err)
	}
	return c.Type, nil
}

// parseNormalizer accepts no normalizer, NFC, or a Sequence of those; it reports
// whether NFC applies.
func parseNormalizer(raw json.RawMessage) (nfc bool, err error) {
	if isNull(raw) {
		return false, nil
	}
	typ, err := componentType(raw, "normalizer")
	if err != nil {
		return false, err
	}
	switch typ {
	case "NFC":
		return true, nil
	case "Sequence":
		var seq struct {
			Normalizers []json.RawMessage `json:"normalizers"`
		}
		if err := json.Unmarshal(raw, &seq); err != nil {
			return false, fmt.Errorf("%w: normalizer: %v", ErrBadTokenizerFile, err)
		}
		for _, n := range seq.Normalizers {
			sub, err := parseNormalizer(n)
			if err != nil {
				return false, err
			}
			nfc = nfc || sub
		}
		return nfc, nil
	}
	return false, fmt.Errorf("%w: normalizer %q (supported: NFC, or none)", ErrNotSupported, typ)
}

// parsePreTokenizer flattens Split steps (Isolated, not inverted) ending in a
// ByteLevel step; a lone ByteLevel with use_regex applies GPT-2's split itself.
func parsePreTokenizer(raw json.RawMessage) (*preTokenizer, error) {
	if isNull(raw) {
		return nil, fmt.Errorf("%w: no pre_tokenizer: only byte-level BPE tokenizers are supported", ErrNotSupported)
	}
	var steps []json.RawMessage
	typ, err := componentType(raw, "pre_tokenizer")
	if err != nil {
		return nil, err
	}
	if typ == "Sequence" {
		var seq struct {
			PreTokenizers []json.RawMessage `json:"pretokenizers"`
		}
		if err := json.Unmarshal(raw, &seq); err != nil {
			return nil, fmt.Errorf("%w: pre_tokenizer: %v", ErrBadTokenizerFile, err)
		}
		steps = seq.PreTokenizers
	} else {
		steps = []json.RawMessage{raw}
	}
	pre := &preTokenizer{}
	for i, step := range steps {
		typ, err := componentType(step, "pre_tokenizer")
		if err != nil {
			return nil, err
		}
		switch typ {
		case "Split":
			if i == len(steps)-1 {
				return nil, fmt.Errorf("%w: pre_tokenizer ends in a Split, not ByteLevel", ErrNotSupported)
			}
			sp, err := parseSplit(step)
			if err != nil {
				return nil, err
			}
			pre.steps = append(pre.steps, sp)
		case "ByteLevel":
			if i != len(steps)-1 {
				return nil, fmt.Errorf("%w: pre_tokenizer step %d: ByteLevel before other steps", ErrNotSupported, i)
			}
			var bl struct {
				AddPrefixSpace bool  `json:"add_prefix_space"`
				UseRegex       *bool `json:"use_regex"`
			}
			if err := json.Unmarshal(step, &bl); err != nil {
				return nil, fmt.Errorf("%w: ByteLevel pre_tokenizer: %v", ErrBadTokenizerFile, err)
			}
			if bl.AddPrefixSpace {
				return nil, fmt.Errorf("%w: ByteLevel pre_tokenizer with add_prefix_space", ErrNotSupported)
			}
			if bl.UseRegex == nil || *bl.UseRegex { // the field defaults to true
				sp, err := newSplitter(patternGPT2)
				if err != nil {
					return nil, err
				}
				pre.steps = append(pre.steps, sp)
			}
			return pre, nil
		default:
			return nil, fmt.Errorf("%w: pre_tokenizer %q (supported: Split, ByteLevel, Sequence of them)", ErrNotSupported, typ)
		}
	}
	return nil, fmt.Errorf("%w: pre_tokenizer has no ByteLevel step: only byte-level BPE tokenizers are supported", ErrNotSupported)
}

func parseSplit(raw json.RawMessage) (splitter, error) {
	var sp struct {
		Pattern struct {
			Regex  *string `json:"Regex"`
			String *string `json:"String"`
		} `json:"pattern"`
		Behavior string `json:"behavior"`
		Invert   bool   `json:"invert"`
	}
	if err := json.Unmarshal(raw, &sp); err != nil {
		return nil, fmt.Errorf("%w: Split pre_tokenizer: %v", ErrBadTokenizerFile, err)
	}
	if sp.Behavior != "Isolated" || sp.Invert {
		return nil, fmt.Errorf("%w: Split pre_tokenizer with behavior %q, invert %v (supported: Isolated, not inverted)", ErrNotSupported, sp.Behavior, sp.Invert)
	}
	switch {
	case sp.Pattern.Regex != nil:
		return newSplitter(*sp.Pattern.Regex)
	case sp.Pattern.String != nil && *sp.Pattern.String != "":
		return literalSplitter{literal: *sp.Pattern.String}, nil
	}
	return nil, fmt.Errorf("%w: Split pre_tokenizer without a pattern", ErrBadTokenizerFile)
}

// parseBPE builds the model: raw-byte vocabulary, merge table, and the table of words
// that are single tokens.
func parseBPE(raw json.RawMessage) (*bpe, []string, error) {
	var mj bpeModelJSON
	if err := json.Unmarshal(raw, &mj); err != nil {
		return nil, nil, fmt.Errorf("%w: model: %v", ErrBadTokenizerFile, err)
	}
	switch {
	case mj.Type != "BPE" && mj.Type != "":
		return nil, nil, fmt.Errorf("%w: model %q (supported: BPE)", ErrNotSupported, mj.Type)
	case mj.Dropout != nil && *mj.Dropout != 0:
		return nil, nil, fmt.Errorf("%w: BPE dropout %v", ErrNotSupported, *mj.Dropout)
	case mj.ByteFallback:
		return nil, nil, fmt.Errorf("%w: BPE byte_fallback (a SentencePiece-style vocabulary)", ErrNotSupported)
	case mj.ContinuingSubwordPrefix != nil && *mj.ContinuingSubwordPrefix != "":
		return nil, nil, fmt.Errorf("%w: BPE continuing_subword_prefix %q", ErrNotSupported, *mj.ContinuingSubwordPrefix)
	case mj.EndOfWordSuffix != nil && *mj.EndOfWordSuffix != "":
		return nil, nil, fmt.Errorf("%w: BPE end_of_word_suffix %q", ErrNotSupported, *mj.EndOfWordSuffix)
	case len(mj.Vocab) == 0:
		return nil, nil, fmt.Errorf("%w: empty BPE vocabulary", ErrBadTokenizerFile)
	}
	// tokens[id] is the vocabulary spelling, for merges and decoding.
	maxID := uint32(0)
	for _, id := range mj.Vocab {
		maxID = max(maxID, id)
	}
	if maxID >= math.MaxUint32-1 || int(maxID) > 4*len(mj.Vocab)+1024 {
		return nil, nil, fmt.Errorf("%w: vocabulary ids reach %d for %d entries", ErrBadTokenizerFile, maxID, len(mj.Vocab))
	}
	tokens := make([]string, maxID+1)
	m := &bpe{whole: make(map[string]uint32, len(mj.Vocab)), cache: newWordCache()}
	for tok, id := range mj.Vocab {
		tokens[id] = tok
	}
	for b := 0; b < 256; b++ {
		id, ok := mj.Vocab[string(byteLevelRunes[b])]
		if !ok {
			return nil, nil, fmt.Errorf("%w: vocabulary lacks byte 0x%02x (%q): not a byte-level BPE vocabulary", ErrNotSupported, b, byteLevelRunes[b])
		}
		m.byteIDs[b] = id
	}
	pairs, err := parseMerges(mj.Merges)
	if err != nil {
		return nil, nil, err
	}
	m.merges = make(map[uint64]uint64, len(pairs))
	for rank, p := range pairs {
		left, okL := mj.Vocab[p[0]]
		right, okR := mj.Vocab[p[1]]
		merged, okM := mj.Vocab[p[0]+p[1]]
		if !okL || !okR || !okM {
			return nil, nil, fmt.Errorf("%w: merge %d (%q %q) names a token missing from the vocabulary", ErrBadTokenizerFile, rank, p[0], p[1])
		}
		// A repeated pair keeps its last rank, as Hugging Face's map does.
		m.merges[pairKey(left, right)] = uint64(rank)<<32 | uint64(merged)
	}
	var sc bpeScratch
	for tok, id := range mj.Vocab {
		word, ok := byteLevelBytes(tok)
		if !ok {
			continue
		}
		if mj.IgnoreMerges {
			m.whole[word] = id
			continue
		}
		var ids []uint32
		if len(word) <= linearMergeLimit {
			ids = m.mergeLinear(word, &sc)
		} else {
			ids = m.mergeHeap(word, &sc)
		}
		if len(ids) == 1 && ids[0] == id {
			m.whole[word] = id
		}
	}
	return m, tokens, nil
}

// parseMerges accepts both spellings: ["a b", ...] and [["a", "b"], ...].
func parseMerges(raw json.RawMessage) ([][2]string, error) {
	if isNull(raw) {
		return nil, nil
	}
	var pairs [][2]string
	if err := json.Unmarshal(raw, &pairs); err == nil {
		return pairs, nil
	}
	var lines []string
	if err := json.Unmarshal(raw, &lines); err != nil {
		return nil, fmt.Errorf("%w: merges: %v", ErrBadTokenizerFile, err)
	}
	pairs = make([][2]string, len(lines))
	for i, line := range lines {
		left, right, ok := strings.Cut(line, " ")
		if !ok || strings.Contains(right, " ") {
			return nil, fmt.Errorf("%w: merge %d %q is not two tokens separated by a space", ErrBadTokenizerFile, i, line)
		}
		pairs[i] = [2]string{left, right}
	}
	return pairs, nil
}

// parsePostProcessor returns the ids a single sequence gets before and after it when
// special tokens are added. ByteLevel processors only adjust offsets.
func parsePostProcessor(raw json.RawMessage) (prefix, suffix []uint32, err error) {
	if isNull(raw) {
		return nil, nil, nil
	}
	typ, err := componentType(raw, "post_processor")
	if err != nil {
		return nil, nil, err
	}
	switch typ {
	case "ByteLevel":
		return nil, nil, nil
	case "Sequence":
		var seq struct {
			Processors []json.RawMessage `json:"processors"`
		}
		if err := json.Unmarshal(raw, &seq); err != nil {
			return nil, nil, fmt.Errorf("%w: post_processor: %v", ErrBadTokenizerFile, err)
		}
		for _, p := range seq.Processors {
			pre, suf, err := parsePostProcessor(p)
			if err != nil {
				return nil, nil, err
			}
			if len(pre)+len(suf) > 0 && len(prefix)+len(suffix) > 0 {
				return nil, nil, fmt.Errorf("%w: post_processor Sequence with two templates", ErrNotSupported)
			}
			if len(pre)+len(suf) > 0 {
				prefix, suffix = pre, suf
			}
		}
		return prefix, suffix, nil
	case "TemplateProcessing":
		return parseTemplateProcessing(raw)
	}
	return nil, nil, fmt.Errorf("%w: post_processor %q (supported: ByteLevel, TemplateProcessing, Sequence of them)", ErrNotSupported, typ)
}

func parseTemplateProcessing(raw json.RawMessage) (prefix, suffix []uint32, err error) {
	var tp struct {
		Single []struct {
			SpecialToken *struct {
				ID string `json:"id"`
			} `json:"SpecialToken"`
			Sequence *struct {
				ID string `json:"id"`
			} `json:"Sequence"`
		} `json:"single"`
		SpecialTokens map[string]struct {
			IDs []uint32 `json:"ids"`
		} `json:"special_tokens"`
	}
	if err := json.Unmarshal(raw, &tp); err != nil {
		return nil, nil, fmt.Errorf("%w: TemplateProcessing: %v", ErrBadTokenizerFile, err)
	}
	seenSequence := false
	for i, piece := range tp.Single {
		switch {
		case piece.Sequence != nil:
			if seenSequence || piece.Sequence.ID != "A" {
				return nil, nil, fmt.Errorf("%w: TemplateProcessing single template piece %d: sequence %q", ErrNotSupported, i, piece.Sequence.ID)
			}
			seenSequence = true
		case piece.SpecialToken != nil:
			st, ok := tp.SpecialTokens[piece.SpecialToken.ID]
			if !ok {
				return nil, nil, fmt.Errorf("%w: TemplateProcessing uses undefined special token %q", ErrBadTokenizerFile, piece.SpecialToken.ID)
			}
			if seenSequence {
				suffix = append(suffix, st.IDs...)
			} else {
				prefix = append(prefix, st.IDs...)
			}
		default:
			return nil, nil, fmt.Errorf("%w: TemplateProcessing single template piece %d is neither SpecialToken nor Sequence", ErrBadTokenizerFile, i)
		}
	}
	if !seenSequence {
		return nil, nil, fmt.Errorf("%w: TemplateProcessing single template has no sequence", ErrBadTokenizerFile)
	}
	return prefix, suffix, nil
}

func checkDecoder(raw json.RawMessage) error {
	if isNull(raw) {
		return fmt.Errorf("%w: no decoder (supported: ByteLevel)", ErrNotSupported)
	}
	typ, err := componentType(raw, "decoder")
	if err != nil {
		return err
	}
	if typ != "ByteLevel" {
		return fmt.Errorf("%w: decoder %q (supported: ByteLevel)", ErrNotSupported, typ)
	}
	return nil
}

// parseAddedTokens splits the added tokens into those matched in the raw text and
// those matched after normalization (whose patterns are normalized too).
func parseAddedTokens(list []addedTokenJSON, nfc bool) (raw, normalized *addedMatcher, byID map[uint32]addedToken, err error) {
	byID = make(map[uint32]addedToken, len(list))
	var rawToks, normToks []addedToken
	for _, a := range list {
		if a.SingleWord {
			return nil, nil, nil, fmt.Errorf("%w: added token %q with single_word", ErrNotSupported, a.Content)
		}
		tok := addedToken{id: a.ID, content: a.Content, pattern: a.Content, lstrip: a.LStrip, rstrip: a.RStrip}
		if a.Normalized && nfc {
			tok.pattern = norm.NFC.String(a.Content)
		}
		byID[a.ID] = tok
		if a.Normalized {
			normToks = append(normToks, tok)
		} else {
			rawToks = append(rawToks, tok)
		}
	}
	return newAddedMatcher(rawToks), newAddedMatcher(normToks), byID, nil
}
