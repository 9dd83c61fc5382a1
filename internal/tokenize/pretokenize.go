package tokenize

import (
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/dlclark/regexp2"
)

// The pre-tokenizer cuts normalized text into pieces ("words") that BPE then encodes
// one by one. Byte-level tokenizers do it with Split steps whose regular expressions
// use a negative lookahead, (?!\S), which Go's regexp lacks. The patterns of the model
// families we serve are matched by hand-written scanners below (fast, and written from
// the regex semantics: leftmost alternative wins, greedy with backtracking); any other
// pattern goes to regexp2, a backtracking engine with lookaround.

// Split patterns known to the hand-written scanners, exactly as tokenizer.json spells them.
const (
	// Qwen2, Qwen2.5, Qwen3: digits one by one.
	patternQwen2 = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// Llama 3.x (tiktoken's cl100k): digits in runs of up to three.
	patternLlama3 = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// DeepSeek-V3 (and R1): three isolating splits in sequence.
	patternDeepSeekDigits = `\p{N}{1,3}`
	patternDeepSeekCJK    = "[一-龥\u3040-ゟ゠-ヿ]+"
	patternDeepSeekMain   = "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"
	// GPT-2's split, applied by a ByteLevel pre-tokenizer with use_regex.
	patternGPT2 = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
)

// span is a piece of a text: bytes [start, end).
type span struct{ start, end int }

// splitter is one Split step with the Isolated behaviour: it cuts s into the matches of
// its pattern and the gaps between them, keeping both, in order.
type splitter interface {
	// appendPieces appends the non-empty pieces of s, shifted by base, to dst.
	appendPieces(dst []span, s string, base int) []span
}

// newSplitter returns the scanner for a Split regex: a hand-written one when the
// pattern is known, regexp2 otherwise.
func newSplitter(pattern string) (splitter, error) {
	switch pattern {
	case patternQwen2:
		return contractionSplitter{maxDigits: 1}, nil
	case patternLlama3:
		return contractionSplitter{maxDigits: 3}, nil
	case patternDeepSeekDigits:
		return numberRunSplitter{maxDigits: 3}, nil
	case patternDeepSeekCJK:
		return cjkRunSplitter{}, nil
	case patternDeepSeekMain:
		return deepSeekSplitter{}, nil
	}
	return newRegexSplitter(pattern, regexMatchTimeout)
}

// regexMatchTimeout bounds one regexp2 match. regexp2 backtracks, so a
// tokenizer.json pattern with nested quantifiers can take exponential time on
// a crafted prompt; the prompt comes from any client of the indexer.
const regexMatchTimeout = time.Second

func newRegexSplitter(pattern string, timeout time.Duration) (splitter, error) {
	re, err := regexp2.Compile(pattern, regexp2.None)
	if err != nil {
		return nil, fmt.Errorf("%w: split pattern %q does not compile: %v", ErrNotSupported, pattern, err)
	}
	re.MatchTimeout = timeout
	return regexSplitter{re: re}, nil
}

// preTokenizer runs its Split steps in sequence, each on every piece of the previous.
type preTokenizer struct {
	steps []splitter
}

// split returns the pieces of s, using the two buffers for the intermediate steps.
func (p *preTokenizer) split(s string, buf, tmp []span) (pieces, spare []span) {
	pieces = append(buf[:0], span{0, len(s)})
	if len(s) == 0 {
		return pieces[:0], tmp
	}
	for _, step := range p.steps {
		next := tmp[:0]
		for _, piece := range pieces {
			next = step.appendPieces(next, s[piece.start:piece.end], piece.start)
		}
		pieces, tmp = next, pieces
	}
	return pieces, tmp
}

// Character classes of the scanners.
const (
	classOther   uint8 = iota // none of the below (punctuation, symbols, marks, controls)
	classLetter               // \p{L}
	classNumber               // \p{N}
	classSpace                // \s except \r and \n
	classNewline              // \r or \n
)

