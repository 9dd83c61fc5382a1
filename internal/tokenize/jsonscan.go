package tokenize

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// Request objects are walked in place rather than decoded by encoding/json
// level by level. encoding/json validates a document, then decodes it, and does
// both again for the value it hands each UnmarshalJSON, so a value under n levels
// of custom decoding is scanned about 2n times: a chat message's base64 image of
// megabytes, which nothing here reads, took eight passes of its scanner. These
// helpers hand out members and elements as sub-slices of the input (never
// copied: a caller that keeps one clones it) and skip strings with
// bytes.IndexByte, so such an image costs one fast pass. They expect JSON that
// encoding/json has validated (it has, before it calls an UnmarshalJSON) and
// answer anything else with an error, never a panic.

// errMalformed is the error for input that is not the JSON expected.
var errMalformed = fmt.Errorf("%w: malformed JSON", ErrInvalidMessages)

// eachMember calls fn for every member of the JSON object data, in order, with
// the key unescaped and the value as a sub-slice of data.
func eachMember(data []byte, fn func(key string, value []byte) error) error {
	i := skipSpace(data, 0)
	if i == len(data) || data[i] != '{' {
		return fmt.Errorf("%w: want a JSON object, got %.20s", ErrInvalidMessages, data[i:])
	}
	return eachItem(data, i, '}', func(j int) (int, error) {
		kend, err := valueEnd(data, j)
		if err != nil || data[j] != '"' {
			return 0, errMalformed
		}
		key := string(data[j+1 : kend-1])
		if bytes.IndexByte(data[j:kend], '\\') >= 0 && json.Unmarshal(data[j:kend], &key) != nil {
			return 0, errMalformed
		}
		k := skipSpace(data, kend)
		if k == len(data) || data[k] != ':' {
			return 0, errMalformed
		}
		k = skipSpace(data, k+1)
		end, err := valueEnd(data, k)
		if err != nil {
			return 0, err
		}
		return end, fn(key, data[k:end])
	})
}

// eachElement calls fn for every element of the JSON array data, in order, with
// its index and the element as a sub-slice of data.
func eachElement(data []byte, fn func(i int, value []byte) error) error {
	i := skipSpace(data, 0)
	if i == len(data) || data[i] != '[' {
		return fmt.Errorf("%w: want a JSON array, got %.20s", ErrInvalidMessages, data[i:])
	}
	n := 0
	return eachItem(data, i, ']', func(j int) (int, error) {
		end, err := valueEnd(data, j)
		if err != nil {
			return 0, err
		}
		n++
		return end, fn(n-1, data[j:end])
	})
}

// eachItem walks the comma-separated items of the object or array opened at
// data[open] and closed by the byte end, which must end data too (but for
// whitespace): item reads the item starting at its argument and returns the
// index just past it.
func eachItem(data []byte, open int, end byte, item func(int) (int, error)) error {
	i := skipSpace(data, open+1)
	if i < len(data) && data[i] == end {
		return onlySpace(data, i+1)
	}
	for {
		next, err := item(i)
		if err != nil {
			return err
		}
		switch i = skipSpace(data, next); {
		case i < len(data) && data[i] == ',':
			i = skipSpace(data, i+1)
		case i < len(data) && data[i] == end:
			return onlySpace(data, i+1)
		default:
			return errMalformed
		}
	}
}

// valueEnd returns the index just past the JSON value that starts at data[i].
func valueEnd(data []byte, i int) (int, error) {
	if i >= len(data) {
		return 0, errMalformed
	}
	switch data[i] {
	case '"':
		return stringEnd(data, i)
	case '{', '[':
		depth := 0
		for j := i; j < len(data); j++ {
			switch data[j] {
			case '"':
				end, err := stringEnd(data, j)
				if err != nil {
					return 0, err
				}
				j = end - 1
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return j + 1, nil
				}
			}
		}
		return 0, errMalformed
	}
	// A number, true, false or null: up to the next delimiter.
	j := i
	for j < len(data) && !isDelimiter(data[j]) {
		j++
	}
	if j == i {
		return 0, errMalformed
	}
	return j, nil
}

// isDelimiter reports whether c ends a number or literal.
func isDelimiter(c byte) bool {
	switch c {
	case ',', ':', '{', '}', '[', ']', '"', ' ', '\t', '\n', '\r':
		return true
	}
	return false
}

// stringEnd returns the index just past the JSON string whose opening quote is
// data[i]. A quote closes it unless an odd number of backslashes precede it;
// counting them looks back no further than the previous quote, so the time is
// linear.
func stringEnd(data []byte, i int) (int, error) {
	for j := i + 1; ; j++ {
		k := bytes.IndexByte(data[j:], '"')
		if k < 0 {
			return 0, errMalformed
		}
		j += k
		n := 0
		for b := j - 1; b > i && data[b] == '\\'; b-- {
			n++
		}
		if n%2 == 0 {
			return j + 1, nil
		}
	}
}

// skipSpace returns the index of the first byte of data at or after i that is
// not JSON whitespace.
func skipSpace(data []byte, i int) int {
	for i < len(data) && (data[i] == ' ' || data[i] == '\t' || data[i] == '\n' || data[i] == '\r') {
		i++
	}
	return i
}

// onlySpace checks that data holds nothing but whitespace from i on.
func onlySpace(data []byte, i int) error {
	if skipSpace(data, i) != len(data) {
		return errMalformed
	}
	return nil
}
