package traces

import (
	"fmt"
	"time"
)

// Document is chat-with-document (seeds/002's scenario: long documents reused by
// many users): 40 documents of 3,000–8,000 tokens with Zipf popularity (s = 1.0);
// a user opens one behind a short fixed instruction (60 tokens), asks 1–3
// questions (30–150 tokens each, answers 100–300 tokens) with 2–8 s between them.
// Users arrive as a Poisson process at Rate/2 per second, so the rate is about Rate.
func Document(o Options) Trace {
	rng := newRNG(o.Seed)
	const nDocs = 40
	instruction := tokens(rng, 60)
	docs := make([][]uint32, nDocs)
	for i := range docs {
		docs[i] = tokens(rng, between(rng, 3000, 8000))
	}
	var reqs []Request
	start := time.Duration(0)
	for u := 0; len(reqs) < o.Requests; u++ {
		start += expDuration(rng, 2/o.Rate)
		doc := zipf(rng, nDocs, 1.0)
		history := concat(instruction, docs[doc])
		at := start
		for range between(rng, 1, 3) {
			prompt := concat(history, tokens(rng, between(rng, 30, 150)))
			out := between(rng, 100, 300)
			reqs = append(reqs, Request{Arrival: at, Session: fmt.Sprintf("reader-%d", u), Prefix: fmt.Sprintf("doc-%d", doc),
				Prompt: prompt, OutputTokens: out})
			history = concat(prompt, tokens(rng, out))
			at += time.Duration(2000+rng.IntN(6000)) * time.Millisecond
		}
	}
	return finish("document", reqs, o.Requests)
}
