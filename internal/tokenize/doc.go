// Package tokenize owns the text <-> token-id boundary of kvindex: the Tokenizer
// interface, the OpenAI chat message types a chat template renders, a registry that
// maps model names to tokenizers, and the `--tokenizer <model>=<dir>` flag syntax.
//
// Two implementations plug into the same interface:
//   - Builtin, a deterministic byte-level tokenizer with ChatML-style special tokens,
//     used by the fake engine and by tests. It is exactly reversible:
//     Decode(Encode(s, false)) == s for every string s, valid UTF-8 or not.
//   - a Hugging Face tokenizer.json + chat-template loader (a later issue). Until it
//     lands, Load reports ErrNotSupported for a directory.
//
// Token ids are uint32 everywhere (docs/contracts.md).
//
// Concurrency: Tokenizer implementations must be safe for concurrent use; Builtin
// holds no mutable state. Registry is safe for concurrent use (reads never block
// each other).
package tokenize
