package tokenize

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Before ardanlabs/jinja compiles a chat template, its source is read the way Jinja2's
// lexer reads it: scanTags finds the {{ }} and {% %} tags (comments and raw blocks are
// text) and splits each tag's inside into tokens. The tokens serve two readers: the
// content-format detection (contentformat.go), which parses {% for %} and {% set %}
// statements as vLLM does with Jinja2's parser, and rewriteTemplate, which reroutes the
// few filters, methods and globals whose Python semantics the engine lacks to our own
// implementations (pybuiltins.go).

type tokKind uint8

const (
	tokName tokKind = iota + 1
	tokString
	tokNumber
	tokOp
)

// token is one lexeme of a tag: a name (keywords such as "in" and "not" included, as in
// Jinja2), a string literal, a number or an operator.
type token struct {
	kind tokKind
	// text is the token's source text, quotes included for a string.
	text string
	// pos and end are its byte offsets in the template source.
	pos, end int
}

func (t token) is(kind tokKind, text string) bool { return t.kind == kind && t.text == text }

// tag is one {{ }} or {% %} tag.
type tag struct {
	// block is true for {% %}.
	block bool
	toks  []token
}

// rawBlockStart and rawBlockEnd are Jinja2's {% raw %} and {% endraw %} (matched after
// the "{%"), whose inside is text.
var (
	rawBlockStart = regexp.MustCompile(`^[-+]?\s*raw\s*(?:-%\}|%\})`)
	rawBlockEnd   = regexp.MustCompile(`\{%[-+]?\s*endraw\s*[-+]?%\}`)
)

// scanTags returns the tags of a template source in order. A source Jinja2's lexer
// refuses (an unclosed tag, comment or raw block, an unbalanced bracket, a character
// that starts no token) is an error.
func scanTags(src string) ([]tag, error) {
	var tags []tag
	for i := 0; ; {
		open := tagOpen(src, i)
		if open < 0 {
			return tags, nil
		}
		inner := open + 2
		switch src[open+1] {
		case '#':
			end := strings.Index(src[inner:], "#}")
			if end < 0 {
				return nil, fmt.Errorf("comment at byte %d is not closed", open)
			}
			i = inner + end + 2
			continue
		case '%':
			if m := rawBlockStart.FindStringIndex(src[inner:]); m != nil {
				end := rawBlockEnd.FindStringIndex(src[inner+m[1]:])
				if end == nil {
					return nil, fmt.Errorf("raw block at byte %d is not closed", open)
				}
				i = inner + m[1] + end[1]
				continue
			}
		}
		if inner < len(src) && (src[inner] == '-' || src[inner] == '+') {
			inner++
		}
		t, next, err := lexTag(src, inner, src[open+1] == '%')
		if err != nil {
			return nil, fmt.Errorf("tag at byte %d: %w", open, err)
		}
		tags = append(tags, t)
		i = next
	}
}

// tagOpen is the offset of the first "{{", "{%" or "{#" at or after i, or -1.
func tagOpen(src string, i int) int {
	for {
		j := strings.IndexByte(src[i:], '{')
		if j < 0 || i+j+1 >= len(src) {
			return -1
		}
		i += j
		if c := src[i+1]; c == '{' || c == '%' || c == '#' {
			return i
		}
		i++
	}
}

// closers pairs each closing bracket with its opening one.
var closers = map[string]string{")": "(", "]": "[", "}": "{"}

// lexTag reads the tokens of the tag whose inside starts at i, up to its end ("}}" or
// "%}", optionally after "-", or "+%}") outside brackets, and returns the tag and the
// offset after its end.
func lexTag(src string, i int, block bool) (tag, int, error) {
	t := tag{block: block}
	var open []string
	for {
		for i < len(src) {
			r, w := utf8.DecodeRuneInString(src[i:])
			if !pyIsSpace(r) {
				break
			}
			i += w
		}
		if i >= len(src) {
			return t, 0, fmt.Errorf("not closed")
		}
		if len(open) == 0 {
			rest := src[i:]
			if block {
				for _, end := range []string{"%}", "-%}", "+%}"} {
					if strings.HasPrefix(rest, end) {
						return t, i + len(end), nil
					}
				}
			} else if strings.HasPrefix(rest, "}}") || strings.HasPrefix(rest, "-}}") {
				return t, i + strings.Index(rest, "}}") + 2, nil
			}
		}
		tok, err := lexToken(src, i)
		if err != nil {
			return t, 0, err
		}
		if tok.kind == tokOp {
			switch tok.text {
			case "(", "[", "{":
				open = append(open, tok.text)
			case ")", "]", "}":
				if len(open) == 0 || open[len(open)-1] != closers[tok.text] {
					return t, 0, fmt.Errorf("unbalanced %q at byte %d", tok.text, tok.pos)
				}
				open = open[:len(open)-1]
			}
		}
		t.toks = append(t.toks, tok)
		i = tok.end
	}
}

