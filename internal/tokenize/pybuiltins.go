package tokenize

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/ardanlabs/jinja"
)

// Python semantics of the callables templates use where ardanlabs/jinja's built-ins
// differ from Jinja2's (which are Python's, or transformers'): rewriteTemplate routes
// the template's calls here.
//
//   - {{ x }} prints str(x): None as "None", a float as repr prints it (1.0, not 1),
//     lists and dicts as their repr (strings quoted and escaped as Python does).
//     So does the string filter. Other conversions to text inside the engine (the ~
//     operator, the join filter) still print its way.
//   - tojson is transformers' (json.dumps with ensure_ascii=False, pyjson.go), not the
//     engine's.
//   - str.strip, str.lstrip and str.rstrip without characters strip what Python's
//     str.isspace calls white space; the engine's strip leaves \x1c-\x1f, and its
//     lstrip and rstrip strip only " \t\n\r". Jinja2's trim filter is str.strip of the
//     value's str().
//   - dict(k=v, ...) keeps the keywords' order, as Python does; the engine builds the
//     dict from a Go map, in random order.

// Names the rewritten template calls; they are render variables.
const (
	strName = "kvindex_str"
	// dictOrderKwarg is the keyword rewriteTemplate adds to dict() calls: the list of
	// the call's keywords in order.
	dictOrderKwarg = "kvindex_order"
)

// filterNames maps the filters rewriteTemplate reroutes to the filter it calls.
var filterNames = map[string]string{"tojson": "kvindex_tojson", "trim": "kvindex_trim", "string": "kvindex_string"}

// stripNames maps the str methods rewriteTemplate reroutes to the function it calls.
var stripNames = map[string]string{"strip": "kvindex_strip", "lstrip": "kvindex_lstrip", "rstrip": "kvindex_rstrip"}

// pyBuiltins are the render variables that implement the rerouted calls.
func pyBuiltins() map[string]jinja.Value {
	filters := map[string]func([]jinja.Value, map[string]jinja.Value) (jinja.Value, error){
		"tojson": tojsonFilter, "trim": trimFilter, "string": stringFilter,
	}
	vars := map[string]jinja.Value{
		strName: jinja.NewCallable(strName, printed),
		"dict":  jinja.NewCallable("dict", pyDict),
	}
	for filter, name := range filterNames {
		vars[name] = jinja.NewCallable(name, filters[filter])
	}
	for method, name := range stripNames {
		vars[name] = jinja.NewCallable(name, stripMethod(method))
	}
	return vars
}

// stripMethod is str.<method>(chars=None) called as f(s, chars).
func stripMethod(method string) func([]jinja.Value, map[string]jinja.Value) (jinja.Value, error) {
	return func(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
		if len(args) == 0 || !args[0].IsString() {
			return jinja.Undefined(), fmt.Errorf("%s: object has no attribute %s", method, method)
		}
		if len(kwargs) > 0 || len(args) > 2 {
			return jinja.Undefined(), fmt.Errorf("%s() takes at most 1 positional argument", method)
		}
		chars := jinja.None()
		if len(args) == 2 {
			chars = args[1]
		}
		s, err := pyStrip(method, args[0].AsString(), chars)
		if err != nil {
			return jinja.Undefined(), err
		}
		return jinja.NewString(s), nil
	}
}

// pyStrip is Python's s.strip(chars), s.lstrip(chars) or s.rstrip(chars): chars None
// strips white space, a string strips any of its characters.
func pyStrip(method, s string, chars jinja.Value) (string, error) {
	cut := pyIsSpace
	switch {
	case chars.IsString():
		set := chars.AsString()
		cut = func(r rune) bool { return strings.ContainsRune(set, r) }
	case !chars.IsNone():
		return "", fmt.Errorf("%s arg must be None or str", method)
	}
	switch method {
	case "lstrip":
		return strings.TrimLeftFunc(s, cut), nil
	case "rstrip":
		return strings.TrimRightFunc(s, cut), nil
	}
	return strings.TrimFunc(s, cut), nil
}

// trimFilter is Jinja2's trim(value, chars=None): str(value).strip(chars).
func trimFilter(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
	if len(args) == 0 {
		return jinja.Undefined(), errors.New("trim: no value")
	}
	chars := jinja.None()
	switch {
	case len(args) == 2 && len(kwargs) == 0:
		chars = args[1]
	case len(args) == 1 && len(kwargs) == 1:
		var ok bool
		if chars, ok = kwargs["chars"]; !ok {
			return jinja.Undefined(), errors.New("trim: unexpected keyword argument")
		}
	case len(args) != 1 || len(kwargs) != 0:
		return jinja.Undefined(), errors.New("trim: too many arguments")
	}
	s, err := pyStrip("strip", pyStr(args[0]), chars)
	if err != nil {
		return jinja.Undefined(), err
	}
	return jinja.NewString(s), nil
}

// printed is what {{ x }} prints, str(x); {{ a, b }} prints the tuple.
func printed(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
	if len(args) == 1 {
		if args[0].IsString() {
			return args[0], nil
		}
		return jinja.NewString(pyStr(args[0])), nil
	}
	b := []byte{'('}
	for i, a := range args {
		if i > 0 {
			b = append(b, ", "...)
		}
		b = appendPyRepr(b, a)
	}
	return jinja.NewString(string(append(b, ')'))), nil
}

