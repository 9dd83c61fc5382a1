package traces

import "fmt"

// Unique is unique short prompts (50–300 tokens, nothing shared beyond chance, 20–
// 200 output tokens) at Poisson arrivals of Rate: the case where KV-awareness has
// nothing to gain and must not cost anything against plain load balancing.
func Unique(o Options) Trace {
	rng := newRNG(o.Seed)
	reqs := make([]Request, 0, o.Requests)
	at := expDuration(rng, 1/o.Rate)
	for i := range o.Requests {
		reqs = append(reqs, Request{Arrival: at, Session: fmt.Sprintf("u-%d", i),
			Prompt: tokens(rng, between(rng, 50, 300)), OutputTokens: between(rng, 20, 200)})
		at += expDuration(rng, 1/o.Rate)
	}
	return finish("unique", reqs, o.Requests)
}
