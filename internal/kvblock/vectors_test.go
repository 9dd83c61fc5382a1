package kvblock

import (
	"encoding/json"
	"os"
	"slices"
	"testing"

	"github.com/zeebo/xxh3"
)

// referenceVectors mirrors testdata/reference_vectors.json, written by
// testdata/gen_reference_vectors.py from the xxHash reference C library
// (libxxhash) and Dynamo's formulas, independently of this package.
type referenceVectors struct {
	LibxxhashVersion int `json:"libxxhash_version"`
	XXH3             []struct {
		Len  int    `json:"len"`
		Seed uint64 `json:"seed"`
		Hash uint64 `json:"hash"`
	} `json:"xxh3"`
	Blocks []struct {
		BlockSize      int      `json:"block_size"`
		LoRA           string   `json:"lora"`
		CacheNamespace string   `json:"cache_namespace"`
		Seed           uint64   `json:"seed"`
		Tokens         []uint32 `json:"tokens"`
		Local          []uint64 `json:"local"`
		Chain          []uint64 `json:"chain"`
	} `json:"blocks"`
	Namespaces []struct {
		Model     string `json:"model"`
		LoRA      string `json:"lora"`
		CacheSalt string `json:"cache_salt"`
		ID        uint64 `json:"id"`
	} `json:"namespaces"`
}

func loadReferenceVectors(t *testing.T) referenceVectors {
	t.Helper()
	raw, err := os.ReadFile("testdata/reference_vectors.json")
	if err != nil {
		t.Fatalf("read reference vectors: %v", err)
	}
	var v referenceVectors
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatalf("decode reference vectors: %v", err)
	}
	if len(v.XXH3) == 0 || len(v.Blocks) == 0 || len(v.Namespaces) == 0 {
		t.Fatalf("reference vectors incomplete: %d xxh3, %d blocks, %d namespaces",
			len(v.XXH3), len(v.Blocks), len(v.Namespaces))
	}
	return v
}

// referencePattern must match pattern() in gen_reference_vectors.py.
func referencePattern(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*31 + 7)
	}
	return b
}

// The xxh3 module is the foundation of Dynamo compatibility: its seeded
// 64-bit hash must equal XXH3_64bits_withSeed of the reference C library
// for every input-length class (0-3, 4-8, 9-16, 17-128, 129-240, >240).
func TestXXH3HashSeedMatchesReferenceC(t *testing.T) {
	v := loadReferenceVectors(t)
	seeds := map[uint64]bool{}
	for _, c := range v.XXH3 {
		seeds[c.Seed] = true
		if got := xxh3.HashSeed(referencePattern(c.Len), c.Seed); got != c.Hash {
			t.Errorf("xxh3.HashSeed(len %d, seed %d) = %d, libxxhash %d says %d",
				c.Len, c.Seed, got, v.LibxxhashVersion, c.Hash)
		}
	}
	if !seeds[DynamoSeed] {
		t.Errorf("reference vectors lack seed %d", DynamoSeed)
	}
}

// Canonical anchors: XXH3_64bits of empty input is 0x2D06800538D394C2
// (xxHash's cli/xsum_sanity_check.c), and Dynamo's own test pins the seeded
// hash of raw bytes: ai-dynamo/dynamo lib/kv-router/src/protocols.rs,
// test_router_event_new: compute_block_hash(b"test data") ==
// LocalBlockHash(13226331709069118873) with XXH3_SEED = 1337.
func TestXXH3CanonicalAnchors(t *testing.T) {
	if got := xxh3.HashSeed(nil, 0); got != 0x2D06800538D394C2 {
		t.Errorf("XXH3 of empty input, seed 0 = %#x, want 0x2D06800538D394C2", got)
	}
	if got := xxh3.HashSeed([]byte("test data"), DynamoSeed); got != 13226331709069118873 {
		t.Errorf(`XXH3("test data", 1337) = %d, want 13226331709069118873`, got)
	}
}

