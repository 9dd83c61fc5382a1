package tokenize

import (
	"encoding/json"
	"strings"
	"testing"
)

// Benchmarks report tokens/s on one goroutine (run with -cpu 1 for one core):
//
//	go test -run '^$' -bench 'Encode|ChatTemplate' -benchtime 2s -cpu 1 ./internal/tokenize
//
// cold: the word cache is emptied before every encode and no segment cache is used,
// so every word that is not a single vocabulary token goes through BPE merging;
// warm: the word cache holds the text's words; segment-cache: the ids come from the
// ristretto cache (a repeated prompt or message).

func benchTexts(b *testing.B, variantName string) map[string][]string {
	b.Helper()
	var mixed []string
	english := ""
	for _, r := range readGolden(b, variantName) {
		if r.Vocab != nil {
			continue
		}
		if len(r.Text) == 20000 && english == "" {
			english = r.Text
			continue
		}
		mixed = append(mixed, r.Text)
	}
	if english == "" {
		b.Fatal("the golden corpus has no 20,000-character text")
	}
	return map[string][]string{"english20k": {english}, "mixed": mixed}
}

func (c *wordCache) clear() {
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mu.Lock()
		clear(sh.words)
		sh.bytes = 0
		sh.mu.Unlock()
	}
}

func BenchmarkEncode(b *testing.B) {
	for _, model := range []string{"qwen3", "llama3"} {
		tok := variantTokenizer(b, model)
		texts := benchTexts(b, model)
		for _, corpus := range []string{"english20k", "mixed"} {
			inputs := texts[corpus]
			tokens := 0
			for _, s := range inputs {
				tokens += len(tok.Encode(s, false))
			}
			run := func(b *testing.B, t *HFTokenizer, before func()) {
				b.ReportAllocs()
				b.ResetTimer()
				for b.Loop() {
					if before != nil {
						b.StopTimer()
						before()
						b.StartTimer()
					}
					for _, s := range inputs {
						t.Encode(s, false)
					}
				}
				b.ReportMetric(float64(tokens)*float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
			}
			b.Run(model+"/"+corpus+"/cold", func(b *testing.B) { run(b, tok, tok.bpe.cache.clear) })
			b.Run(model+"/"+corpus+"/warm", func(b *testing.B) { run(b, tok, nil) })
			b.Run(model+"/"+corpus+"/segment-cache", func(b *testing.B) {
				cache, err := NewCache(CacheConfig{})
				if err != nil {
					b.Fatal(err)
				}
				defer cache.Close()
				cached, err := NewHFTokenizer(model, variantFiles(b, findVariant(b, model)), Options{Cache: cache})
				if err != nil {
					b.Fatal(err)
				}
				for range 3 {
					for _, s := range inputs {
						cached.Encode(s, false)
					}
					cache.Wait()
				}
				run(b, cached, nil)
			})
		}
	}
}

func BenchmarkApplyChatTemplate(b *testing.B) {
	var c chatCase
	for _, cc := range readChatCases(b) {
		if cc.Name == "parallel_tool_calls" {
			c = cc
		}
	}
	msgs, opts := c.request(b)
	for _, model := range []string{"qwen3", "llama3"} {
		tok := variantTokenizer(b, model)
		b.Run(model, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := tok.ApplyChatTemplate(msgs, opts); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// A message carrying a 4 MiB base64 image, as a vision request sends it: the
// image is passed on, never needed, so decoding should cost about one pass over it.
//
//	go test -run '^$' -bench MessageWithImage -cpu 1 ./internal/tokenize
func BenchmarkDecodeMessageWithImage(b *testing.B) {
	data := []byte(`[{"role":"user","content":[{"type":"text","text":"what is this?"},{"type":"image_url","image_url":{"url":"data:image/png;base64,` +
		strings.Repeat("QUFB", 1<<20) + `"}}]}]`)
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		var msgs []Message
		if err := json.Unmarshal(data, &msgs); err != nil || len(msgs[0].Media) != 1 {
			b.Fatal(err)
		}
	}
}