var asciiClasses = func() [utf8.RuneSelf]uint8 {
	var t [utf8.RuneSelf]uint8
	for c := 0; c < utf8.RuneSelf; c++ {
		t[c] = classOfSlow(rune(c))
	}
	return t
}()

func classOfSlow(r rune) uint8 {
	switch {
	case r == '\r' || r == '\n':
		return classNewline
	case unicode.IsLetter(r):
		return classLetter
	case unicode.IsNumber(r):
		return classNumber
	case unicode.IsSpace(r):
		return classSpace
	}
	return classOther
}

// runeAt decodes the character at s[i]. An invalid byte decodes as U+FFFD of width 1,
// which every scanner treats as an ordinary symbol.
func runeAt(s string, i int) (rune, int) {
	if c := s[i]; c < utf8.RuneSelf {
		return rune(c), 1
	}
	return utf8.DecodeRuneInString(s[i:])
}

func classAt(s string, i int) (cls uint8, width int) {
	if c := s[i]; c < utf8.RuneSelf {
		return asciiClasses[c], 1
	}
	r, w := utf8.DecodeRuneInString(s[i:])
	return classOfSlow(r), w
}

// runEnd returns the end of the run of characters of class cls starting at i.
func runEnd(s string, i int, cls uint8) int {
	for i < len(s) {
		c, w := classAt(s, i)
		if c != cls {
			break
		}
		i += w
	}
	return i
}

// newlinesEnd is [\r\n]* from i.
func newlinesEnd(s string, i int) int {
	for i < len(s) && (s[i] == '\r' || s[i] == '\n') {
		i++
	}
	return i
}

// whitespaceEnd matches `\s*[\r\n]+|\s+(?!\S)|\s+` at i, where s[i] is whitespace:
// through the last line break of the whitespace run if it has one; else the whole run
// when it ends the text; else the run less its last character, which then starts the
// next piece (so " word" stays together), unless the run is that one character.
func whitespaceEnd(s string, i int) int {
	lastBreak, lastStart, j := -1, i, i
	for j < len(s) {
		r, w := runeAt(s, j)
		if r == '\r' || r == '\n' {
			lastBreak = j
		} else if !unicode.IsSpace(r) {
			break
		}
		lastStart = j
		j += w
	}
	switch {
	case lastBreak >= 0:
		return lastBreak + 1
	case j == len(s) || lastStart == i:
		return j
	}
	return lastStart
}

// contractionSplitter scans the Qwen2 and Llama 3 pattern:
//
//	(?i:'s|'t|'re|'ve|'m|'ll|'d) | [^\r\n\p{L}\p{N}]?\p{L}+ | \p{N}{1,maxDigits} |
//	 ?[^\s\p{L}\p{N}]+[\r\n]* | \s*[\r\n]+ | \s+(?!\S) | \s+
//
// Every character is matched by some alternative, so there are no gaps.
type contractionSplitter struct{ maxDigits int }

func (p contractionSplitter) appendPieces(dst []span, s string, base int) []span {
	for i := 0; i < len(s); {
		end := p.pieceEnd(s, i)
		dst = append(dst, span{base + i, base + end})
		i = end
	}
	return dst
}

func (p contractionSplitter) pieceEnd(s string, i int) int {
	cls, w := classAt(s, i)
	j := i + w
	switch cls {
	case classLetter:
		return runEnd(s, j, classLetter)
	case classNumber:
		for n := 1; n < p.maxDigits && j < len(s); n++ {
			c, w := classAt(s, j)
			if c != classNumber {
				break
			}
			j += w
		}
		return j
	case classOther:
		if s[i] == '\'' {
			if n := contractionLen(s[j:]); n > 0 {
				return j + n
			}
		}
		if j < len(s) {
			if c, _ := classAt(s, j); c == classLetter {
				return runEnd(s, j, classLetter)
			}
		}
		return newlinesEnd(s, runEnd(s, j, classOther))
	case classSpace:
		if j < len(s) {
			c, _ := classAt(s, j)
			if c == classLetter {
				return runEnd(s, j, classLetter)
			}
			if c == classOther && s[i] == ' ' {
				return newlinesEnd(s, runEnd(s, j, classOther))
			}
		}
		return whitespaceEnd(s, i)
	}
	return whitespaceEnd(s, i)
}

