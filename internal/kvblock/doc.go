// Package kvblock turns token IDs into the block keys kvindex indexes on.
//
// It owns three things:
//
//   - Local hashes: one per full block of blockSize tokens, the XXH3-64 of
//     the block's tokens as little-endian uint32s, seeded with LocalSeed.
//     Without a LoRA adapter the seed is 1337, so the keys equal Dynamo's
//     LocalBlockHash (lib/kv-router/src/protocols.rs, compute_block_hash_for_seq).
//     A partial last block has no key.
//   - Chain hashes: seq[0] = local[0], seq[i] = XXH3-64(seed 1337,
//     LE(seq[i-1]) || LE(local[i])), equal to Dynamo's sequence hashes, which
//     is what external query_by_hash clients send.
//   - Namespace IDs: a (model, LoRA, cache salt) triple reduced to a uint64.
//     This encoding is kvindex's own, not Dynamo's.
//
// LoRA mixing follows Dynamo's current code rather than "length-prefix and
// append the name": Dynamo adds xxh3_64(name, seed 0) to the seed (wrapping),
// and a Dynamo cache namespace adds xxh3_64(namespace, seed 1). The empty
// string means "no adapter" in both places, as in Dynamo.
//
// The package is pure: no I/O, goroutines, logging or clocks, and no
// package-level mutable state. Every function and method is safe for
// concurrent use. On little-endian machines hashing reads the token slice in
// place, so key computation allocates nothing beyond growing the caller's
// dst; Namespace.ID allocates only when its fields exceed 232 bytes together.
package kvblock
