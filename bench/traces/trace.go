package traces

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"time"
)

// Request is one request of a trace.
type Request struct {
	// ID is the request's position in the trace (0-based, arrival order).
	ID int
	// Arrival is the time since the trace's start.
	Arrival time.Duration
	// Session names the conversation (or agent task) the request belongs to: the
	// key session affinity routes on (sent as X-Session-ID). Never empty.
	Session string
	// Prefix names the shared prefix (system prompt, document, tool set) when the
	// request has one the client could name (sent as X-Cache-Key for prefix-hash);
	// empty otherwise.
	Prefix string
	// Group is non-zero for requests issued together (a best-of-N burst, the sibling
	// calls of an agent's fan-out): equal Group, equal arrival.
	Group int
	// Prompt is the prompt's token ids.
	Prompt []uint32
	// OutputTokens is the number of tokens to generate (max_tokens).
	OutputTokens int
}

// Trace is a named list of requests sorted by arrival.
type Trace struct {
	Name     string
	Requests []Request
}

// Options parameterise every generator.
type Options struct {
	// Seed makes the trace reproducible.
	Seed uint64
	// Requests is the number of requests to generate (about: a session or burst in
	// progress is cut at the limit).
	Requests int
	// Rate is the target mean arrival rate in requests per second (> 0).
	Rate float64
}

// DefaultOptions returns 1000 requests at 20 requests/s, seed 1.
func DefaultOptions() Options { return Options{Seed: 1, Requests: 1000, Rate: 20} }

// ErrInvalid is wrapped by every bad option or trace name.
var ErrInvalid = errors.New("traces: invalid")

// Validate checks o.
func (o Options) Validate() error {
	if o.Requests <= 0 {
		return fmt.Errorf("%w: requests %d must be > 0", ErrInvalid, o.Requests)
	}
	if !(o.Rate > 0) || math.IsInf(o.Rate, 0) {
		return fmt.Errorf("%w: rate %v must be a positive number", ErrInvalid, o.Rate)
	}
	return nil
}

// Generator builds a trace from options.
type Generator func(Options) Trace

// generators are the built-in traces by name.
var generators = map[string]Generator{
	"chat":          Chat,
	"shared-system": SharedSystem,
	"document":      Document,
	"agentic":       Agentic,
	"burst":         Burst,
	"unique":        Unique,
}

// Names lists the built-in generators, sorted.
func Names() []string {
	names := make([]string, 0, len(generators))
	for n := range generators {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Open returns the trace spec names: a generator name, or mooncake:FILE (the
// file's timestamps, or Poisson arrivals when poisson is set, at o.Rate, cut to
// o.Requests).
func Open(spec string, o Options, poisson bool) (Trace, error) {
	if err := o.Validate(); err != nil {
		return Trace{}, err
	}
	if file, ok := strings.CutPrefix(spec, "mooncake:"); ok {
		t, err := LoadMooncakeFile(file, MooncakeOptions{SpeedUp: 1})
		if err != nil {
			return Trace{}, err
		}
		if len(t.Requests) > o.Requests {
			t.Requests = t.Requests[:o.Requests]
		}
		if poisson {
			rng := newRNG(o.Seed)
			at := time.Duration(0)
			for i := range t.Requests {
				t.Requests[i].Arrival = at
				at += expDuration(rng, 1/o.Rate)
			}
		}
		return t, nil
	}
	g, ok := generators[spec]
	if !ok {
		return Trace{}, fmt.Errorf("%w: unknown trace %q (built-in: %s, or mooncake:FILE)", ErrInvalid, spec, strings.Join(Names(), ", "))
	}
	return g(o), nil
}

// newRNG is the generators' seeded source.
func newRNG(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, 0x6b76696e646578)) }

// tokens draws n token ids below 256.
func tokens(rng *rand.Rand, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(rng.IntN(256))
	}
	return out
}

// between draws uniformly in [lo, hi].
func between(rng *rand.Rand, lo, hi int) int { return lo + rng.IntN(hi-lo+1) }

// expDuration draws an exponential duration of mean seconds.
func expDuration(rng *rand.Rand, mean float64) time.Duration {
	return time.Duration(rng.ExpFloat64() * mean * float64(time.Second))
}

// zipf draws an index in [0, n) with probability ∝ 1/(i+1)^s.
func zipf(rng *rand.Rand, n int, s float64) int {
	total := 0.0
	for i := range n {
		total += math.Pow(float64(i+1), -s)
	}
	x := rng.Float64() * total
	for i := range n {
		x -= math.Pow(float64(i+1), -s)
		if x < 0 {
			return i
		}
	}
	return n - 1
}

// concat returns a fresh slice holding the parts in order.
func concat(parts ...[]uint32) []uint32 {
	n := 0
	for _, p := range parts {
		n += len(p)
	}
	out := make([]uint32, 0, n)
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// finish sorts requests by arrival (stable: equal arrivals keep generation
// order), cuts them to n and numbers them.
func finish(name string, reqs []Request, n int) Trace {
	slices.SortStableFunc(reqs, func(a, b Request) int {
		switch {
		case a.Arrival < b.Arrival:
			return -1
		case a.Arrival > b.Arrival:
			return 1
		}
		return 0
	})
	if len(reqs) > n {
		reqs = reqs[:n]
	}
	for i := range reqs {
		reqs[i].ID = i
	}
	return Trace{Name: name, Requests: reqs}
}
