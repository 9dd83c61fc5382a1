package tokenize

import "github.com/ardanlabs/jinja"

// Python semantics of the callables templates use where ardanlabs/jinja's built-ins
// differ from Jinja2's (which are Python's, or transformers'): rewriteTemplate routes
// the template's calls here.
//
//   - tojson is transformers' (json.dumps with ensure_ascii=False, pyjson.go), not the
//     engine's.

// Names the rewritten template calls; they are render variables.
const tojsonName = "kvindex_tojson"

// pyBuiltins are the render variables that implement the rerouted calls.
func pyBuiltins() map[string]jinja.Value {
	return map[string]jinja.Value{
		tojsonName: jinja.NewCallable(tojsonName, tojsonFilter),
	}
}
