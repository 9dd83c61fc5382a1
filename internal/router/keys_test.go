package router

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

var defaultKeyRules = keyRules{explicitMax: 128, systemMax: 512, documentMax: 256}

func keyInput(t *testing.T, body string, hdr ...string) (http.Header, *keyFields) {
	t.Helper()
	h := http.Header{}
	for i := 0; i+1 < len(hdr); i += 2 {
		h.Set(hdr[i], hdr[i+1])
	}
	var f keyFields
	if err := json.Unmarshal([]byte(body), &f); err != nil {
		t.Fatalf("body %s: %v", body, err)
	}
	return h, &f
}

const chatA = `"messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"hello"}]`

func TestSessionKeyPrecedence(t *testing.T) {
	convKey, _ := defaultKeyRules.sessionKey(keyInput(t, `{`+chatA+`}`))
	tests := []struct {
		name        string
		body        string
		hdr         []string
		key, source string
	}{
		{"X-Session-ID beats everything", `{"session_id":"body",` + chatA + `}`,
			[]string{"X-Session-ID", "hdr-s", "X-Conversation-ID", "hdr-c"}, "s:hdr-s", KeySourceSessionHeader},
		{"X-Conversation-ID beats the field", `{"session_id":"body",` + chatA + `}`,
			[]string{"X-Conversation-ID", "hdr-c"}, "s:hdr-c", KeySourceSessionHeader},
		{"session_id field beats the conversation", `{"session_id":"body",` + chatA + `}`, nil, "s:body", KeySourceSessionField},
		{"conversation hash last", `{` + chatA + `}`, nil, convKey, KeySourceConversation},
		{"malformed header falls through to the next header", `{}`,
			[]string{"X-Session-ID", "has space", "X-Conversation-ID", "ok-c"}, "s:ok-c", KeySourceSessionHeader},
		{"malformed header falls through to the field", `{"session_id":"body"}`,
			[]string{"X-Session-ID", strings.Repeat("x", 129)}, "s:body", KeySourceSessionField},
		{"malformed field falls through to the conversation", `{"session_id":"a+b",` + chatA + `}`, nil, convKey, KeySourceConversation},
		{"non-string field is ignored", `{"session_id":42,` + chatA + `}`, nil, convKey, KeySourceConversation},
		{"nothing: no key", `{"prompt":"x"}`, nil, "", KeySourceNone},
	}
	if !strings.HasPrefix(convKey, "c:") {
		t.Fatalf("conversation key %q", convKey)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, f := keyInput(t, tt.body, tt.hdr...)
			key, src := defaultKeyRules.sessionKey(h, f)
			if key != tt.key || src != tt.source {
				t.Fatalf("got (%q, %s), want (%q, %s)", key, src, tt.key, tt.source)
			}
		})
	}
}

// Later turns of a conversation repeat its first messages, so they keep the key;
// another opening gives another key.
func TestSessionConversationHashCoversTheFirstMessagesOnly(t *testing.T) {
	k := func(body string) string {
		key, _ := defaultKeyRules.sessionKey(keyInput(t, body))
		return key
	}
	first := k(`{` + chatA + `}`)
	later := k(`{"messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"hello"},` +
		`{"role":"assistant","content":"hi"},{"role":"user","content":"more please"}]}`)
	other := k(`{"messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"goodbye"}]}`)
	otherSys := k(`{"messages":[{"role":"system","content":"You are verbose."},{"role":"user","content":"hello"}]}`)
	if first != later {
		t.Errorf("a later turn of the conversation got key %q, the first turn %q", later, first)
	}
	if other == first || otherSys == first {
		t.Errorf("different openings share the key %q", first)
	}
}

func TestPrefixKeyPrecedence(t *testing.T) {
	canon := defaultKeyRules.canonical(func() *keyFields { _, f := keyInput(t, `{`+chatA+`}`); return f }(), testModel)
	tests := []struct {
		name        string
		body        string
		hdr         []string
		key, source string
	}{
		{"X-Cache-Key first", `{"cache_key":"f","cacheKey":"c","prefix":"p",` + chatA + `}`,
			[]string{"X-Cache-Key", "h1", "X-Flexinfer-Cache-Key", "h2", "X-Session-ID", "s"}, "k:h1", KeySourceExplicitHdr},
		{"X-Flexinfer-Cache-Key", `{"cache_key":"f",` + chatA + `}`, []string{"X-Flexinfer-Cache-Key", "h2"}, "k:h2", KeySourceExplicitHdr},
		{"cache_key field", `{"cache_key":"f","cacheKey":"c","prefix":"p",` + chatA + `}`, nil, "k:f", KeySourceExplicitField},
		{"cacheKey field", `{"cacheKey":"c","prefix":"p",` + chatA + `}`, nil, "k:c", KeySourceExplicitField},
		{"prefix field", `{"prefix":"p",` + chatA + `}`, []string{"X-Session-ID", "s"}, "k:p", KeySourcePrefixField},
		{"canonical context beats the session", `{` + chatA + `}`, []string{"X-Session-ID", "s"}, canon, KeySourceCanonical},
		{"session when there is no context", `{"messages":[{"role":"user","content":"hi"}]}`, []string{"X-Session-ID", "s"}, "s:s", KeySourceSessionHeader},
		{"malformed header falls through", `{"cache_key":"f"}`, []string{"X-Cache-Key", "tenant a/doc"}, "k:f", KeySourceExplicitField},
		{"malformed field falls through", `{"cache_key":"tenant,a","cacheKey":"c"}`, nil, "k:c", KeySourceExplicitField},
		{"every malformed explicit key falls through to canonical", `{"cache_key":"x y","prefix":"p q",` + chatA + `}`,
			[]string{"X-Cache-Key", "a b"}, canon, KeySourceCanonical},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, f := keyInput(t, tt.body, tt.hdr...)
			key, src := defaultKeyRules.prefixKey(h, f, testModel)
			if key != tt.key || src != tt.source {
				t.Fatalf("got (%q, %s), want (%q, %s)", key, src, tt.key, tt.source)
			}
		})
	}
}