// Golden vectors from Dynamo's own tests: ai-dynamo/dynamo
// lib/tokens/src/lib.rs, test_validate_hash_constants (tokens 1..12, block
// size 4, seed 1337): HASH_1_4, HASH_5_8, HASH_9_12 are the block hashes and
// SEQ_HASH_1_4, SEQ_HASH_5_8, SEQ_HASH_9_12 the sequence hashes, each
// sequence hash being hash([parent, block], 1337).
func TestDynamoGoldenVectors(t *testing.T) {
	tests := []struct {
		name      string
		tokens    []uint32
		wantLocal []uint64
		wantChain []uint64
	}{
		{
			name:      "three full blocks",
			tokens:    []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12},
			wantLocal: []uint64{14643705804678351452, 16777012769546811212, 483935686894639516},
			wantChain: []uint64{14643705804678351452, 4945711292740353085, 12583592247330656132},
		},
		{
			// Dynamo's test_tokens_blocks: [9, 10] stay in the partial block.
			name:      "partial tail ignored",
			tokens:    []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10},
			wantLocal: []uint64{14643705804678351452, 16777012769546811212},
			wantChain: []uint64{14643705804678351452, 4945711292740353085},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			local := AppendLocalHashes(nil, tt.tokens, 4, "")
			if !slices.Equal(local, tt.wantLocal) {
				t.Errorf("local hashes = %v, want %v", local, tt.wantLocal)
			}
			if chain := AppendChainHashes(nil, local); !slices.Equal(chain, tt.wantChain) {
				t.Errorf("chain hashes = %v, want %v", chain, tt.wantChain)
			}
		})
	}
}

// Dynamo's tests check LoRA and cache-namespace hashing only against its
// own formula, never against literal numbers, so these vectors come from
// an independent Python rendering of that formula over libxxhash.
func TestBlockKeysMatchReference(t *testing.T) {
	v := loadReferenceVectors(t)
	for _, c := range v.Blocks {
		name := c.LoRA + "|" + c.CacheNamespace
		if len(name) > 40 {
			name = name[:40]
		}
		t.Run(name, func(t *testing.T) {
			if got := LocalSeed(c.LoRA, c.CacheNamespace); got != c.Seed {
				t.Errorf("LocalSeed = %d, want %d", got, c.Seed)
			}
			local := AppendLocalHashesSeed(nil, c.Tokens, c.BlockSize, c.Seed)
			if !slices.Equal(local, c.Local) {
				t.Errorf("block size %d, %d tokens: local = %v, want %v",
					c.BlockSize, len(c.Tokens), local, c.Local)
			}
			if c.CacheNamespace == "" {
				if viaName := AppendLocalHashes(nil, c.Tokens, c.BlockSize, c.LoRA); !slices.Equal(viaName, c.Local) {
					t.Errorf("AppendLocalHashes(lora %q) = %v, want %v", c.LoRA, viaName, c.Local)
				}
			}
			if chain := AppendChainHashes(nil, local); !slices.Equal(chain, c.Chain) {
				t.Errorf("chain = %v, want %v", chain, c.Chain)
			}
		})
	}
}

func TestNamespaceIDMatchesReference(t *testing.T) {
	v := loadReferenceVectors(t)
	for _, c := range v.Namespaces {
		ns := Namespace{Model: c.Model, LoRA: c.LoRA, CacheSalt: c.CacheSalt}
		if got := ns.ID(); got != c.ID {
			t.Errorf("%+v.ID() = %d, want %d", ns, got, c.ID)
		}
	}
}

// TestLocalSeedFollowsThePinnedDynamoRevision holds LocalSeed to the seed
// arithmetic of DynamoSeedRevision (1337 + xxh3(lora, 0) + xxh3(namespace, 1),
// wrapping), with values computed by libxxhash (XXH3_64bits_withSeed).
func TestLocalSeedFollowsThePinnedDynamoRevision(t *testing.T) {
	tests := []struct {
		lora, namespace string
		want            uint64
	}{
		{"", "", 1337},
		{"sql-lora", "", 10034886934280409050},
		{"", "tenant-a", 1948188790972764086},
		{"sql-lora", "tenant-a", 11983075725253171799},
	}
	for _, tt := range tests {
		if got := LocalSeed(tt.lora, tt.namespace); got != tt.want {
			t.Errorf("LocalSeed(%q, %q) = %d, want %d (Dynamo %s)", tt.lora, tt.namespace, got, tt.want, DynamoSeedRevision)
		}
	}
	// (The later JSON-payload form would give xxh3_64(`{"salt":"tenant-a"}`, 0) =
	// 1306913871552960716 for the third case.)
}
