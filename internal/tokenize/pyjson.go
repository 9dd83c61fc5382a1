package tokenize

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/ardanlabs/jinja"
)

// Chat templates see request data as Python values and print it with Python's json
// module, so the bytes of a rendered prompt depend on Python's behaviour: dict key order
// is insertion order, ints and floats stay distinct (1 vs 1.0), and json.dumps has its
// own escaping and separators. This file converts JSON to template values the way
// json.loads would, and implements transformers' tojson filter (json.dumps with
// ensure_ascii=False by default).

// parseJSONValue decodes JSON text as Python's json.loads does: objects keep their key
// order (a repeated key keeps its first position and its last value), integers stay
// integers, and NaN, Infinity and -Infinity are read as numbers. Integers beyond int64
// become floats (json.loads keeps them exact; a template value cannot hold them), and
// an escaped unpaired surrogate becomes U+FFFD (a Python string keeps it).
func parseJSONValue(text []byte) (jinja.Value, error) {
	p := pyJSONParser{s: text}
	p.space()
	v, err := p.value(0)
	if err != nil {
		return jinja.Undefined(), err
	}
	if p.space(); p.i < len(p.s) {
		return jinja.Undefined(), fmt.Errorf("extra data at byte %d", p.i)
	}
	return v, nil
}

// maxJSONDepth bounds the nesting parseJSONValue follows, as encoding/json's does.
const maxJSONDepth = 10000

type pyJSONParser struct {
	s []byte
	i int
}

func (p *pyJSONParser) space() { p.i = skipSpace(p.s, p.i) }

func (p *pyJSONParser) errorf(format string, args ...any) error {
	return fmt.Errorf("byte %d: %s", p.i, fmt.Sprintf(format, args...))
}

// literal consumes word if the input continues with it.
func (p *pyJSONParser) literal(word string) bool {
	if bytes.HasPrefix(p.s[p.i:], []byte(word)) {
		p.i += len(word)
		return true
	}
	return false
}

// value reads one value at p.i, with json.loads' scanner's cases in its order.
func (p *pyJSONParser) value(depth int) (jinja.Value, error) {
	if depth > maxJSONDepth {
		return jinja.Undefined(), p.errorf("nested too deeply")
	}
	if p.i >= len(p.s) {
		return jinja.Undefined(), p.errorf("expecting value")
	}
	switch c := p.s[p.i]; {
	case c == '"':
		s, err := p.str()
		return jinja.NewString(s), err
	case c == '{':
		return p.object(depth)
	case c == '[':
		return p.array(depth)
	case p.literal("null"):
		return jinja.None(), nil
	case p.literal("true"):
		return jinja.NewBool(true), nil
	case p.literal("false"):
		return jinja.NewBool(false), nil
	case c == '-' || c >= '0' && c <= '9':
		if v, ok := p.number(); ok {
			return v, nil
		}
		if p.literal("-Infinity") {
			return jinja.NewFloat(math.Inf(-1)), nil
		}
	case p.literal("NaN"):
		return jinja.NewFloat(math.NaN()), nil
	case p.literal("Infinity"):
		return jinja.NewFloat(math.Inf(1)), nil
	}
	return jinja.Undefined(), p.errorf("expecting value")
}

// number reads -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][-+]?[0-9]+)?: an int without a
// fraction or an exponent, else a float (beyond the float range, ±Inf as in Python).
func (p *pyJSONParser) number() (jinja.Value, bool) {
	digits := func(j int) int {
		for j < len(p.s) && p.s[j] >= '0' && p.s[j] <= '9' {
			j++
		}
		return j
	}
	j := p.i
	if p.s[j] == '-' {
		j++
	}
	switch {
	case j < len(p.s) && p.s[j] == '0':
		j++
	case j < len(p.s) && p.s[j] >= '1' && p.s[j] <= '9':
		j = digits(j)
	default:
		return jinja.Undefined(), false
	}
	isFloat := false
	if j+1 < len(p.s) && p.s[j] == '.' && p.s[j+1] >= '0' && p.s[j+1] <= '9' {
		j, isFloat = digits(j+1), true
	}
	if j < len(p.s) && (p.s[j] == 'e' || p.s[j] == 'E') {
		k := j + 1
		if k < len(p.s) && (p.s[k] == '+' || p.s[k] == '-') {
			k++
		}
		if k < len(p.s) && p.s[k] >= '0' && p.s[k] <= '9' {
			j, isFloat = digits(k), true
		}
	}
	text := string(p.s[p.i:j])
	p.i = j
	if !isFloat {
		if n, err := strconv.ParseInt(text, 10, 64); err == nil {
			return jinja.NewInt(n), true
		}
	}
	f, _ := strconv.ParseFloat(text, 64) // valid syntax; out of range gives ±Inf
	return jinja.NewFloat(f), true
}