func TestExplicitKeyValidation(t *testing.T) {
	r := keyRules{explicitMax: 16, systemMax: 512, documentMax: 256}
	tests := []struct {
		key string
		ok  bool
	}{
		{"tenant-a/doc-42", true},
		{"AZaz09._:/=-", true},
		{strings.Repeat("k", 16), true},
		{strings.Repeat("k", 17), false},
		{"", false},
		{"a b", false},
		{"a+b", false},
		{"a,b", false},
		{"a\tb", false},
		{"ümlaut", false},
		{"a*b", false},
		{"a\"b", false},
	}
	for _, tt := range tests {
		if got := r.validExplicitKey(tt.key); got != tt.ok {
			t.Errorf("validExplicitKey(%q) = %v, want %v", tt.key, got, tt.ok)
		}
	}
	// The bound is the configured one: a 17-character header key is ignored.
	h, f := keyInput(t, `{"cache_key":"short"}`, "X-Cache-Key", strings.Repeat("k", 17))
	if key, _ := r.prefixKey(h, f, testModel); key != "k:short" {
		t.Fatalf("an over-long header key was not ignored: %q", key)
	}
}

// The same system prompt (and document) with different user turns gives the same
// prefix key; the key depends on the model, the system prompt (whitespace
// normalized) and the document, from whichever field carries it.
func TestCanonicalPrefixKey(t *testing.T) {
	key := func(r keyRules, body, model string) string {
		_, f := keyInput(t, body)
		return r.canonical(f, model)
	}
	sys := func(s, user string) string {
		return `{"messages":[{"role":"system","content":` + quote(s) + `},{"role":"user","content":` + quote(user) + `}]}`
	}
	r := defaultKeyRules
	a := key(r, sys("You are an expert Python developer.", "How do I use decorators?"), testModel)
	if a == "" || !strings.HasPrefix(a, "p:") {
		t.Fatalf("canonical key %q", a)
	}
	for name, got := range map[string]string{
		"other user turn":       key(r, sys("You are an expert Python developer.", "Explain async/await"), testModel),
		"whitespace normalized": key(r, sys("  You are an   expert\nPython developer. ", "x"), testModel),
	} {
		if got != a {
			t.Errorf("%s: key %q, want %q", name, got, a)
		}
	}
	for name, got := range map[string]string{
		"other system prompt": key(r, sys("You are an expert Go developer.", "How do I use decorators?"), testModel),
		"other model":         key(r, sys("You are an expert Python developer.", "How do I use decorators?"), "other/model"),
	} {
		if got == a {
			t.Errorf("%s: same key %q", name, got)
		}
	}

	doc := map[string]string{
		"document_context":  `{"document_context":"The doc.","messages":[{"role":"user","content":"q1"}]}`,
		"documentContext":   `{"documentContext":"The doc.","messages":[{"role":"user","content":"q2"}]}`,
		"context":           `{"context":"The   doc.","messages":[{"role":"user","content":"q3"}]}`,
		"documents string":  `{"documents":["The doc.","other"]}`,
		"documents text":    `{"documents":[{"text":"The doc."}]}`,
		"documents content": `{"documents":[{"content":"The doc."}]}`,
	}
	want := key(r, doc["document_context"], testModel)
	for name, body := range doc {
		if got := key(r, body, testModel); got != want || got == "" {
			t.Errorf("document from %s: key %q, want %q", name, got, want)
		}
	}
	if key(r, `{"documents":[{"text":"Another doc."}]}`, testModel) == want {
		t.Error("another document gives the same key")
	}
	if got := key(r, `{"messages":[{"role":"user","content":"only a user"}]}`, testModel); got != "" {
		t.Errorf("no system prompt and no document: key %q, want none", got)
	}
}

// Segments are cut to their configured lengths (in characters): texts that differ
// only past the bound share the key, texts that differ within it do not.
func TestCanonicalSegmentsAreTruncated(t *testing.T) {
	r := keyRules{explicitMax: 128, systemMax: 10, documentMax: 8}
	key := func(body string) string {
		_, f := keyInput(t, body)
		return r.canonical(f, testModel)
	}
	sys := func(s string) string { return `{"messages":[{"role":"system","content":` + quote(s) + `}]}` }
	if key(sys("0123456789 tail one")) != key(sys("0123456789 tail two")) {
		t.Error("system prompts equal in their first 10 characters got different keys")
	}
	if key(sys("012345678X tail")) == key(sys("0123456789 tail")) {
		t.Error("system prompts differing within 10 characters got the same key")
	}
	// Runes, not bytes: ten 2-byte characters are kept whole.
	if key(sys(strings.Repeat("é", 10)+"a")) != key(sys(strings.Repeat("é", 10)+"b")) {
		t.Error("system prompt of multi-byte characters truncated by bytes, not characters")
	}
	docBody := func(d string) string { return `{"document_context":` + quote(d) + `}` }
	if key(docBody("abcdefgh-one")) != key(docBody("abcdefgh-two")) {
		t.Error("documents equal in their first 8 characters got different keys")
	}
	if key(docBody("abcdefgX")) == key(docBody("abcdefgh")) {
		t.Error("documents differing within 8 characters got the same key")
	}
	if got := truncate("héllo", 2); got != "hé" {
		t.Errorf("truncate(héllo, 2) = %q, want hé", got)
	}
}
