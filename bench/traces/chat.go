package traces

import (
	"fmt"
	"time"
)

// Chat is multi-turn chat: conversations start as a Poisson process; each has its
// own system prompt (100–400 tokens) and 3–10 turns. A turn's prompt is the whole
// history so far (system, every earlier user message and reply) plus a new user
// message (20–200 tokens); replies are 50–300 tokens. The next turn arrives after
// the reply (estimated at 8 ms per output token) plus an exponential think time of
// mean 4 s. Conversations start at Rate/6.5 per second, so the steady-state rate
// is about Rate.
func Chat(o Options) Trace {
	rng := newRNG(o.Seed)
	var reqs []Request
	start := time.Duration(0)
	for s := 0; len(reqs) < o.Requests; s++ {
		start += expDuration(rng, 6.5/o.Rate)
		session := fmt.Sprintf("chat-%d", s)
		history := tokens(rng, between(rng, 100, 400))
		at := start
		turns := between(rng, 3, 10)
		for range turns {
			prompt := concat(history, tokens(rng, between(rng, 20, 200)))
			out := between(rng, 50, 300)
			reqs = append(reqs, Request{Arrival: at, Session: session, Prompt: prompt, OutputTokens: out})
			history = concat(prompt, tokens(rng, out))
			at += time.Duration(out)*8*time.Millisecond + expDuration(rng, 4)
		}
	}
	return finish("chat", reqs, o.Requests)
}