// str reads a string literal; control characters must be escaped, as json.loads
// (strict) requires.
func (p *pyJSONParser) str() (string, error) {
	start := p.i
	escaped := false
	for j := start + 1; j < len(p.s); j++ {
		switch c := p.s[j]; {
		case c == '\\':
			escaped = true
			j++
		case c < 0x20:
			p.i = j
			return "", p.errorf("invalid control character in a string")
		case c == '"':
			p.i = j + 1
			lit := p.s[start:p.i]
			if !escaped && utf8.Valid(lit) {
				return string(lit[1 : len(lit)-1]), nil
			}
			var s string
			if err := json.Unmarshal(lit, &s); err != nil {
				return "", fmt.Errorf("byte %d: %w", start, err)
			}
			return s, nil
		}
	}
	return "", p.errorf("unterminated string")
}

func (p *pyJSONParser) object(depth int) (jinja.Value, error) {
	d := jinja.NewDict()
	p.i++
	p.space()
	if p.literal("}") {
		return d, nil
	}
	for {
		if p.i >= len(p.s) || p.s[p.i] != '"' {
			return jinja.Undefined(), p.errorf("expecting a property name in double quotes")
		}
		key, err := p.str()
		if err != nil {
			return jinja.Undefined(), err
		}
		if p.space(); !p.literal(":") {
			return jinja.Undefined(), p.errorf("expecting ':'")
		}
		p.space()
		val, err := p.value(depth + 1)
		if err != nil {
			return jinja.Undefined(), err
		}
		d.AsDict().Set(key, val)
		p.space()
		switch {
		case p.literal("}"):
			return d, nil
		case !p.literal(","):
			return jinja.Undefined(), p.errorf("expecting ',' or '}'")
		}
		p.space()
	}
}

func (p *pyJSONParser) array(depth int) (jinja.Value, error) {
	var items []jinja.Value
	p.i++
	p.space()
	if p.literal("]") {
		return jinja.NewList(items), nil
	}
	for {
		item, err := p.value(depth + 1)
		if err != nil {
			return jinja.Undefined(), err
		}
		items = append(items, item)
		p.space()
		switch {
		case p.literal("]"):
			return jinja.NewList(items), nil
		case !p.literal(","):
			return jinja.Undefined(), p.errorf("expecting ',' or ']'")
		}
		p.space()
	}
}

// pyDumpOptions are json.dumps' arguments as transformers' tojson passes them.
type pyDumpOptions struct {
	ensureASCII   bool
	indent        *string // nil: no newlines
	itemSeparator string
	keySeparator  string
	sortKeys      bool
}

// tojsonFilter is transformers' tojson(x, ensure_ascii=False, indent=None,
// separators=None, sort_keys=False), called as a Jinja filter: args[0] is x and the
// other parameters come positionally or by name.
func tojsonFilter(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
	if len(args) == 0 {
		return jinja.Undefined(), errors.New("tojson: no value")
	}
	params := []string{"ensure_ascii", "indent", "separators", "sort_keys"}
	if len(args)-1 > len(params) {
		return jinja.Undefined(), fmt.Errorf("tojson: %d positional arguments, want at most %d", len(args)-1, len(params))
	}
	given := map[string]jinja.Value{}
	for i, a := range args[1:] {
		given[params[i]] = a
	}
	for k, v := range kwargs {
		if !slices.Contains(params, k) {
			return jinja.Undefined(), fmt.Errorf("tojson: unexpected keyword argument %q", k)
		}
		given[k] = v
	}
	opts := pyDumpOptions{itemSeparator: ", ", keySeparator: ": "}
	if v, ok := given["ensure_ascii"]; ok {
		opts.ensureASCII = v.IsTruthy()
	}
	if v, ok := given["indent"]; ok && !v.IsNone() && !v.IsUndefined() {
		var ind string
		switch {
		case v.IsString():
			ind = v.AsString()
		case v.IsInt():
			ind = strings.Repeat(" ", int(max(0, min(v.AsInt(), 64))))
		case v.IsBool() && v.AsBool():
			ind = " "
		case v.IsBool():
		default:
			return jinja.Undefined(), fmt.Errorf("tojson: indent must be an int or a string")
		}
		opts.indent = &ind
		opts.itemSeparator = ","
	}
	if v, ok := given["separators"]; ok && !v.IsNone() && !v.IsUndefined() {
		if !v.IsList() || v.AsList().Len() != 2 || !v.AsList().Items[0].IsString() || !v.AsList().Items[1].IsString() {
			return jinja.Undefined(), fmt.Errorf("tojson: separators must be two strings")
		}
		opts.itemSeparator = v.AsList().Items[0].AsString()
		opts.keySeparator = v.AsList().Items[1].AsString()
	}
	if v, ok := given["sort_keys"]; ok {
		opts.sortKeys = v.IsTruthy()
	}
	out, err := appendPyJSON(nil, args[0], &opts, 0)
	if err != nil {
		return jinja.Undefined(), err
	}
	return jinja.NewString(string(out)), nil
}

