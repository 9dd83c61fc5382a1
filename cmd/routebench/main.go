// Command routebench replays request traces through every routing policy against
// a fleet of fake vLLM engines, live or offline, and reports hit rate, TTFT and
// throughput (see bench/routebench and bench/RESULTS.md).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/kvindex/kvindex/bench/routebench"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := routebench.Main(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		fmt.Fprintln(os.Stderr, "routebench:", err)
		os.Exit(1)
	}
}
