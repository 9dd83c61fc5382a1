package tokenize

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/ardanlabs/jinja"
)

// Python semantics of the callables templates use where ardanlabs/jinja's built-ins
// differ from Jinja2's (which are Python's, or transformers'): rewriteTemplate routes
// the template's calls here.
//
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
	tojsonName = "kvindex_tojson"
	trimName   = "kvindex_trim"
	// dictOrderKwarg is the keyword rewriteTemplate adds to dict() calls: the list of
	// the call's keywords in order.
	dictOrderKwarg = "kvindex_order"
)

// stripNames maps the str methods rewriteTemplate reroutes to the function it calls.
var stripNames = map[string]string{"strip": "kvindex_strip", "lstrip": "kvindex_lstrip", "rstrip": "kvindex_rstrip"}

// pyBuiltins are the render variables that implement the rerouted calls.
func pyBuiltins() map[string]jinja.Value {
	vars := map[string]jinja.Value{
		tojsonName: jinja.NewCallable(tojsonName, tojsonFilter),
		trimName:   jinja.NewCallable(trimName, trimFilter),
		"dict":     jinja.NewCallable("dict", pyDict),
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

// pyStr is Python's str() of a template value: undefined is "", None "None", floats
// are printed as repr prints them (inf, nan). Lists and dicts get the engine's repr,
// which quotes strings without Python's escaping.
func pyStr(v jinja.Value) string {
	switch {
	case v.IsUndefined():
		return ""
	case v.IsString():
		return v.AsString()
	case v.IsFloat():
		f := v.AsFloat()
		switch {
		case math.IsNaN(f):
			return "nan"
		case math.IsInf(f, 1):
			return "inf"
		case math.IsInf(f, -1):
			return "-inf"
		}
		return pyFloatRepr(f)
	case v.IsInt():
		return strconv.FormatInt(v.AsInt(), 10)
	}
	return v.String() // None, True, False, lists, dicts
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