// operators are Jinja2's, longest first so that "//" is not read as two "/".
var operators = []string{"//", "**", "==", "!=", ">=", "<=",
	"+", "-", "/", "*", "%", "~", "[", "]", "(", ")", "{", "}", ">", "<", "=", ".", ":", "|", ",", ";"}

// lexToken reads the token at src[i] (not white space), with Jinja2's rules in Jinja2's
// order: number, name, string, operator.
func lexToken(src string, i int) (token, error) {
	r, _ := utf8.DecodeRuneInString(src[i:])
	end := i
	kind := tokName
	switch {
	case r >= '0' && r <= '9':
		kind, end = tokNumber, numberEnd(src, i)
	case isNameRune(r):
		for end < len(src) {
			r, w := utf8.DecodeRuneInString(src[end:])
			if !isNameRune(r) {
				break
			}
			end += w
		}
	case r == '\'' || r == '"':
		kind = tokString
		end = i + 1
		for ; end < len(src) && src[end] != byte(r); end++ {
			if src[end] == '\\' {
				end++
			}
		}
		if end >= len(src) {
			return token{}, fmt.Errorf("string at byte %d is not closed", i)
		}
		end++
	default:
		kind = tokOp
		for _, op := range operators {
			if strings.HasPrefix(src[i:], op) {
				end = i + len(op)
				break
			}
		}
		if end == i {
			return token{}, fmt.Errorf("unexpected %q at byte %d", r, i)
		}
	}
	return token{kind: kind, text: src[i:end], pos: i, end: end}, nil
}

// isNameRune reports whether r continues a Jinja2 name (Python's \w: letters, digits,
// underscore, and the combining marks Jinja2 adds).
func isNameRune(r rune) bool {
	return r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.In(r, unicode.Mn, unicode.Mc, unicode.Nd, unicode.Pc)
}

// numberEnd is the end of the number starting at src[i]: digits (with "_"), then a
// fraction and an exponent for a float, or a 0b/0o/0x prefix and its digits.
func numberEnd(src string, i int) int {
	digits := func(j int) int {
		for j < len(src) && (src[j] >= '0' && src[j] <= '9' || src[j] == '_') {
			j++
		}
		return j
	}
	if src[i] == '0' && i+1 < len(src) && strings.ContainsRune("bBoOxX", rune(src[i+1])) {
		j := i + 2
		for j < len(src) && (isASCIILetter(src[j]) || src[j] >= '0' && src[j] <= '9' || src[j] == '_') {
			j++
		}
		return j
	}
	j := digits(i)
	// A float cannot follow a dot (x.0.1 is two subscripts).
	if i > 0 && src[i-1] == '.' {
		return j
	}
	if j+1 < len(src) && src[j] == '.' && src[j+1] >= '0' && src[j+1] <= '9' {
		j = digits(j + 1)
	}
	if j < len(src) && (src[j] == 'e' || src[j] == 'E') {
		k := j + 1
		if k < len(src) && (src[k] == '+' || src[k] == '-') {
			k++
		}
		if k < len(src) && src[k] >= '0' && src[k] <= '9' {
			j = digits(k)
		}
	}
	return j
}

