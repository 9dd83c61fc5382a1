package router

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"

	"github.com/zeebo/xxh3"

	"github.com/kvindex/kvindex/internal/tokenize"
)

// Where a session or prefix key came from (the key_source of decisions, seeds/002).
const (
	KeySourceSessionHeader = "session-header"
	KeySourceSessionField  = "session-field"
	KeySourceConversation  = "conversation-hash"
	KeySourceExplicitHdr   = "explicit-header"
	KeySourceExplicitField = "explicit-field"
	KeySourcePrefixField   = "prefix-field"
	KeySourceCanonical     = "canonical"
	KeySourceNone          = "none"
)

// keyFields are the body fields the session and prefix-hash policies read.
type keyFields struct {
	keyExtras
	Messages []tokenize.Message
}

// keyExtras are the key fields besides the messages, decoded together with the
// request itself (one pass over the body).
type keyExtras struct {
	SessionID       json.RawMessage   `json:"session_id"`
	CacheKey        json.RawMessage   `json:"cache_key"`
	CacheKeyCamel   json.RawMessage   `json:"cacheKey"`
	Prefix          json.RawMessage   `json:"prefix"`
	DocumentContext json.RawMessage   `json:"document_context"`
	DocumentCamel   json.RawMessage   `json:"documentContext"`
	Context         json.RawMessage   `json:"context"`
	Documents       []json.RawMessage `json:"documents"`
}

// keyRules are the validation bounds of explicit keys and canonical segments.
type keyRules struct {
	explicitMax, systemMax, documentMax int
}

// validExplicitKey: at most max characters of A-Z a-z 0-9 . _ : / = -
// (seeds/002); anything else is ignored and the next source is tried.
func (k keyRules) validExplicitKey(s string) bool {
	if s == "" || len(s) > k.explicitMax {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("._:/=-", c) >= 0) {
			return false
		}
	}
	return true
}

func jsonString(raw json.RawMessage) string {
	var s string
	if len(raw) == 0 || json.Unmarshal(raw, &s) != nil {
		return ""
	}
	return s
}

// sessionKey: X-Session-ID, X-Conversation-ID, the session_id field, else a hash
// of the conversation's first messages (system + first user turn), which every
// later turn of the conversation repeats.
func (k keyRules) sessionKey(h http.Header, f *keyFields) (key, source string) {
	for _, name := range []string{"X-Session-ID", "X-Conversation-ID"} {
		if v := strings.TrimSpace(h.Get(name)); k.validExplicitKey(v) {
			return "s:" + v, KeySourceSessionHeader
		}
	}
	if v := strings.TrimSpace(jsonString(f.SessionID)); k.validExplicitKey(v) {
		return "s:" + v, KeySourceSessionField
	}
	if len(f.Messages) == 0 {
		return "", KeySourceNone
	}
	var b strings.Builder
	for _, m := range f.Messages {
		b.WriteString(m.Role)
		b.WriteByte(0)
		b.WriteString(m.Content)
		b.WriteByte(0)
		if m.Role == "user" {
			break
		}
	}
	return "c:" + strconv.FormatUint(xxh3.HashString(b.String()), 16), KeySourceConversation
}

// prefixKey follows seeds/002's precedence: X-Cache-Key (or X-Flexinfer-Cache-Key),
// cache_key / cacheKey, prefix, then the canonical context (model, system
// messages, document context), then the session key.
func (k keyRules) prefixKey(h http.Header, f *keyFields, model string) (key, source string) {
	for _, name := range []string{"X-Cache-Key", "X-Flexinfer-Cache-Key"} {
		if v := strings.TrimSpace(h.Get(name)); k.validExplicitKey(v) {
			return "k:" + v, KeySourceExplicitHdr
		}
	}
	for _, raw := range []json.RawMessage{f.CacheKey, f.CacheKeyCamel} {
		if v := strings.TrimSpace(jsonString(raw)); k.validExplicitKey(v) {
			return "k:" + v, KeySourceExplicitField
		}
	}
	if v := strings.TrimSpace(jsonString(f.Prefix)); k.validExplicitKey(v) {
		return "k:" + v, KeySourcePrefixField
	}
	if c := k.canonical(f, model); c != "" {
		return c, KeySourceCanonical
	}
	return k.sessionKey(h, f)
}

// canonical is the hash of model, the normalized system messages (at most
// systemMax characters) and the document context (at most documentMax); "" when
// the request has neither.
func (k keyRules) canonical(f *keyFields, model string) string {
	var sys strings.Builder
	for _, m := range f.Messages {
		if m.Role == "system" {
			if sys.Len() > 0 {
				sys.WriteByte('\n')
			}
			sys.WriteString(strings.Join(strings.Fields(m.Content), " "))
		}
	}
	doc := ""
	for _, raw := range []json.RawMessage{f.DocumentContext, f.DocumentCamel, f.Context} {
		if doc = jsonString(raw); doc != "" {
			break
		}
	}
	if doc == "" && len(f.Documents) > 0 {
		doc = jsonString(f.Documents[0])
		if doc == "" {
			var d struct {
				Text    string `json:"text"`
				Content string `json:"content"`
			}
			if json.Unmarshal(f.Documents[0], &d) == nil {
				doc = cmpOr(d.Text, d.Content)
			}
		}
	}
	s, d := truncate(sys.String(), k.systemMax), truncate(strings.Join(strings.Fields(doc), " "), k.documentMax)
	if s == "" && d == "" {
		return ""
	}
	return "p:" + strconv.FormatUint(xxh3.HashString(model+"\x00"+s+"\x00"+d), 16)
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// truncate cuts s to at most n runes.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	i := 0
	for pos := range s {
		if i == n {
			return s[:pos]
		}
		i++
	}
	return s
}
