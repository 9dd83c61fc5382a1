package tokenize

import (
	"strings"
	"unicode/utf8"
)

// applyWhitespaceControl returns src (newlines already made "\n" by jinjaLines) with
// Jinja2's whitespace control applied as transformers configures the environment
// (trim_blocks and lstrip_blocks on, plus the "-" and "+" markers of each tag), every
// comment dropped, the markers removed, and every text between tags turned into a
// string-literal expression.
//
// Why: github.com/ardanlabs/jinja applies a block tag's whitespace control to the
// nearest text before or after it even when a {{ }} tag stands between them, and
// treats the first text of a template as its start, so "{% for %}{{ a }} {{ b }}{%
// endfor %}" rendered "ab" where Jinja2 renders "a b". With the control applied here,
// as Jinja2's lexer applies it, and no text segments left, the engine's trimming has
// nothing to touch.
//
// ok is false for a source this does not handle (a {% raw %} block): the caller keeps
// src as it is. A tag that does not lex is left to scanTags to report.
func applyWhitespaceControl(src string) (out string, ok bool) {
	type piece struct {
		text       string // text before the tag, or the tag's source
		isTag      bool
		kind       byte // '{' (expression), '%' (block) or '#' (comment)
		lead, tail byte // the tag's markers after its opening and before its end: '-', '+' or 0
	}
	var pieces []piece
	for i := 0; ; {
		open := tagOpen(src, i)
		if open < 0 {
			pieces = append(pieces, piece{text: src[i:]})
			break
		}
		pieces = append(pieces, piece{text: src[i:open]})
		kind := src[open+1]
		inner := open + 2
		var lead byte
		body := inner // where the tag's inside starts, after its marker
		if inner < len(src) && (src[inner] == '-' || src[inner] == '+') {
			lead, body = src[inner], inner+1
		}
		var end int
		switch kind {
		case '#':
			e := strings.Index(src[inner:], "#}")
			if e < 0 {
				return src, false
			}
			end = inner + e + 2
		default:
			if kind == '%' && rawBlockStart.MatchString(src[inner:]) {
				return src, false
			}
			_, next, err := lexTag(src, body, kind == '%')
			if err != nil {
				return src, false
			}
			end = next
		}
		var tail byte
		if end-3 >= body && (src[end-3] == '-' || src[end-3] == '+') {
			tail = src[end-3]
		}
		pieces = append(pieces, piece{text: src[open:end], isTag: true, kind: kind, lead: lead, tail: tail})
		i = end
	}

	// Each text is cut by the tag before it (its end's control), then by the tag
	// after it (its opening's control), as Jinja2's lexer does.
	lineStarting := true
	for k := 0; k < len(pieces); k += 2 {
		text := pieces[k].text
		if k > 0 {
			prev := pieces[k-1]
			before := len(text)
			switch {
			case prev.tail == '-':
				text = strings.TrimLeftFunc(text, pyIsSpace)
			case prev.tail != '+' && prev.kind != '{' && strings.HasPrefix(text, "\n"):
				text = text[1:] // trim_blocks
			}
			consumed := pieces[k].text[:before-len(text)]
			lineStarting = strings.HasSuffix(consumed, "\n")
		}
		if k+1 < len(pieces) {
			next := pieces[k+1]
			switch {
			case next.lead == '-':
				text = strings.TrimRightFunc(text, pyIsSpace)
			case next.lead != '+' && next.kind != '{':
				// lstrip_blocks: the white space between the start of the line and
				// the tag.
				l := strings.LastIndexByte(text, '\n') + 1
				if (l > 0 || lineStarting) && l < len(text) && strings.TrimLeftFunc(text[l:], pyIsSpace) == "" {
					text = text[:l]
				}
			}
		}
		pieces[k].text = text
	}

	var sb strings.Builder
	sb.Grow(len(src) + len(src)/8)
	for _, p := range pieces {
		switch {
		case !p.isTag:
			if p.text != "" {
				writeStringExpr(&sb, p.text)
			}
		case p.kind == '#':
			// A comment prints nothing; its whitespace control is applied.
		default:
			t := p.text
			if p.lead != 0 {
				t = t[:2] + t[3:]
			}
			if p.tail != 0 {
				t = t[:len(t)-3] + t[len(t)-2:]
			}
			sb.WriteString(t)
		}
	}
	return sb.String(), true
}

// writeStringExpr writes {{ "text" }}, text escaped as the engine's string literals
// read it.
func writeStringExpr(sb *strings.Builder, text string) {
	sb.WriteString(`{{ "`)
	for i := 0; i < len(text); {
		r, w := utf8.DecodeRuneInString(text[i:])
		switch r {
		case '\\':
			sb.WriteString(`\\`)
		case '"':
			sb.WriteString(`\"`)
		default:
			sb.WriteString(text[i : i+w])
		}
		i += w
	}
	sb.WriteString(`" }}`)
}
