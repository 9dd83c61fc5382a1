package kvblock

import (
	"encoding/binary"

	"github.com/zeebo/xxh3"
)

// namespaceSeed separates namespace IDs from every Dynamo hash; it is
// "kvindex/" read as a big-endian uint64.
const namespaceSeed uint64 = 0x6B76696E6465782F

// Namespace is the scope in which block keys are shared: blocks of different
// namespaces never share index nodes. Empty fields mean "none".
type Namespace struct {
	Model     string
	LoRA      string
	CacheSalt string
}

// ID reduces the namespace to a uint64: XXH3-64 with a kvindex-specific seed
// over each field as an 8-byte little-endian length followed by its bytes.
// The length prefixes make it unambiguous ({"ab","c"} and {"a","bc"} differ).
// The encoding is kvindex's, not Dynamo's; IDs are persisted in snapshots,
// so changing it is a snapshot format change.
func (n Namespace) ID() uint64 {
	var stack [256]byte
	buf := stack[:0]
	if size := 24 + len(n.Model) + len(n.LoRA) + len(n.CacheSalt); size > len(stack) {
		buf = make([]byte, 0, size)
	}
	for _, field := range [...]string{n.Model, n.LoRA, n.CacheSalt} {
		buf = binary.LittleEndian.AppendUint64(buf, uint64(len(field)))
		buf = append(buf, field...)
	}
	return xxh3.HashSeed(buf, namespaceSeed)
}
