// Package cputime reads the CPU time this process (Process) or another one (Of)
// has used, for benchmarks that report CPU per unit of work next to wall-clock
// figures: on a shared machine the CPU a piece of work costs varies far less
// than how long it takes.
// It is safe for concurrent use.
package cputime

import (
	"syscall"
	"time"
)

// Process returns the user plus system CPU time of the whole process (every
// thread), or 0 if the kernel cannot say.
func Process() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
