package console

import "sync"

// Series is a bounded ring of the last N values of a time series (samples
// for a chart, entries of a timeline); the oldest are dropped.
type Series[T any] struct {
	mu   sync.Mutex
	buf  []T
	next int
	full bool
}

// NewSeries returns a Series that keeps the last n values (n >= 1).
func NewSeries[T any](n int) *Series[T] {
	return &Series[T]{buf: make([]T, max(n, 1))}
}

// Add appends v, dropping the oldest value when full.
func (s *Series[T]) Add(v T) {
	s.mu.Lock()
	s.buf[s.next] = v
	s.next = (s.next + 1) % len(s.buf)
	if s.next == 0 {
		s.full = true
	}
	s.mu.Unlock()
}

// Last returns the newest value and whether there is one.
func (s *Series[T]) Last() (T, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var zero T
	if !s.full && s.next == 0 {
		return zero, false
	}
	return s.buf[(s.next-1+len(s.buf))%len(s.buf)], true
}

// Values returns the values, oldest first (a copy).
func (s *Series[T]) Values() []T {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.full {
		return append([]T{}, s.buf[:s.next]...)
	}
	out := make([]T, 0, len(s.buf))
	out = append(out, s.buf[s.next:]...)
	return append(out, s.buf[:s.next]...)
}
