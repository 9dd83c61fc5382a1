package tokenize

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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

// parseJSONValue decodes JSON text like Python's json.loads: objects keep their key
// order (a repeated key keeps its first position and its last value), integers stay
// integers. Integers beyond int64 become floats (json.loads keeps them exact; no chat
// template of ours prints such numbers).
func parseJSONValue(text []byte) (jinja.Value, error) {
	dec := json.NewDecoder(bytes.NewReader(text))
	dec.UseNumber()
	v, err := decodeValue(dec)
	if err != nil {
		return jinja.Undefined(), err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return jinja.Undefined(), fmt.Errorf("extra data after the JSON value")
	}
	return v, nil
}

func decodeValue(dec *json.Decoder) (jinja.Value, error) {
	tok, err := dec.Token()
	if err != nil {
		return jinja.Undefined(), err
	}
	switch t := tok.(type) {
	case nil:
		return jinja.None(), nil
	case bool:
		return jinja.NewBool(t), nil
	case string:
		return jinja.NewString(t), nil
	case json.Number:
		return numberValue(t), nil
	case json.Delim:
		switch t {
		case '[':
			var items []jinja.Value
			for dec.More() {
				item, err := decodeValue(dec)
				if err != nil {
					return jinja.Undefined(), err
				}
				items = append(items, item)
			}
			if _, err := dec.Token(); err != nil {
				return jinja.Undefined(), err
			}
			return jinja.NewList(items), nil
		case '{':
			d := jinja.NewDict()
			for dec.More() {
				key, err := dec.Token()
				if err != nil {
					return jinja.Undefined(), err
				}
				val, err := decodeValue(dec)
				if err != nil {
					return jinja.Undefined(), err
				}
				d.AsDict().Set(key.(string), val)
			}
			if _, err := dec.Token(); err != nil {
				return jinja.Undefined(), err
			}
			return d, nil
		}
	}
	return jinja.Undefined(), fmt.Errorf("unexpected JSON token %v", tok)
}

func numberValue(n json.Number) jinja.Value {
	s := string(n)
	if !strings.ContainsAny(s, ".eE") {
		if i, err := strconv.ParseInt(s, 10, 64); err == nil {
			return jinja.NewInt(i)
		}
	}
	f, _ := strconv.ParseFloat(s, 64) // the decoder validated the syntax; overflow gives ±Inf
	return jinja.NewFloat(f)
}

// goValue converts a value decoded by encoding/json into map[string]any form (as
// chat_template_kwargs arrive) to a template value; map keys are sorted, since their
// order is lost already.
func goValue(v any) jinja.Value {
	switch t := v.(type) {
	case nil:
		return jinja.None()
	case bool:
		return jinja.NewBool(t)
	case string:
		return jinja.NewString(t)
	case json.Number:
		return numberValue(t)
	case float64:
		if t == math.Trunc(t) && math.Abs(t) < 1<<53 {
			return jinja.NewInt(int64(t))
		}
		return jinja.NewFloat(t)
	case int:
		return jinja.NewInt(int64(t))
	case int64:
		return jinja.NewInt(t)
	case []any:
		items := make([]jinja.Value, len(t))
		for i, item := range t {
			items[i] = goValue(item)
		}
		return jinja.NewList(items)
	case map[string]any:
		d := jinja.NewDict()
		keys := make([]string, 0, len(t))
		for k := range t {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			d.AsDict().Set(k, goValue(t[k]))
		}
		return d
	case jinja.Value:
		return t
	}
	return jinja.NewString(fmt.Sprint(v))
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
