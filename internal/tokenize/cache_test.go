package tokenize

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func newTestCache(t *testing.T, reg prometheus.Registerer) *Cache {
	t.Helper()
	c, err := NewCache(CacheConfig{MaxBytes: 32 << 20, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// corpusTexts returns the golden corpus strings of a variant (not the vocabulary).
func corpusTexts(t testing.TB, name string) []goldenRecord {
	t.Helper()
	var out []goldenRecord
	for _, r := range readGolden(t, name) {
		if r.Vocab == nil {
			out = append(out, r)
		}
	}
	return out
}

func TestSegmentCacheGivesTheSameIDs(t *testing.T) {
	cache := newTestCache(t, nil)
	plain := variantTokenizer(t, "qwen3")
	tok := plain.WithCache(cache)
	recs := corpusTexts(t, "qwen3")
	for pass := range 3 {
		for _, r := range recs {
			if got := tok.Encode(r.Text, false); !slices.Equal(got, r.IDs) {
				t.Fatalf("pass %d: Encode(%s) = %v, want %v", pass, short(r.Text), got, r.IDs)
			}
		}
		cache.Wait()
	}
	st := cache.Stats()
	if st.SegmentHits == 0 || st.SegmentMisses == 0 {
		t.Fatalf("stats %+v: want both segment hits (repeated texts) and misses (first pass)", st)
	}
	// A prompt made of cached messages is served segment by segment, exactly.
	msgs := []string{strings.Repeat("The first message is long enough to be cached. ", 3), strings.Repeat("第二条消息也足够长，可以缓存。", 3)}
	prompt := "<|im_start|>user\n" + msgs[0] + "<|im_end|>\n<|im_start|>assistant\n" + msgs[1] + "<|im_end|>"
	want := plain.Encode(prompt, false)
	tok.Encode(prompt, false)
	cache.Wait()
	before := cache.Stats().SegmentHits
	if got := tok.Encode(prompt, false); !slices.Equal(got, want) {
		t.Fatalf("cached prompt ids %v, want %v", got, want)
	}
	if hits := cache.Stats().SegmentHits - before; hits != 2 {
		t.Fatalf("re-encoding a two-message prompt hit the cache %d times, want 2", hits)
	}
}

func TestBlockKeysAreKeptPerNamespace(t *testing.T) {
	cache := newTestCache(t, nil)
	keys := []uint64{1, 2, 3}
	cache.SetBlockKeys("qwen3|lora=a|bs=16", "prompt", keys)
	cache.Wait()
	if got, ok := cache.BlockKeys("qwen3|lora=a|bs=16", "prompt"); !ok || !slices.Equal(got, keys) {
		t.Fatalf("BlockKeys = %v, %v; want %v", got, ok, keys)
	}
	for _, miss := range [][2]string{{"qwen3|lora=b|bs=16", "prompt"}, {"qwen3|lora=a|bs=16", "prompt "}} {
		if got, ok := cache.BlockKeys(miss[0], miss[1]); ok {
			t.Fatalf("BlockKeys(%q, %q) = %v, want a miss", miss[0], miss[1], got)
		}
	}
	// Token segments and block keys of the same text do not collide.
	if _, ok := cache.segment("qwen3|lora=a|bs=16", "prompt"); ok {
		t.Fatal("a block-key entry answered a segment lookup")
	}
	if st := cache.Stats(); st.BlockKeyHits != 1 || st.BlockKeyMisses != 2 || st.SegmentMisses != 1 {
		t.Fatalf("stats = %+v, want 1 block-key hit, 2 misses, 1 segment miss", st)
	}
}

func TestCacheMetricsCountLookups(t *testing.T) {
	reg := prometheus.NewRegistry()
	cache := newTestCache(t, reg)
	cache.SetBlockKeys("ns", "p", []uint64{7})
	cache.Wait()
	cache.BlockKeys("ns", "p")
	cache.BlockKeys("ns", "q")
	cache.BlockKeys("ns", "r")
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			got[f.GetName()+"/"+m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
		}
	}
	want := map[string]float64{
		"kvindex_tokenize_cache_hits_total/block_keys": 1, "kvindex_tokenize_cache_misses_total/block_keys": 2,
		"kvindex_tokenize_cache_hits_total/segment": 0, "kvindex_tokenize_cache_misses_total/segment": 0,
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v (all: %v)", k, got[k], v, got)
		}
	}
	if _, err := NewCache(CacheConfig{Registerer: reg}); err == nil {
		t.Fatal("a second cache on the same registry registered its metrics")
	}
	if _, err := NewCache(CacheConfig{MaxBytes: -1}); err == nil {
		t.Fatal("a negative budget was accepted")
	}
}

func TestConcurrentEncodersAgree(t *testing.T) {
	cache := newTestCache(t, nil)
	tok := variantTokenizer(t, "llama3").WithCache(cache)
	recs := corpusTexts(t, "llama3")
	var wg sync.WaitGroup
	errs := make(chan string, 4)
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range recs {
				r := recs[(i*7+w*31)%len(recs)]
				if got := tok.Encode(r.Text, false); !slices.Equal(got, r.IDs) {
					errs <- "Encode(" + short(r.Text) + ") differs under concurrency"
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}

func TestRegistryLoadsTokenizerDirectories(t *testing.T) {
	dirs := map[string]string{"org/tiny-a": t.TempDir(), "org/tiny-b": t.TempDir()}
	data, err := json.Marshal(tinyTokenizer())
	if err != nil {
		t.Fatal(err)
	}
	var specs Specs
	for model, dir := range dirs {
		if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), data, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := specs.Set(model + "=" + dir); err != nil {
			t.Fatal(err)
		}
	}
	r := NewRegistry()
	if err := r.LoadAll(specs, Options{}); err != nil {
		t.Fatal(err)
	}
	for model := range dirs {
		tok, err := r.Lookup(model)
		if err != nil {
			t.Fatal(err)
		}
		if got := tok.Encode("abc<|s|>", false); !slices.Equal(got, []uint32{258, 261}) {
			t.Errorf("%s: Encode(abc<|s|>) = %v, want [258 261]", model, got)
		}
	}
	if err := r.LoadAll(Specs{{Model: "m", Dir: t.TempDir()}}, Options{}); err == nil || !strings.Contains(err.Error(), "--tokenizer=m=") {
		t.Fatalf("LoadAll of an empty directory: error = %v, want one naming the flag value", err)
	}
}
