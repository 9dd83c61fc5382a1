package traces

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"time"
)

// MooncakeBlockTokens is the Mooncake trace's block size: one hash id per 512
// prompt tokens.
const MooncakeBlockTokens = 512

// MooncakeOptions tune LoadMooncake.
type MooncakeOptions struct {
	// SpeedUp divides the trace's timestamps (2 replays it twice as fast); <= 0 is 1.
	SpeedUp float64
}

// mooncakeLine is one line of a Mooncake trace (FAST'25 / kvcache-ai Mooncake
// traces): timestamp in ms since the first request, input and output lengths in
// tokens, and one hash id per 512-token block, each id standing for the whole
// prefix up to and including its block.
type mooncakeLine struct {
	Timestamp    *float64 `json:"timestamp"`
	InputLength  *int     `json:"input_length"`
	OutputLength *int     `json:"output_length"`
	HashIDs      []int64  `json:"hash_ids"`
}

// LoadMooncakeFile reads a Mooncake JSONL file (see LoadMooncake).
func LoadMooncakeFile(path string, o MooncakeOptions) (Trace, error) {
	f, err := os.Open(path)
	if err != nil {
		return Trace{}, fmt.Errorf("traces: mooncake: %w", err)
	}
	defer f.Close()
	return LoadMooncake(f, path, o)
}

// LoadMooncake turns a Mooncake trace into token prompts: hash id h becomes 512
// token ids drawn from a generator seeded with h, so equal ids give equal blocks
// (and, ids naming whole prefixes, equal prefixes); the last block holds only the
// input_length − 512·(n−1) leading tokens of its id's block. A line whose
// len(hash_ids) is not ceil(input_length/512) is an error naming the line. Each
// request is its own session (the format has none); the arrival is timestamp /
// SpeedUp. Blank lines are skipped; requests are sorted by arrival.
func LoadMooncake(r io.Reader, name string, o MooncakeOptions) (Trace, error) {
	speed := o.SpeedUp
	if speed <= 0 {
		speed = 1
	}
	blocks := map[int64][]uint32{}
	block := func(id int64) []uint32 {
		b, ok := blocks[id]
		if !ok {
			rng := rand.New(rand.NewPCG(uint64(id), 0x6d6f6f6e63616b65))
			b = tokens(rng, MooncakeBlockTokens)
			blocks[id] = b
		}
		return b
	}
	var reqs []Request
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	for line := 1; sc.Scan(); line++ {
		raw := sc.Bytes()
		if len(trimSpace(raw)) == 0 {
			continue
		}
		var l mooncakeLine
		if err := json.Unmarshal(raw, &l); err != nil {
			return Trace{}, fmt.Errorf("%w: mooncake %s line %d: %v", ErrInvalid, name, line, err)
		}
		if l.Timestamp == nil || l.InputLength == nil || l.OutputLength == nil {
			return Trace{}, fmt.Errorf("%w: mooncake %s line %d: timestamp, input_length and output_length are required", ErrInvalid, name, line)
		}
		in, out := *l.InputLength, *l.OutputLength
		if in <= 0 || out < 0 || *l.Timestamp < 0 {
			return Trace{}, fmt.Errorf("%w: mooncake %s line %d: input_length %d, output_length %d, timestamp %v", ErrInvalid, name, line, in, out, *l.Timestamp)
		}
		if want := (in + MooncakeBlockTokens - 1) / MooncakeBlockTokens; len(l.HashIDs) != want {
			return Trace{}, fmt.Errorf("%w: mooncake %s line %d: %d hash_ids for input_length %d (want ceil(%d/512) = %d)",
				ErrInvalid, name, line, len(l.HashIDs), in, in, want)
		}
		prompt := make([]uint32, 0, in)
		for i, id := range l.HashIDs {
			b := block(id)
			if i == len(l.HashIDs)-1 {
				b = b[:in-MooncakeBlockTokens*i]
			}
			prompt = append(prompt, b...)
		}
		reqs = append(reqs, Request{
			Arrival:      time.Duration(*l.Timestamp / speed * float64(time.Millisecond)),
			Session:      fmt.Sprintf("mooncake-%d", line),
			Prompt:       prompt,
			OutputTokens: max(out, 1),
		})
	}
	if err := sc.Err(); err != nil {
		return Trace{}, fmt.Errorf("traces: mooncake %s: %w", name, err)
	}
	return finish("mooncake", reqs, len(reqs)), nil
}

func trimSpace(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t' || b[0] == '\r') {
		b = b[1:]
	}
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t' || b[len(b)-1] == '\r') {
		b = b[:len(b)-1]
	}
	return b
}