// stringFilter is Jinja2's string filter: str(value).
func stringFilter(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
	if len(args) != 1 || len(kwargs) != 0 {
		return jinja.Undefined(), errors.New("string: takes no arguments")
	}
	return printed(args, nil)
}

// pyStr is Python's str() of a template value (undefined prints as "").
func pyStr(v jinja.Value) string {
	switch {
	case v.IsUndefined():
		return ""
	case v.IsString():
		return v.AsString()
	}
	return string(appendPyRepr(nil, v))
}

// appendPyRepr appends Python's repr() of a template value; a callable, which no JSON
// or template literal makes, is written as the engine names it.
func appendPyRepr(b []byte, v jinja.Value) []byte {
	switch {
	case v.IsNone():
		return append(b, "None"...)
	case v.IsUndefined():
		return append(b, "Undefined"...)
	case v.IsBool():
		if v.AsBool() {
			return append(b, "True"...)
		}
		return append(b, "False"...)
	case v.IsInt():
		return strconv.AppendInt(b, v.AsInt(), 10)
	case v.IsFloat():
		switch f := v.AsFloat(); {
		case math.IsNaN(f):
			return append(b, "nan"...)
		case math.IsInf(f, 1):
			return append(b, "inf"...)
		case math.IsInf(f, -1):
			return append(b, "-inf"...)
		default:
			return append(b, pyFloatRepr(f)...)
		}
	case v.IsString():
		return appendPyStringRepr(b, v.AsString())
	case v.IsList():
		b = append(b, '[')
		for i, item := range v.AsList().Items {
			if i > 0 {
				b = append(b, ", "...)
			}
			b = appendPyRepr(b, item)
		}
		return append(b, ']')
	case v.IsDict():
		b = append(b, '{')
		for i, k := range v.AsDict().Keys {
			if i > 0 {
				b = append(b, ", "...)
			}
			b = appendPyStringRepr(b, k)
			b = append(b, ": "...)
			val, _ := v.AsDict().Get(k)
			b = appendPyRepr(b, val)
		}
		return append(b, '}')
	}
	return append(b, v.String()...)
}

// appendPyStringRepr appends Python's repr() of a string: single quotes unless the
// string holds a single quote and no double quote; backslash, the quote, \t, \n and
// \r escaped, other characters that are not printable as \xNN, \uNNNN or \UNNNNNNNN.
func appendPyStringRepr(b []byte, s string) []byte {
	quote := byte('\'')
	if strings.IndexByte(s, '\'') >= 0 && strings.IndexByte(s, '"') < 0 {
		quote = '"'
	}
	b = append(b, quote)
	for _, r := range s {
		switch {
		case r == rune(quote) || r == '\\':
			b = append(b, '\\', byte(r))
		case r == '\t':
			b = append(b, '\\', 't')
		case r == '\n':
			b = append(b, '\\', 'n')
		case r == '\r':
			b = append(b, '\\', 'r')
		case r < ' ' || r == 0x7f || (r >= utf8.RuneSelf && !unicode.IsPrint(r)):
			switch {
			case r <= 0xff:
				b = fmt.Appendf(b, "\\x%02x", r)
			case r <= 0xffff:
				b = fmt.Appendf(b, "\\u%04x", r)
			default:
				b = fmt.Appendf(b, "\\U%08x", r)
			}
		default:
			b = utf8.AppendRune(b, r)
		}
	}
	return append(b, quote)
}

// pyDict is Python's dict(mapping_or_pairs, **kwargs): the items of the positional
// argument (a dict, or a list of [key, value] pairs) in order, then the keywords in
// the order dictOrderKwarg gives (rewriteTemplate adds it to every dict() call it can
// read; keywords it does not list come after, sorted).
func pyDict(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
	if len(args) > 1 {
		return jinja.Undefined(), fmt.Errorf("dict expected at most 1 argument, got %d", len(args))
	}
	out := jinja.NewDict()
	d := out.AsDict()
	if len(args) == 1 {
		switch from := args[0]; {
		case from.IsDict():
			for _, k := range from.AsDict().Keys {
				v, _ := from.AsDict().Get(k)
				d.Set(k, v)
			}
		case from.IsList():
			for i, pair := range from.AsList().Items {
				if !pair.IsList() || pair.AsList().Len() != 2 || !pair.AsList().Items[0].IsString() {
					return jinja.Undefined(), fmt.Errorf("dict: element #%d is not a [string key, value] pair", i)
				}
				d.Set(pair.AsList().Items[0].AsString(), pair.AsList().Items[1])
			}
		default:
			return jinja.Undefined(), errors.New("dict: the argument is neither a mapping nor a list of pairs")
		}
	}
	var order []string
	if o, ok := kwargs[dictOrderKwarg]; ok && o.IsList() {
		for _, k := range o.AsList().Items {
			if k.IsString() {
				order = append(order, k.AsString())
			}
		}
	}
	rest := make([]string, 0, len(kwargs))
	for k := range kwargs {
		if k != dictOrderKwarg && !slices.Contains(order, k) {
			rest = append(rest, k)
		}
	}
	slices.Sort(rest)
	for _, k := range append(order, rest...) {
		if v, ok := kwargs[k]; ok {
			d.Set(k, v)
		}
	}
	return out, nil
}
