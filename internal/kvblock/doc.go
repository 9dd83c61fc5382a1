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
// LoRA mixing follows Dynamo's code rather than "length-prefix and append the
// name": Dynamo adds xxh3_64(name, seed 0) to the seed (wrapping), and a Dynamo
// cache namespace adds xxh3_64(namespace, seed 1). The empty string means "no
// adapter" in both places, as in Dynamo.
//
// # Dynamo revision
//
// The seed arithmetic is pinned (DynamoSeedRevision) to ai-dynamo/dynamo's
// lib/kv-router/src/protocols.rs at 038eab23a6b6 (XXH3_SEED 1337; block_hash_seed
// calls dynamo_kv_hashing::compute_salt_hash(cache_namespace, lora_name)) with
// lib/kv-hashing/src/salt.rs in its wrapping-add form, the one whose doc states
// "router parity": 1337 + xxh3_64(lora, 0) + xxh3_64(namespace, 1). Later
// revisions of salt.rs (seen at 7b92686dc6f9, and c7fad0730dff, which also mixes
// in the block size) hash a JSON payload {salt, lora_name[, block_size]} with
// xxh3 seed 0 instead; kvindex does not follow them, so against such a Dynamo the
// keys of LoRA and cache-namespace requests differ (plain requests too, if that
// revision hashes the empty payload). TestLocalSeedFollowsThePinnedDynamoRevision
// holds the pinned arithmetic to numbers computed with libxxhash.
//
// The package is pure: no I/O, goroutines, logging or clocks, and no
// package-level mutable state. Every function and method is safe for
// concurrent use. On little-endian machines hashing reads the token slice in
// place, so key computation allocates nothing beyond growing the caller's
// dst; Namespace.ID allocates only when its fields exceed 232 bytes together.
package kvblock