// contractionLen is the length of a case-insensitive s|t|m|d|re|ve|ll at the start of
// rest (the text after an apostrophe), or 0.
func contractionLen(rest string) int {
	if len(rest) == 0 {
		return 0
	}
	switch rest[0] | 0x20 {
	case 's', 't', 'm', 'd':
		return 1
	}
	if len(rest) < 2 {
		return 0
	}
	c0, c1 := rest[0]|0x20, rest[1]|0x20
	if (c0 == 'r' && c1 == 'e') || (c0 == 'v' && c1 == 'e') || (c0 == 'l' && c1 == 'l') {
		return 2
	}
	return 0
}

// numberRunSplitter isolates \p{N}{1,maxDigits}: runs of numbers cut into groups.
type numberRunSplitter struct{ maxDigits int }

func (p numberRunSplitter) appendPieces(dst []span, s string, base int) []span {
	gap := 0
	for i := 0; i < len(s); {
		cls, w := classAt(s, i)
		if cls != classNumber {
			i += w
			continue
		}
		end, n := i+w, 1
		for ; n < p.maxDigits && end < len(s); n++ {
			c, w := classAt(s, end)
			if c != classNumber {
				break
			}
			end += w
		}
		dst = appendGapAndMatch(dst, base, gap, i, end)
		gap, i = end, end
	}
	if gap < len(s) {
		dst = append(dst, span{base + gap, base + len(s)})
	}
	return dst
}

// appendGapAndMatch appends the gap [gap, start) if not empty, then the match.
func appendGapAndMatch(dst []span, base, gap, start, end int) []span {
	if gap < start {
		dst = append(dst, span{base + gap, base + start})
	}
	return append(dst, span{base + start, base + end})
}

// cjkRunSplitter isolates runs of [一-龥\u3040-ゟ゠-ヿ] (CJK ideographs to U+9FA5,
// hiragana, katakana).
type cjkRunSplitter struct{}

func isDeepSeekCJK(r rune) bool {
	return (r >= 0x4e00 && r <= 0x9fa5) || (r >= 0x3040 && r <= 0x30ff)
}

func (cjkRunSplitter) appendPieces(dst []span, s string, base int) []span {
	gap := 0
	for i := 0; i < len(s); {
		r, w := runeAt(s, i)
		if !isDeepSeekCJK(r) {
			i += w
			continue
		}
		end := i + w
		for end < len(s) {
			r, w := runeAt(s, end)
			if !isDeepSeekCJK(r) {
				break
			}
			end += w
		}
		dst = appendGapAndMatch(dst, base, gap, i, end)
		gap, i = end, end
	}
	if gap < len(s) {
		dst = append(dst, span{base + gap, base + len(s)})
	}
	return dst
}

// deepSeekSplitter scans DeepSeek-V3's main pattern:
//
//	[ASCII punctuation][A-Za-z]+ | [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+ |
//	 ?[\p{P}\p{S}]+[\r\n]* | \s*[\r\n]+ | \s+(?!\S) | \s+
//
// Characters no alternative matches (numbers, controls, ...) are left as gaps.
type deepSeekSplitter struct{}

func (deepSeekSplitter) appendPieces(dst []span, s string, base int) []span {
	gap := 0
	for i := 0; i < len(s); {
		end := deepSeekMatchEnd(s, i)
		if end == i {
			_, w := runeAt(s, i)
			i += w
			continue
		}
		dst = appendGapAndMatch(dst, base, gap, i, end)
		gap, i = end, end
	}
	if gap < len(s) {
		dst = append(dst, span{base + gap, base + len(s)})
	}
	return dst
}

