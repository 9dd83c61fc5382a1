package tokenize

import (
	"errors"
	"fmt"
	"slices"

	"github.com/ardanlabs/jinja"
)

// Python semantics of the callables templates use where ardanlabs/jinja's built-ins
// differ from Jinja2's (which are Python's, or transformers'): rewriteTemplate routes
// the template's calls here.
//
//   - tojson is transformers' (json.dumps with ensure_ascii=False, pyjson.go), not the
//     engine's.
//   - dict(k=v, ...) keeps the keywords' order, as Python does; the engine builds the
//     dict from a Go map, in random order.

// Names the rewritten template calls; they are render variables.
const (
	tojsonName = "kvindex_tojson"
	// dictOrderKwarg is the keyword rewriteTemplate adds to dict() calls: the list of
	// the call's keywords in order.
	dictOrderKwarg = "kvindex_order"
)

// pyBuiltins are the render variables that implement the rerouted calls.
func pyBuiltins() map[string]jinja.Value {
	return map[string]jinja.Value{
		tojsonName: jinja.NewCallable(tojsonName, tojsonFilter),
		"dict":     jinja.NewCallable("dict", pyDict),
	}
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
