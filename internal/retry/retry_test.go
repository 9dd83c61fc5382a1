package retry

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestCeilingDoublesUpToMax(t *testing.T) {
	b := Backoff{Initial: 10 * time.Millisecond, Max: 100 * time.Millisecond}
	want := []time.Duration{10, 20, 40, 80, 100, 100}
	for n, w := range want {
		if got := b.Ceiling(n); got != w*time.Millisecond {
			t.Errorf("Ceiling(%d) = %v, want %v", n, got, w*time.Millisecond)
		}
	}
	if got := b.Ceiling(1000); got != b.Max {
		t.Errorf("Ceiling(1000) = %v, want Max (no overflow)", got)
	}
}

func TestDelayIsJitteredWithinHalfAndCeiling(t *testing.T) {
	b := Default
	for n := range 8 {
		c := b.Ceiling(n)
		seen := map[time.Duration]bool{}
		for range 200 {
			d := b.Delay(n)
			if d < c/2 || d > c {
				t.Fatalf("Delay(%d) = %v, want within [%v, %v]", n, d, c/2, c)
			}
			seen[d] = true
		}
		if len(seen) < 10 {
			t.Errorf("Delay(%d) took only %d values in 200 draws: no jitter", n, len(seen))
		}
	}
}

func TestWaitEndsWithTheContext(t *testing.T) {
	b := Backoff{Initial: time.Hour, Max: time.Hour}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := b.Wait(ctx, 0); !errors.Is(err, context.Canceled) {
		t.Errorf("Wait on a canceled context = %v, want context.Canceled", err)
	}
	ctx, cancel = context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := b.Wait(ctx, 0); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Wait longer than the deadline = %v, want DeadlineExceeded at once", err)
	}
	if err := (Backoff{Initial: time.Millisecond, Max: time.Millisecond}).Wait(context.Background(), 3); err != nil {
		t.Errorf("Wait = %v", err)
	}
}

func TestValidateNamesTheBadValue(t *testing.T) {
	cases := []struct {
		b    Backoff
		want string
	}{
		{Backoff{Initial: 0, Max: time.Second}, "Initial=0s"},
		{Backoff{Initial: time.Second, Max: time.Millisecond}, "Max=1ms"},
		{Default, ""},
	}
	for _, c := range cases {
		err := c.b.Validate()
		if (err == nil) != (c.want == "") || (err != nil && !strings.Contains(err.Error(), c.want)) {
			t.Errorf("Validate(%+v) = %v, want mention of %q", c.b, err, c.want)
		}
	}
}
