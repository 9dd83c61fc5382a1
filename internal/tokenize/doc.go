// Package tokenize owns the text <-> token-id boundary of kvindex: prompts must become
// exactly the token ids the engine computes, or block keys never match the engine's.
//
// It provides the Tokenizer interface, the OpenAI chat message types, a Registry that
// maps model names to tokenizers with the `--tokenizer <model>=<dir>` flag syntax, and
// two implementations:
//
//   - HFTokenizer: a Hugging Face tokenizer.json (byte-level BPE: Qwen2/2.5/3, Llama 3.x,
//     DeepSeek-V3 and alike) with the chat template of tokenizer_config.json. Encode
//     gives the ids Hugging Face's tokenizers library gives (golden tests against its
//     output on the real Qwen3 and Llama 3 files); ApplyChatTemplate renders a chat
//     request as vLLM does (its message pre-processing, with content in the
//     template's ContentFormat, detected from the template's source as vLLM does or
//     set by Options; then transformers' apply_chat_template semantics through
//     github.com/ardanlabs/jinja, with the built-ins whose Python semantics it lacks
//     -- printing, tojson, trim, str.strip, dict() -- replaced by ours; golden tests
//     against Jinja2). As in vLLM, chat prompts are encoded with addSpecialTokens false
//     and /v1/completions prompts with true. Files using anything else (another
//     model type, normalizer, pre-tokenizer, decoder) are refused with ErrNotSupported
//     rather than encoded differently.
//   - Builtin: a deterministic byte-level tokenizer with ChatML special tokens, for the
//     fake engine, tests and the demo. Decode(Encode(s, false)) == s for any s.
//
// github.com/ardanlabs/jinja v1.8.0 applies a block tag's whitespace control to the
// nearest text even across a {{ }} tag ("{% for %}{{ a }} {{ b }}{% endfor %}"
// rendered "ab", not Jinja2's "a b"), so the whitespace control is applied before the
// engine sees the template, as Jinja2's lexer applies it (whitespace.go), and the
// engine is handed the text as string literals it does not trim. A template with a
// {% raw %} block is left to the engine as it is.
//
// Cache memoizes token ids per text segment (the text between added tokens, e.g. one
// chat message) and whole-prompt block keys, in a byte budget (ristretto), with
// Prometheus hit/miss counters.
//
// It never fetches files, starts goroutines (except ristretto's, owned by a Cache) or
// logs. Token ids are uint32 everywhere (docs/contracts.md).
//
// Concurrency: Tokenizer implementations and Cache are safe for concurrent use;
// HFTokenizer's tables are immutable after load and its word cache is sharded behind
// locks. Registry is safe for concurrent use (reads never block each other).
package tokenize
