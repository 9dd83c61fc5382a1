package openai

import (
	"encoding/json"
	"strings"
	"testing"
)

// max_tokens, max_completion_tokens and n take what vLLM's pydantic models take
// for an int in lax mode (integral numbers, base-10 integer strings) and refuse
// the rest with an error naming the field.
func TestIntegerFieldsReadAsVLLMReadsThem(t *testing.T) {
	tests := []struct {
		value string
		want  int  // when ok
		ok    bool // accepted
	}{
		{`16`, 16, true},
		{`-1`, -1, true},
		{`0`, 0, true},
		{`16.0`, 16, true},
		{`1e2`, 100, true},
		{`1.6e1`, 16, true},
		{`-0.0`, 0, true},
		{`"16"`, 16, true},
		{`"-3"`, -3, true},
		{`"+7"`, 7, true},
		{`9223372036854775807`, 9223372036854775807, true},
		{`16.5`, 0, false},
		{`1e-1`, 0, false},
		{`"16.0"`, 0, false},
		{`"sixteen"`, 0, false},
		{`""`, 0, false},
		{`" 16"`, 0, false},
		{`"0x10"`, 0, false},
		{`true`, 0, false},
		{`false`, 0, false},
		{`[16]`, 0, false},
		{`{"value":16}`, 0, false},
		{`9223372036854775808`, 0, false},
		{`1e19`, 0, false},
		{`1e400`, 0, false},
		{`"99999999999999999999"`, 0, false},
	}
	for _, field := range []string{"max_tokens", "max_completion_tokens", "n"} {
		for _, tt := range tests {
			t.Run(field+"="+tt.value, func(t *testing.T) {
				var r ChatRequest
				err := json.Unmarshal([]byte(`{"messages":[],"`+field+`":`+tt.value+`}`), &r)
				got := map[string]*LaxInt{"max_tokens": r.MaxTokens, "max_completion_tokens": r.MaxCompletionTokens, "n": r.N}[field]
				switch {
				case tt.ok && (err != nil || got == nil || int(*got) != tt.want):
					t.Fatalf("got %v, %v; want %d", got, err, tt.want)
				case !tt.ok && (err == nil || !strings.Contains(err.Error(), "."+field+" ")):
					t.Fatalf("got %v, %v; want an error naming %s", got, err, field)
				}
			})
		}
	}
	// The completion request reads them alike; null is absent.
	var c CompletionRequest
	if err := json.Unmarshal([]byte(`{"prompt":"x","max_tokens":"8","n":1.0}`), &c); err != nil || c.OutputTokens() != 8 || CheckN(c.N) != nil {
		t.Fatalf("completion: %v, max_tokens %d, n %v", err, c.OutputTokens(), c.N)
	}
	if err := json.Unmarshal([]byte(`{"prompt":"x","max_tokens":null,"n":null}`), &c); err != nil || c.MaxTokens != nil || c.N != nil {
		t.Fatalf("null: %v, max_tokens %v, n %v; want both absent", err, c.MaxTokens, c.N)
	}
}
