package traces

import (
	"encoding/binary"
	"fmt"
	"time"

	"github.com/zeebo/xxh3"
)

// SummaryBlockTokens is the block size Summary counts distinct blocks in (the
// engines' default).
const SummaryBlockTokens = 16

// Summary is a trace's statistics: what the golden tests pin and the bench prints.
type Summary struct {
	Requests, Sessions, Groups int
	PromptTokens, OutputTokens int
	// Blocks counts full 16-token prompt blocks; DistinctBlocks those with a prefix
	// seen for the first time. 1 − DistinctBlocks/Blocks is the hit rate a single
	// infinite cache would reach: the ceiling of any routing.
	Blocks, DistinctBlocks int
	Duration               time.Duration
	// Digest hashes every field of every request, in order.
	Digest uint64
}

// ReuseCeiling is 1 − DistinctBlocks/Blocks.
func (s Summary) ReuseCeiling() float64 {
	if s.Blocks == 0 {
		return 0
	}
	return 1 - float64(s.DistinctBlocks)/float64(s.Blocks)
}

func (s Summary) String() string {
	return fmt.Sprintf("%d requests, %d sessions, %d groups, %d prompt + %d output tokens, %d/%d distinct blocks (reuse ceiling %.1f%%), %v",
		s.Requests, s.Sessions, s.Groups, s.PromptTokens, s.OutputTokens, s.DistinctBlocks, s.Blocks, 100*s.ReuseCeiling(), s.Duration.Round(time.Millisecond))
}

// Summarize computes t's summary.
func Summarize(t Trace) Summary {
	s := Summary{Requests: len(t.Requests)}
	sessions, groups := map[string]bool{}, map[int]bool{}
	seen := map[uint64]bool{}
	d := xxh3.New()
	var buf []byte
	for _, r := range t.Requests {
		sessions[r.Session] = true
		if r.Group != 0 {
			groups[r.Group] = true
		}
		s.PromptTokens += len(r.Prompt)
		s.OutputTokens += r.OutputTokens
		s.Duration = max(s.Duration, r.Arrival)
		var chain uint64
		for i := 0; i+SummaryBlockTokens <= len(r.Prompt); i += SummaryBlockTokens {
			buf = binary.LittleEndian.AppendUint64(buf[:0], chain)
			for _, tok := range r.Prompt[i : i+SummaryBlockTokens] {
				buf = binary.LittleEndian.AppendUint32(buf, tok)
			}
			chain = xxh3.Hash(buf)
			s.Blocks++
			if !seen[chain] {
				seen[chain] = true
				s.DistinctBlocks++
			}
		}
		buf = binary.LittleEndian.AppendUint64(buf[:0], uint64(r.ID))
		buf = binary.LittleEndian.AppendUint64(buf, uint64(r.Arrival))
		buf = binary.LittleEndian.AppendUint64(buf, uint64(r.Group))
		buf = binary.LittleEndian.AppendUint64(buf, uint64(r.OutputTokens))
		buf = append(buf, r.Session...)
		buf = append(buf, 0)
		buf = append(buf, r.Prefix...)
		buf = append(buf, 0)
		for _, tok := range r.Prompt {
			buf = binary.LittleEndian.AppendUint32(buf, tok)
		}
		d.Write(buf)
	}
	s.Sessions, s.Groups = len(sessions), len(groups)
	s.Digest = d.Sum64()
	return s
}