// pyStringLiteral decodes a Jinja2 string token as Jinja2 does (Python's
// unicode-escape decoding of its inside).
func pyStringLiteral(lit string) (string, error) {
	in := lit[1 : len(lit)-1]
	var sb strings.Builder
	for i := 0; i < len(in); i++ {
		c := in[i]
		if c != '\\' || i+1 == len(in) {
			sb.WriteByte(c)
			continue
		}
		i++
		switch e := in[i]; e {
		case '\n':
		case '\\', '\'', '"':
			sb.WriteByte(e)
		case 'a', 'b', 'f', 'n', 'r', 't', 'v':
			sb.WriteByte("\a\b\f\n\r\t\v"[strings.IndexByte("abfnrtv", e)])
		case 'x', 'u', 'U':
			n := 2
			switch e {
			case 'u':
				n = 4
			case 'U':
				n = 8
			}
			if i+1+n > len(in) {
				return "", fmt.Errorf("truncated \\%c escape in %s", e, lit)
			}
			r, err := strconv.ParseUint(in[i+1:i+1+n], 16, 32)
			if err != nil || r > unicode.MaxRune {
				return "", fmt.Errorf("bad \\%c escape in %s", e, lit)
			}
			sb.WriteRune(rune(r))
			i += n
		case '0', '1', '2', '3', '4', '5', '6', '7':
			j := i
			for j < len(in) && j < i+3 && in[j] >= '0' && in[j] <= '7' {
				j++
			}
			r, _ := strconv.ParseUint(in[i:j], 8, 32)
			sb.WriteRune(rune(r))
			i = j - 1
		case 'N':
			return "", fmt.Errorf("\\N{...} escape in %s is not supported", lit)
		default:
			sb.WriteByte('\\')
			sb.WriteByte(e)
		}
	}
	return sb.String(), nil
}

// rewriteTemplate returns src (whose tags scanTags gave) with, in every tag:
//
//   - the expression of {{ }} printed by ours (kvindex_str(x)): the engine prints
//     values its own way, not as Python's str();
//   - the tojson, trim and string filters renamed to ours: the engine looks a filter
//     up among its built-ins before the render variables;
//   - x.strip(...), x.lstrip(...) and x.rstrip(...) made calls of ours
//     (kvindex_strip(x, ...)): the engine resolves string methods itself;
//   - dict(k=v, ...) given its keywords' order as one more keyword
//     (kvindex_order=['k', ...]): the engine hands a function its keywords in a map.
//
// A call whose receiver or arguments it cannot delimit is left as it is.
func rewriteTemplate(src string, tags []tag) string {
	var edits []edit
	for _, t := range tags {
		toks := t.toks
		for i, tok := range toks {
			switch {
			case tok.kind == tokName && filterNames[tok.text] != "" && i > 0 &&
				(toks[i-1].is(tokOp, "|") || i == 1 && t.block && toks[0].is(tokName, "filter")):
				edits = append(edits, edit{pos: tok.pos, end: tok.end, text: filterNames[tok.text]})
			case tok.is(tokOp, ".") && i > 0 && i+2 < len(toks) && toks[i+1].kind == tokName &&
				stripNames[toks[i+1].text] != "" && toks[i+2].is(tokOp, "("):
				start := chainStart(toks, i-1)
				if start < 0 {
					continue
				}
				sep := ", "
				if toks[i+3].is(tokOp, ")") {
					sep = ""
				}
				edits = append(edits,
					edit{pos: toks[start].pos, end: toks[start].pos, text: stripNames[toks[i+1].text] + "("},
					edit{pos: tok.pos, end: toks[i+2].end, text: sep})
			case tok.is(tokName, "dict") && i+1 < len(toks) && toks[i+1].is(tokOp, "(") &&
				(i == 0 || !toks[i-1].is(tokOp, ".") && !toks[i-1].is(tokOp, "|") && !toks[i-1].is(tokName, "is") && !toks[i-1].is(tokName, "macro")):
				if e, ok := dictOrderEdit(toks, i+1); ok {
					edits = append(edits, e)
				}
			}
		}
		// Made last, so that it encloses the rest at the same place.
		if !t.block && len(toks) > 0 {
			edits = append(edits,
				edit{pos: toks[0].pos, end: toks[0].pos, text: strName + "("},
				edit{pos: toks[len(toks)-1].end, end: toks[len(toks)-1].end, text: ")"})
		}
	}
	// Edits are applied in source order; of two insertions at one place (the receivers
	// of x.strip().lstrip() start together), the later call encloses the earlier one.
	slices.SortStableFunc(edits, func(a, b edit) int { return a.pos - b.pos })
	for i := 0; i < len(edits); {
		j := i + 1
		for j < len(edits) && edits[j].pos == edits[i].pos && edits[j].end == edits[j].pos {
			j++
		}
		slices.Reverse(edits[i:j])
		i = j
	}
	var sb strings.Builder
	last := 0
	for _, e := range edits {
		sb.WriteString(src[last:e.pos])
		sb.WriteString(e.text)
		last = e.end
	}
	sb.WriteString(src[last:])
	return sb.String()
}

