package traces

import (
	"fmt"
	"time"
)

// Agentic is agent tool loops: 4 tool-set prompts of 2,000–3,000 tokens shared by
// every task of their kind; a task adds a 200–500-token instruction and runs 5–15
// steps, each appending a tool result (80–400 tokens) to the context and asking
// for a short action (20–80 output tokens). One step in four fans out into 2–4
// sibling calls issued at once (same context, a 10–40-token suffix each naming the
// sub-call); the next step waits for them (estimated at 8 ms per output token
// plus 0.3–1.3 s of tool time). Tasks start at Rate/12 per second.
func Agentic(o Options) Trace {
	rng := newRNG(o.Seed)
	toolsets := make([][]uint32, 4)
	for i := range toolsets {
		toolsets[i] = tokens(rng, between(rng, 2000, 3000))
	}
	var reqs []Request
	start := time.Duration(0)
	group := 0
	for task := 0; len(reqs) < o.Requests; task++ {
		start += expDuration(rng, 12/o.Rate)
		kind := rng.IntN(len(toolsets))
		session := fmt.Sprintf("task-%d", task)
		prefix := fmt.Sprintf("toolset-%d", kind)
		ctx := concat(toolsets[kind], tokens(rng, between(rng, 200, 500)))
		at := start
		for range between(rng, 5, 15) {
			ctx = concat(ctx, tokens(rng, between(rng, 80, 400)))
			longest := 0
			if rng.IntN(4) == 0 {
				group++
				for range between(rng, 2, 4) {
					out := between(rng, 20, 80)
					longest = max(longest, out)
					reqs = append(reqs, Request{Arrival: at, Session: session, Prefix: prefix, Group: group,
						Prompt: concat(ctx, tokens(rng, between(rng, 10, 40))), OutputTokens: out})
				}
			} else {
				out := between(rng, 20, 80)
				longest = out
				reqs = append(reqs, Request{Arrival: at, Session: session, Prefix: prefix, Prompt: ctx, OutputTokens: out})
			}
			ctx = concat(ctx, tokens(rng, longest))
			at += time.Duration(longest)*8*time.Millisecond + time.Duration(300+rng.IntN(1000))*time.Millisecond
		}
	}
	return finish("agentic", reqs, o.Requests)
}
