// Package openai reads OpenAI-compatible generation requests (/v1/completions and
// /v1/chat/completions) the way vLLM reads them, and turns their prompts into the
// token ids vLLM feeds its KV cache: completion prompts as text (special tokens added
// unless add_special_tokens is false) or token ids used as given; chat messages
// rendered with the model's chat template and encoded without special tokens unless
// add_special_tokens is true. Chat messages with media (image, audio, video, file
// parts) decode, but have no prompt tokens here (ChatRequest.MediaPart): their prompt
// is the engine's multimodal processor's to build.
//
// The fake engine and the router both use it, so the router computes block keys from
// exactly the tokens an engine caches: a router whose tokens differ from the engine's
// scores every prefix as a miss.
//
// Integer fields (LaxInt) are read as vLLM's pydantic models read an int: integral
// numbers and base-10 integer strings too.
//
// Request types keep only the fields that decide the prompt and its routing; callers
// that forward a request keep the original body and never re-encode it from these
// types, so fields unknown here reach the engine unchanged.
//
// The package is pure: no I/O, goroutines or logging. Everything is safe for
// concurrent use.
package openai
