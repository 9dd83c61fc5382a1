package kvblock

import (
	"encoding/binary"
	"slices"

	"github.com/zeebo/xxh3"
)

// NextChainHash returns the chain hash of a block whose parent has chain hash
// parent and whose own local hash is local: XXH3-64 with DynamoSeed over
// LE(parent) || LE(local). The seed stays 1337 under a LoRA adapter; the
// adapter already changed every local hash.
func NextChainHash(parent, local uint64) uint64 {
	var buf [16]byte
	binary.LittleEndian.PutUint64(buf[:8], parent)
	binary.LittleEndian.PutUint64(buf[8:], local)
	return xxh3.HashSeed(buf[:], DynamoSeed)
}

// AppendChainHashes appends to dst the chain hashes of a sequence whose local
// hashes are locals, starting at the root: the first chain hash is the first
// local hash. It returns the extended slice.
func AppendChainHashes(dst []uint64, locals []uint64) []uint64 {
	if len(locals) == 0 {
		return dst
	}
	dst = slices.Grow(dst, len(locals))
	seq := locals[0]
	dst = append(dst, seq)
	for _, local := range locals[1:] {
		seq = NextChainHash(seq, local)
		dst = append(dst, seq)
	}
	return dst
}