func isLetterOrMark(r rune) bool  { return unicode.IsLetter(r) || unicode.IsMark(r) }
func isPunctOrSymbol(r rune) bool { return unicode.IsPunct(r) || unicode.IsSymbol(r) }
func isASCIILetter(c byte) bool   { return (c|0x20) >= 'a' && (c|0x20) <= 'z' }
func isASCIIPunctuation(r rune) bool {
	return r < utf8.RuneSelf && r > ' ' && r != 0x7f && !isASCIILetter(byte(r)) && (r < '0' || r > '9')
}
func runeRunEnd(s string, i int, in func(rune) bool) int {
	for i < len(s) {
		r, w := runeAt(s, i)
		if !in(r) {
			break
		}
		i += w
	}
	return i
}

// deepSeekMatchEnd returns the end of the match at i, or i when nothing matches there.
func deepSeekMatchEnd(s string, i int) int {
	r, w := runeAt(s, i)
	j := i + w
	if isASCIIPunctuation(r) && j < len(s) && isASCIILetter(s[j]) {
		for j < len(s) && isASCIILetter(s[j]) {
			j++
		}
		return j
	}
	if isLetterOrMark(r) {
		return runeRunEnd(s, j, isLetterOrMark)
	}
	if r != '\r' && r != '\n' && !isPunctOrSymbol(r) && j < len(s) {
		if next, _ := runeAt(s, j); isLetterOrMark(next) {
			return runeRunEnd(s, j, isLetterOrMark)
		}
	}
	if r == ' ' && j < len(s) {
		if next, _ := runeAt(s, j); isPunctOrSymbol(next) {
			return newlinesEnd(s, runeRunEnd(s, j, isPunctOrSymbol))
		}
	}
	if isPunctOrSymbol(r) {
		return newlinesEnd(s, runeRunEnd(s, j, isPunctOrSymbol))
	}
	if unicode.IsSpace(r) {
		return whitespaceEnd(s, i)
	}
	return i
}

// literalSplitter isolates every occurrence of a fixed string.
type literalSplitter struct{ literal string }

func (p literalSplitter) appendPieces(dst []span, s string, base int) []span {
	gap := 0
	for gap < len(s) {
		k := strings.Index(s[gap:], p.literal)
		if k < 0 {
			break
		}
		start := gap + k
		dst = appendGapAndMatch(dst, base, gap, start, start+len(p.literal))
		gap = start + len(p.literal)
	}
	if gap < len(s) {
		dst = append(dst, span{base + gap, base + len(s)})
	}
	return dst
}

// regexSplitter runs any other pattern with regexp2, which matches on runes; offsets are
// mapped back to bytes. Empty matches are skipped, as Hugging Face drops empty pieces.
type regexSplitter struct{ re *regexp2.Regexp }

func (p regexSplitter) appendPieces(dst []span, s string, base int) []span {
	runes := make([]rune, 0, len(s))
	offsets := make([]int, 0, len(s)+1)
	for i := 0; i < len(s); {
		r, w := runeAt(s, i)
		runes = append(runes, r)
		offsets = append(offsets, i)
		i += w
	}
	offsets = append(offsets, len(s))
	gap := 0
	m, err := p.re.FindRunesMatch(runes)
	for err == nil && m != nil {
		if m.Length > 0 {
			start, end := offsets[m.Index], offsets[m.Index+m.Length]
			dst = appendGapAndMatch(dst, base, gap, start, end)
			gap = end
		}
		m, err = p.re.FindNextMatch(m)
	}
	// err is only a match timeout (regexMatchTimeout): the rest of s stays one
	// piece, so such a prompt is cut into other tokens than Hugging Face would
	// cut it, rather than holding a CPU for as long as the backtracking takes.
	if gap < len(s) {
		dst = append(dst, span{base + gap, base + len(s)})
	}
	return dst
}
