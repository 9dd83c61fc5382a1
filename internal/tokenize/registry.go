package tokenize

import (
	"fmt"
	"slices"
	"strings"
	"sync"
)

// Registry maps model names to tokenizers. It is safe for concurrent use.
type Registry struct {
	mu      sync.RWMutex
	byModel map[string]Tokenizer
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	return &Registry{byModel: map[string]Tokenizer{}}
}

// Register sets the tokenizer of model, replacing any earlier one.
func (r *Registry) Register(model string, t Tokenizer) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.byModel[model] = t
}

// Lookup returns the tokenizer of model, or an error wrapping ErrUnknownModel.
func (r *Registry) Lookup(model string) (Tokenizer, error) {
	r.mu.RLock()
	t, ok := r.byModel[model]
	r.mu.RUnlock()
	if !ok {
		return nil, fmt.Errorf("%w %q", ErrUnknownModel, model)
	}
	return t, nil
}

// Models returns the registered model names, sorted.
func (r *Registry) Models() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	names := make([]string, 0, len(r.byModel))
	for m := range r.byModel {
		names = append(names, m)
	}
	slices.Sort(names)
	return names
}

// Spec is one `--tokenizer <model>=<dir>` value: the tokenizer of Model is read from
// the Hugging Face files (tokenizer.json, tokenizer_config.json) in Dir.
type Spec struct {
	Model string
	Dir   string
}

// String returns the flag form, model=dir.
func (s Spec) String() string { return s.Model + "=" + s.Dir }

// ParseSpec parses "<model>=<dir>", split at the last '=' (a directory may
// hold one). A model name holding '=' is refused: it is almost always two
// specs joined with ',' ("a=/x,b=/y"), which would otherwise load /y for a
// model named "a=/x,b".
func ParseSpec(s string) (Spec, error) {
	i := strings.LastIndexByte(s, '=')
	if i <= 0 || i == len(s)-1 {
		return Spec{}, fmt.Errorf("%w %q: want <model>=<dir>", ErrBadSpec, s)
	}
	if strings.IndexByte(s[:i], '=') >= 0 {
		return Spec{}, fmt.Errorf("%w %q: a model name holds no '=' (separate several <model>=<dir> with ';')", ErrBadSpec, s)
	}
	return Spec{Model: s[:i], Dir: s[i+1:]}, nil
}

// Specs is a repeatable flag.Value collecting --tokenizer values.
type Specs []Spec

// String joins the specs with ';', as Set takes them.
func (s *Specs) String() string {
	parts := make([]string, len(*s))
	for i, spec := range *s {
		parts[i] = spec.String()
	}
	return strings.Join(parts, ";")
}

// Set parses and appends the specs of v: one, or several separated by ';'
// (an environment variable is set once, so ';' is how it names more than
// one, as for --worker).
func (s *Specs) Set(v string) error {
	var specs []Spec
	for _, item := range strings.Split(v, ";") {
		if strings.TrimSpace(item) == "" {
			continue
		}
		spec, err := ParseSpec(item)
		if err != nil {
			return err
		}
		specs = append(specs, spec)
	}
	if len(specs) == 0 {
		return fmt.Errorf("%w %q: want <model>=<dir>", ErrBadSpec, v)
	}
	*s = append(*s, specs...)
	return nil
}

// Load builds the Hugging Face tokenizer of a spec from the files in spec.Dir (see
// LoadDir).
func Load(spec Spec, opts Options) (*HFTokenizer, error) {
	return LoadDir(spec.Model, spec.Dir, opts)
}

// LoadAll loads every spec and registers it under its model name.
func (r *Registry) LoadAll(specs Specs, opts Options) error {
	for _, spec := range specs {
		t, err := Load(spec, opts)
		if err != nil {
			return fmt.Errorf("--tokenizer=%s: %w", spec, err)
		}
		r.Register(spec.Model, t)
	}
	return nil
}
