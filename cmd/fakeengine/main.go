// Command fakeengine runs one or more simulated vLLM engines that serve the OpenAI
// API and publish real KV cache events over ZMQ. See package bench/fakeengine and
// `fakeengine --help`.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/kvindex/kvindex/bench/fakeengine"
	"github.com/kvindex/kvindex/internal/logging"
)

func main() {
	cfg, err := fakeengine.ParseFlags(os.Args[1:], os.Stderr, nil)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := fakeengine.Run(ctx, cfg, logging.New(cfg.LogLevel, cfg.LogFormat, os.Stderr)); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
