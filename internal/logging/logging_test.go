package logging

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

func TestParseLevel(t *testing.T) {
	for _, tt := range []struct {
		in      string
		wantErr bool
	}{{"debug", false}, {"info", false}, {"warn", false}, {"error", false}, {"loud", true}, {"", true}} {
		_, err := ParseLevel(tt.in)
		if (err != nil) != tt.wantErr {
			t.Errorf("ParseLevel(%q) error = %v, want error %v", tt.in, err, tt.wantErr)
		}
		if err != nil && !strings.Contains(err.Error(), "--log-level") {
			t.Errorf("ParseLevel(%q) error %q does not name the flag", tt.in, err)
		}
	}
	if err := ValidateFormat("yaml"); err == nil || !strings.Contains(err.Error(), "--log-format") {
		t.Errorf("ValidateFormat(yaml) = %v, want an error naming --log-format", err)
	}
}

func TestNewHonoursLevelAndFormat(t *testing.T) {
	var buf bytes.Buffer
	log := New("warn", "json", &buf)
	log.Info("dropped")
	log.Warn("kept", "k", 1)
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 1 {
		t.Fatalf("got %d lines, want only the warning: %q", len(lines), buf.String())
	}
	var rec map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &rec); err != nil || rec["msg"] != "kept" {
		t.Errorf("json record = %v (%v), want msg=kept", rec, err)
	}
	buf.Reset()
	New("info", "text", &buf).Info("hello")
	if !strings.Contains(buf.String(), "msg=hello") {
		t.Errorf("text output = %q", buf.String())
	}
}
