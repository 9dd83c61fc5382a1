package tokenize

import (
	"strings"
	"testing"
	"time"
)

// TestRegexSplitterStopsAtItsMatchTimeout: a pattern that backtracks
// exponentially on a crafted prompt returns once its match timeout passes,
// with the unmatched rest as one piece, instead of running for 2^40 steps.
func TestRegexSplitterStopsAtItsMatchTimeout(t *testing.T) {
	sp, err := newRegexSplitter(`(a+)+$`, 50*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	s := strings.Repeat("a", 40) + "b"
	pieces := sp.appendPieces(nil, s, 0)
	if len(pieces) != 1 || pieces[0] != (span{0, len(s)}) {
		t.Errorf("pieces = %v, want the whole text as one piece", pieces)
	}
	if got := newSplitterTimeout(t, `\s+`); got != regexMatchTimeout {
		t.Errorf("a tokenizer's regex splitter has match timeout %v, want %v", got, regexMatchTimeout)
	}
}

// newSplitterTimeout returns the match timeout newSplitter gives pattern.
func newSplitterTimeout(t *testing.T, pattern string) time.Duration {
	t.Helper()
	sp, err := newSplitter(pattern)
	if err != nil {
		t.Fatal(err)
	}
	rs, ok := sp.(regexSplitter)
	if !ok {
		t.Fatalf("newSplitter(%q) is a %T, not a regexSplitter", pattern, sp)
	}
	return rs.re.MatchTimeout
}
