package traces

import "fmt"

// Burst is best-of-N sampling: bursts of 4–8 identical prompts (500–2,000 unique
// tokens each burst, 100–300 output tokens) issued at the same instant, bursts
// arriving as a Poisson process at Rate/6 per second. The prompts of a burst share
// every block; only co-locating the siblings turns that into cache hits.
func Burst(o Options) Trace {
	rng := newRNG(o.Seed)
	var reqs []Request
	at := expDuration(rng, 6/o.Rate)
	for b := 1; len(reqs) < o.Requests; b++ {
		prompt := tokens(rng, between(rng, 500, 2000))
		out := between(rng, 100, 300)
		for range between(rng, 4, 8) {
			reqs = append(reqs, Request{Arrival: at, Session: fmt.Sprintf("burst-%d", b), Group: b,
				Prompt: prompt, OutputTokens: out})
		}
		at += expDuration(rng, 6/o.Rate)
	}
	return finish("burst", reqs, o.Requests)
}
