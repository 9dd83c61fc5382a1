package tokenize

import (
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"
)

// addedToken is an entry of tokenizer.json's added_tokens: special tokens such as
// <|im_start|> and extra tokens such as <think>, matched in the text before anything
// else so that each occurrence becomes its one id.
type addedToken struct {
	id      uint32
	content string
	// pattern is what the token matches: its content, NFC-normalized when the token
	// is matched after normalization.
	pattern string
	// lstrip and rstrip extend a match over the whitespace before / after it.
	lstrip, rstrip bool
}

// addedMatcher finds added tokens leftmost-longest, as Hugging Face's Aho-Corasick
// automaton does: the earliest position where any token starts, and there the longest.
type addedMatcher struct {
	// byFirst[c] lists the tokens whose pattern starts with byte c, longest first.
	byFirst  [256][]int
	patterns []string
	tokens   []addedToken
	// onlyFirst is the first byte when all patterns share it (the usual '<'), letting
	// the search skip ahead with strings.IndexByte; -1 otherwise.
	onlyFirst int
}

// newAddedMatcher returns nil when there is nothing to match.
func newAddedMatcher(tokens []addedToken) *addedMatcher {
	m := &addedMatcher{onlyFirst: -1}
	for _, tok := range tokens {
		if tok.pattern == "" {
			continue
		}
		m.tokens = append(m.tokens, tok)
		m.patterns = append(m.patterns, tok.pattern)
	}
	if len(m.patterns) == 0 {
		return nil
	}
	for i, p := range m.patterns {
		m.byFirst[p[0]] = append(m.byFirst[p[0]], i)
	}
	firsts := 0
	for c := range m.byFirst {
		list := m.byFirst[c]
		if len(list) == 0 {
			continue
		}
		firsts++
		m.onlyFirst = c
		// Longest first; among equal lengths the earlier entry, as in the file.
		slices.SortStableFunc(list, func(a, b int) int { return len(m.patterns[b]) - len(m.patterns[a]) })
	}
	if firsts > 1 {
		m.onlyFirst = -1
	}
	return m
}

// find returns the leftmost-longest match in s at or after from.
func (m *addedMatcher) find(s string, from int) (start, end int, tok *addedToken, ok bool) {
	for i := from; i < len(s); i++ {
		if m.onlyFirst >= 0 {
			k := strings.IndexByte(s[i:], byte(m.onlyFirst))
			if k < 0 {
				return 0, 0, nil, false
			}
			i += k
		}
		for _, idx := range m.byFirst[s[i]] {
			if strings.HasPrefix(s[i:], m.patterns[idx]) {
				return i, i + len(m.patterns[idx]), &m.tokens[idx], true
			}
		}
	}
	return 0, 0, nil, false
}

// whitespaceStartAtEnd is where the whitespace at the end of s begins.
func whitespaceStartAtEnd(s string) int {
	for len(s) > 0 {
		r, w := utf8.DecodeLastRuneInString(s)
		if !unicode.IsSpace(r) {
			break
		}
		s = s[:len(s)-w]
	}
	return len(s)
}

// whitespaceLenAtStart is the length of the whitespace at the start of s.
func whitespaceLenAtStart(s string) int {
	n := 0
	for n < len(s) {
		r, w := utf8.DecodeRuneInString(s[n:])
		if !unicode.IsSpace(r) {
			break
		}
		n += w
	}
	return n
}
