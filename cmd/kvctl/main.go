// Command kvctl is the command-line client of a kvindex cluster: it scores
// prompts, lists workers, shows the cluster, dumps the index and registers or
// unregisters workers over gRPC. `kvctl --help` lists the commands; every flag
// can also be set by a KVINDEX_KVCTL_* environment variable (--addr:
// KVINDEX_KVCTL_ADDR).
package main

import (
	"context"
	"maps"
	"os"
	"os/signal"
	"slices"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr, os.LookupEnv)
	stop()
	os.Exit(code)
}

func sortedKeys[V any](m map[string]V) []string {
	return slices.Sorted(maps.Keys(m))
}