// edit replaces src[pos:end] with text.
type edit struct {
	pos, end int
	text     string
}

// dictOrderEdit is the edit adding dictOrderKwarg to the call whose "(" is toks[open],
// if it has keywords and no *args or **kwargs.
func dictOrderEdit(toks []token, open int) (edit, bool) {
	closeAt := matchClose(toks, open)
	if closeAt < 0 {
		return edit{}, false
	}
	var names []string
	argStart, depth := open+1, 0
	for i := open + 1; i <= closeAt; i++ {
		switch t := toks[i]; {
		case t.kind == tokOp && (t.text == "(" || t.text == "[" || t.text == "{"):
			depth++
		case t.kind == tokOp && i < closeAt && (t.text == ")" || t.text == "]" || t.text == "}"):
			depth--
		}
		if depth > 0 || (i < closeAt && !toks[i].is(tokOp, ",")) {
			continue
		}
		// toks[argStart:i] is one argument.
		if arg := toks[argStart:i]; len(arg) > 0 {
			switch {
			case arg[0].is(tokOp, "*") || arg[0].is(tokOp, "**"):
				return edit{}, false
			case len(arg) > 1 && arg[0].kind == tokName && arg[1].is(tokOp, "="):
				names = append(names, "'"+arg[0].text+"'")
			}
		}
		argStart = i + 1
	}
	if len(names) == 0 {
		return edit{}, false
	}
	text := dictOrderKwarg + "=[" + strings.Join(names, ", ") + "]"
	if !toks[closeAt-1].is(tokOp, ",") {
		text = ", " + text
	}
	return edit{pos: toks[closeAt].pos, end: toks[closeAt].pos, text: text}, true
}

// matchClose is the index of the bracket closing toks[open], or -1.
func matchClose(toks []token, open int) int {
	depth := 0
	for i := open; i < len(toks); i++ {
		if toks[i].kind != tokOp {
			continue
		}
		switch toks[i].text {
		case "(", "[", "{":
			depth++
		case ")", "]", "}":
			if depth--; depth == 0 {
				return i
			}
		}
	}
	return -1
}

// operatorNames are the names Jinja2 reads as operators or statement words.
var operatorNames = map[string]bool{"and": true, "or": true, "not": true, "in": true, "is": true, "if": true, "else": true}

// endsOperand reports whether t can end a primary expression, so that a "(" or "["
// after it is a call or a subscript.
func endsOperand(t token) bool {
	switch t.kind {
	case tokName:
		return !operatorNames[t.text]
	case tokString, tokNumber:
		return true
	}
	return t.text == ")" || t.text == "]" || t.text == "}"
}

// chainStart is the index of the first token of the primary expression and postfix
// chain (a.b[0](x) ...) that ends with toks[j], or -1.
func chainStart(toks []token, j int) int {
	for j >= 0 {
		t := toks[j]
		switch {
		case t.kind == tokOp && (t.text == ")" || t.text == "]" || t.text == "}"):
			k := matchOpen(toks, j)
			if k > 0 && t.text != "}" && endsOperand(toks[k-1]) {
				j = k - 1 // a call or a subscript
				continue
			}
			return k
		case t.kind == tokName && !operatorNames[t.text], t.kind == tokNumber:
			if j >= 2 && toks[j-1].is(tokOp, ".") {
				j -= 2
				continue
			}
			return j
		case t.kind == tokString:
			for j > 0 && toks[j-1].kind == tokString {
				j--
			}
			return j
		default:
			return -1
		}
	}
	return -1
}

// matchOpen is the index of the bracket opening toks[closeAt], or -1.
func matchOpen(toks []token, closeAt int) int {
	depth := 0
	for i := closeAt; i >= 0; i-- {
		if toks[i].kind != tokOp {
			continue
		}
		switch toks[i].text {
		case ")", "]", "}":
			depth++
		case "(", "[", "{":
			if depth--; depth == 0 {
				return i
			}
		}
	}
	return -1
}
