package tokenize

// Byte-level BPE vocabularies (GPT-2 and its descendants) spell every byte as one
// printable character so that the vocabulary is JSON text: printable Latin-1 bytes stand
// for themselves and the other 68 bytes (controls, space, 0x7f-0xa0, 0xad) map to U+0100
// onwards, in byte order. The encoder here works on raw bytes and converts the
// vocabulary once at load time, so the table is only needed in that direction and back.

// byteLevelRunes[b] is the character that spells byte b.
var byteLevelRunes = func() [256]rune {
	var table [256]rune
	next := rune(256)
	for b := 0; b < 256; b++ {
		if (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff) {
			table[b] = rune(b)
		} else {
			table[b] = next
			next++
		}
	}
	return table
}()

// byteOfLevelRune is the inverse of byteLevelRunes; ok is false for a character that
// spells no byte.
func byteOfLevelRune(r rune) (b byte, ok bool) {
	switch {
	case r < 0 || r >= 256+68:
		return 0, false
	case r >= 256:
		return byteLevelExtra[r-256], true
	case byteLevelRunes[r] == r:
		return byte(r), true
	}
	return 0, false
}

// byteLevelExtra[i] is the byte spelled by U+0100+i.
var byteLevelExtra = func() [68]byte {
	var table [68]byte
	for b, r := range byteLevelRunes {
		if r >= 256 {
			table[r-256] = byte(b)
		}
	}
	return table
}()

// byteLevelBytes converts a vocabulary token to the raw bytes it stands for; ok is false
// when some character spells no byte (such a token can never be produced from text).
func byteLevelBytes(token string) (raw string, ok bool) {
	buf := make([]byte, 0, len(token))
	for _, r := range token {
		b, ok := byteOfLevelRune(r)
		if !ok {
			return "", false
		}
		buf = append(buf, b)
	}
	return string(buf), true
}
