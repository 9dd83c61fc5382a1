package kvblock

import (
	"encoding/binary"
	"slices"
	"unsafe"

	"github.com/zeebo/xxh3"
)

// DynamoSeedRevision is the ai-dynamo/dynamo revision whose seed arithmetic
// LocalSeed follows (see the package doc, "Dynamo revision").
const DynamoSeedRevision = "038eab23a6b6 (lib/kv-router/src/protocols.rs), salt.rs wrapping-add form"

// DynamoSeed is the XXH3 seed Dynamo uses for chain hashes and, without a
// LoRA adapter or cache namespace, for local hashes.
const DynamoSeed uint64 = 1337

// nativeLittleEndian decides whether a []uint32 can be hashed in place: its
// memory then already is the little-endian byte string Dynamo hashes.
var nativeLittleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// LocalSeed returns the seed of the local hashes of a request that uses the
// given LoRA adapter and Dynamo cache namespace; "" means none for either.
// It is Dynamo's compute_salt_hash (lib/kv-hashing/src/salt.rs).
func LocalSeed(lora, cacheNamespace string) uint64 {
	seed := DynamoSeed
	if lora != "" {
		seed += xxh3.HashStringSeed(lora, 0)
	}
	if cacheNamespace != "" {
		seed += xxh3.HashStringSeed(cacheNamespace, 1)
	}
	return seed
}

// BlockCount returns how many full blocks, and so local hashes, numTokens
// tokens make. It is 0 when blockSize <= 0.
func BlockCount(numTokens, blockSize int) int {
	if blockSize <= 0 || numTokens <= 0 {
		return 0
	}
	return numTokens / blockSize
}

// AppendLocalHashes appends to dst the local hash of every full block of
// blockSize tokens, hashed under the LoRA adapter lora ("" = base model), and
// returns the extended slice. A partial last block is ignored. When
// blockSize <= 0 there are no blocks and dst is returned unchanged.
func AppendLocalHashes(dst []uint64, tokens []uint32, blockSize int, lora string) []uint64 {
	return AppendLocalHashesSeed(dst, tokens, blockSize, LocalSeed(lora, ""))
}

// AppendLocalHashesSeed is AppendLocalHashes with a seed from LocalSeed, for
// callers that hash many token runs of one request or adapter.
func AppendLocalHashesSeed(dst []uint64, tokens []uint32, blockSize int, seed uint64) []uint64 {
	n := BlockCount(len(tokens), blockSize)
	dst = slices.Grow(dst, n)
	for i := range n {
		block := tokens[i*blockSize : (i+1)*blockSize]
		dst = append(dst, hashBlock(block, seed))
	}
	return dst
}

func hashBlock(block []uint32, seed uint64) uint64 {
	if nativeLittleEndian {
		bytes := unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(block))), len(block)*4)
		return xxh3.HashSeed(bytes, seed)
	}
	return hashBlockPortable(block, seed)
}

// hashBlockPortable encodes the tokens explicitly; big-endian machines need
// it, and tests run it everywhere against the in-place path.
func hashBlockPortable(block []uint32, seed uint64) uint64 {
	var stack [1024]byte
	buf := stack[:0]
	if len(block)*4 > len(stack) {
		buf = make([]byte, 0, len(block)*4)
	}
	for _, token := range block {
		buf = binary.LittleEndian.AppendUint32(buf, token)
	}
	return xxh3.HashSeed(buf, seed)
}
