package fakeengine

import (
	"context"
	"log/slog"
	"testing"
)

// BenchmarkGenerate measures the simulator's own cost per request (time scale 0,
// events published): distinct 256-token prompts sharing a 128-token prefix, 16
// output tokens.
func BenchmarkGenerate(b *testing.B) {
	cfg := testConfig()
	cfg.BlockSize = 16
	cfg.NumGPUBlocks = 4096
	e, err := New(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		b.Fatal(err)
	}
	if err := e.Start(); err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	shared := seqPrompt(0, 128)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		prompt := append(append([]uint32(nil), shared...), uint32(i%256), uint32(i/256%256))
		prompt = append(prompt, seqPrompt(i, 126)...)
		if _, err := e.Generate(context.Background(), Request{Prompt: prompt, MaxTokens: 16}); err != nil {
			b.Fatal(err)
		}
	}
}