func appendPyJSON(b []byte, v jinja.Value, o *pyDumpOptions, level int) ([]byte, error) {
	switch {
	case v.IsNone():
		return append(b, "null"...), nil
	case v.IsBool():
		if v.AsBool() {
			return append(b, "true"...), nil
		}
		return append(b, "false"...), nil
	case v.IsInt():
		return strconv.AppendInt(b, v.AsInt(), 10), nil
	case v.IsFloat():
		return append(b, pyFloatRepr(v.AsFloat())...), nil
	case v.IsString():
		return appendPyJSONString(b, v.AsString(), o.ensureASCII), nil
	case v.IsList():
		items := v.AsList().Items
		if len(items) == 0 {
			return append(b, "[]"...), nil
		}
		b = append(b, '[')
		for i, item := range items {
			if i > 0 {
				b = append(b, o.itemSeparator...)
			}
			b = appendNewlineIndent(b, o, level+1)
			var err error
			if b, err = appendPyJSON(b, item, o, level+1); err != nil {
				return nil, err
			}
		}
		b = appendNewlineIndent(b, o, level)
		return append(b, ']'), nil
	case v.IsDict():
		d := v.AsDict()
		if d.Len() == 0 {
			return append(b, "{}"...), nil
		}
		keys := d.Keys
		if o.sortKeys {
			keys = slices.Sorted(slices.Values(d.Keys))
		}
		b = append(b, '{')
		for i, k := range keys {
			if i > 0 {
				b = append(b, o.itemSeparator...)
			}
			b = appendNewlineIndent(b, o, level+1)
			b = appendPyJSONString(b, k, o.ensureASCII)
			b = append(b, o.keySeparator...)
			val, _ := d.Get(k)
			var err error
			if b, err = appendPyJSON(b, val, o, level+1); err != nil {
				return nil, err
			}
		}
		b = appendNewlineIndent(b, o, level)
		return append(b, '}'), nil
	}
	return nil, fmt.Errorf("tojson: object of kind %s is not JSON serializable", v.String())
}

func appendNewlineIndent(b []byte, o *pyDumpOptions, level int) []byte {
	if o.indent == nil {
		return b
	}
	b = append(b, '\n')
	for range level {
		b = append(b, *o.indent...)
	}
	return b
}

// appendPyJSONString quotes s as json.dumps does. Invalid UTF-8 (which a Python string
// cannot hold) is written as U+FFFD.
func appendPyJSONString(b []byte, s string, ensureASCII bool) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); {
		r, w := utf8.DecodeRuneInString(s[i:])
		i += w
		switch {
		case r == '"':
			b = append(b, '\\', '"')
		case r == '\\':
			b = append(b, '\\', '\\')
		case r == '\n':
			b = append(b, '\\', 'n')
		case r == '\r':
			b = append(b, '\\', 'r')
		case r == '\t':
			b = append(b, '\\', 't')
		case r == '\b':
			b = append(b, '\\', 'b')
		case r == '\f':
			b = append(b, '\\', 'f')
		case r < 0x20 || (ensureASCII && r > '~'):
			if r > 0xffff {
				hi, lo := utf16Surrogates(r)
				b = append(b, '\\', 'u', hex[hi>>12], hex[hi>>8&15], hex[hi>>4&15], hex[hi&15])
				r = lo
			}
			b = append(b, '\\', 'u', hex[r>>12], hex[r>>8&15], hex[r>>4&15], hex[r&15])
		default:
			b = utf8.AppendRune(b, r)
		}
	}
	return append(b, '"')
}

func utf16Surrogates(r rune) (hi, lo rune) {
	r -= 0x10000
	return 0xd800 + (r>>10)&0x3ff, 0xdc00 + r&0x3ff
}

// pyFloatRepr formats f as Python's repr does: the shortest digits that round-trip,
// positional notation with at least one fractional digit for exponents -5 < e < 16,
// scientific notation with a two-digit exponent otherwise.
func pyFloatRepr(f float64) string {
	switch {
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	}
	sci := strconv.FormatFloat(f, 'e', -1, 64) // [-]d[.ddd]e±XX
	mant, expText, _ := strings.Cut(sci, "e")
	exp, _ := strconv.Atoi(expText)
	sign := ""
	if strings.HasPrefix(mant, "-") {
		sign, mant = "-", mant[1:]
	}
	digits := strings.Replace(mant, ".", "", 1)
	if exp < -4 || exp >= 16 {
		m := digits[:1]
		if len(digits) > 1 {
			m += "." + digits[1:]
		}
		e := strconv.Itoa(abs(exp))
		if len(e) < 2 {
			e = "0" + e
		}
		if exp < 0 {
			return sign + m + "e-" + e
		}
		return sign + m + "e+" + e
	}
	if exp < 0 {
		return sign + "0." + strings.Repeat("0", -exp-1) + digits
	}
	if len(digits) <= exp+1 {
		return sign + digits + strings.Repeat("0", exp+1-len(digits)) + ".0"
	}
	return sign + digits[:exp+1] + "." + digits[exp+1:]
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}
