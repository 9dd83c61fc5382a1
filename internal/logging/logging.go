// Package logging builds the *slog.Logger every kvindex binary injects into its
// components from the two flags they all share, --log-level and --log-format. It
// holds no state and no global logger; it is safe for concurrent use.
package logging

import (
	"fmt"
	"io"
	"log/slog"
)

// ParseLevel parses a --log-level value: debug, info, warn or error.
func ParseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return 0, fmt.Errorf("--log-level=%q must be debug, info, warn or error", s)
	}
	return l, nil
}

// ValidateFormat checks a --log-format value: text or json.
func ValidateFormat(s string) error {
	if s != "text" && s != "json" {
		return fmt.Errorf("--log-format=%q must be text or json", s)
	}
	return nil
}

// New returns a logger writing to w at level (see ParseLevel; an invalid level means
// info) in format ("json", anything else is text). Validate both first.
func New(level, format string, w io.Writer) *slog.Logger {
	l, err := ParseLevel(level)
	if err != nil {
		l = slog.LevelInfo
	}
	opts := &slog.HandlerOptions{Level: l}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}
