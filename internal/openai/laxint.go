package openai

import (
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"strconv"
)

// LaxInt is an integer request field (max_tokens, max_completion_tokens, n) read
// as vLLM's pydantic models read an int in their default, lax mode: a JSON
// integer, a number without a fractional part (16.0, 1e2), or a string holding a
// base-10 integer ("16", "-1"). A fraction, any other string, a bool, an array, an
// object, and a value outside int's range are refused with json's
// UnmarshalTypeError, which names the field ("... into Go struct field
// ChatRequest.max_tokens of type int"). JSON null leaves a *LaxInt nil (absent).
type LaxInt int

// UnmarshalJSON reads data as described at LaxInt.
func (n *LaxInt) UnmarshalJSON(data []byte) error {
	if string(data) == "null" {
		return nil // as encoding/json leaves an int for null
	}
	v, why := laxInt(data)
	if why != "" {
		return &json.UnmarshalTypeError{Value: why, Type: reflect.TypeFor[int]()}
	}
	*n = LaxInt(v)
	return nil
}

// laxInt is the integer data holds, or why it holds none (the value as
// UnmarshalTypeError describes it, at most 32 bytes of it shown).
func laxInt(data []byte) (int, string) {
	switch data[0] {
	case '"':
		var s string
		if err := json.Unmarshal(data, &s); err != nil {
			return 0, "string"
		}
		v, err := strconv.ParseInt(s, 10, strconv.IntSize)
		if err != nil {
			return 0, fmt.Sprintf("string %.32q (not a base-10 integer in int's range)", s)
		}
		return int(v), ""
	case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		if v, err := strconv.ParseInt(string(data), 10, strconv.IntSize); err == nil {
			return int(v), ""
		}
		// 16.0, 1e2: exact in a float64 when integral and within int's range.
		f, err := strconv.ParseFloat(string(data), 64)
		switch {
		case err != nil || f < math.MinInt || f >= math.MaxInt:
			return 0, fmt.Sprintf("number %.32s (out of int's range)", data)
		case f != math.Trunc(f):
			return 0, fmt.Sprintf("number %.32s (not a whole number)", data)
		}
		return int(f), ""
	case 't', 'f':
		return 0, "bool"
	case '[':
		return 0, "array"
	}
	return 0, "object"
}
