package raftstore

import (
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"sync/atomic"

	"github.com/hashicorp/go-hclog"
)

// slogLevelTrace is where hclog's Trace lands in slog, below Debug.
const slogLevelTrace = slog.LevelDebug - 4

// hclogAdapter is an hclog.Logger writing to a *slog.Logger, so raft's own logs go
// where the rest of the process logs. The sub-logger name becomes a "component"
// attribute; levels map one to one (Trace below slog's Debug).
type hclogAdapter struct {
	base    *slog.Logger // with the implied args, without the component
	log     *slog.Logger // base with the component
	name    string
	implied []any
	level   *atomic.Int32 // minimum hclog.Level, shared by the loggers derived from one root
}

var _ hclog.Logger = (*hclogAdapter)(nil)

// newHCLogger returns an hclog.Logger that writes to l under component name.
func newHCLogger(l *slog.Logger, name string) hclog.Logger {
	lvl := new(atomic.Int32)
	lvl.Store(int32(hclog.Trace))
	return &hclogAdapter{base: l, log: l.With("component", name), name: name, level: lvl}
}

func toSlogLevel(l hclog.Level) slog.Level {
	switch l {
	case hclog.Trace:
		return slogLevelTrace
	case hclog.Debug:
		return slog.LevelDebug
	case hclog.Warn:
		return slog.LevelWarn
	case hclog.Error:
		return slog.LevelError
	}
	return slog.LevelInfo
}

func (a *hclogAdapter) enabled(l hclog.Level) bool {
	return l >= hclog.Level(a.level.Load()) && a.log.Enabled(context.Background(), toSlogLevel(l))
}

func (a *hclogAdapter) Log(level hclog.Level, msg string, args ...any) {
	if level == hclog.Off || !a.enabled(level) {
		return
	}
	a.log.Log(context.Background(), toSlogLevel(level), msg, formatArgs(args)...)
}

// formatArgs renders the values raft wraps for hclog to format (hclog.Fmt),
// which slog would otherwise print verbatim ("[%+v ...]"). It never writes into
// the caller's slice.
func formatArgs(args []any) []any {
	copied := false
	for i, v := range args {
		f, ok := v.(hclog.Format)
		if !ok || len(f) == 0 {
			continue
		}
		format, isString := f[0].(string)
		if !isString {
			continue
		}
		if !copied {
			args, copied = append([]any(nil), args...), true
		}
		args[i] = fmt.Sprintf(format, f[1:]...)
	}
	return args
}

func (a *hclogAdapter) Trace(msg string, args ...any) { a.Log(hclog.Trace, msg, args...) }
func (a *hclogAdapter) Debug(msg string, args ...any) { a.Log(hclog.Debug, msg, args...) }
func (a *hclogAdapter) Info(msg string, args ...any)  { a.Log(hclog.Info, msg, args...) }
func (a *hclogAdapter) Warn(msg string, args ...any)  { a.Log(hclog.Warn, msg, args...) }
func (a *hclogAdapter) Error(msg string, args ...any) { a.Log(hclog.Error, msg, args...) }

func (a *hclogAdapter) IsTrace() bool { return a.enabled(hclog.Trace) }
func (a *hclogAdapter) IsDebug() bool { return a.enabled(hclog.Debug) }
func (a *hclogAdapter) IsInfo() bool  { return a.enabled(hclog.Info) }
func (a *hclogAdapter) IsWarn() bool  { return a.enabled(hclog.Warn) }
func (a *hclogAdapter) IsError() bool { return a.enabled(hclog.Error) }

func (a *hclogAdapter) ImpliedArgs() []any { return a.implied }

func (a *hclogAdapter) With(args ...any) hclog.Logger {
	c := *a
	c.base = a.base.With(args...)
	c.log = c.base.With("component", c.name)
	c.implied = append(append([]any(nil), a.implied...), args...)
	return &c
}

func (a *hclogAdapter) Name() string { return a.name }

func (a *hclogAdapter) Named(name string) hclog.Logger {
	if a.name != "" {
		name = a.name + "." + name
	}
	return a.ResetNamed(name)
}

func (a *hclogAdapter) ResetNamed(name string) hclog.Logger {
	c := *a
	c.name = name
	c.log = a.base.With("component", name)
	return &c
}

func (a *hclogAdapter) SetLevel(level hclog.Level) { a.level.Store(int32(level)) }
func (a *hclogAdapter) GetLevel() hclog.Level      { return hclog.Level(a.level.Load()) }

func (a *hclogAdapter) StandardLogger(opts *hclog.StandardLoggerOptions) *log.Logger {
	level := slog.LevelInfo
	if opts != nil && opts.ForceLevel != hclog.NoLevel {
		level = toSlogLevel(opts.ForceLevel)
	}
	return slog.NewLogLogger(a.log.Handler(), level)
}

func (a *hclogAdapter) StandardWriter(opts *hclog.StandardLoggerOptions) io.Writer {
	return a.StandardLogger(opts).Writer()
}
