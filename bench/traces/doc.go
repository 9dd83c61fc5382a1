// Package traces generates and loads the request traces the route bench
// (bench/routebench) replays: seeded, documented generators for the traffic shapes
// KV-aware routing is judged on, and a loader for the Mooncake trace format.
//
// A Trace is a list of requests in token space (prompt token ids, output length,
// arrival time, session and shared-prefix ids), sorted by arrival. Generators are
// pure functions of their Options: the same seed gives the same trace, byte for
// byte, on every machine (math/rand/v2 PCG, no map iteration, no clock).
//
// Token ids are drawn below 256 so that every engine tokenizer the bench uses
// (the built-in byte-level one included) accepts them. The assistant replies a
// generator puts into later turns are its own invented tokens, not what the
// engine generated: a follow-up turn therefore hits the cache up to the previous
// prompt, not through the previous answer (conservative for every policy alike).
//
// Concurrency: everything here is a pure function or an immutable value once
// returned; Traces may be shared between goroutines read-only.
package traces
