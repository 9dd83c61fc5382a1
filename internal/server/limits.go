package server

import (
	"fmt"

	"github.com/kvindex/kvindex/internal/workerspec"
)

// MaxNameBytes bounds a model name, a LoRA name, a cache salt and a worker id
// in requests (workerspec's bound, which every worker entry point, discovery
// included, checks). Each is kept (namespace names, the registry) or hashed
// per request, so an unbounded one is memory or CPU a client could take.
const MaxNameBytes = workerspec.MaxNameBytes

// checkNames fails with ErrTooLarge naming the first field longer than
// MaxNameBytes; fields are (name, value) pairs.
func checkNames(fields ...string) error { return checkLimit(MaxNameBytes, fields) }

// MaxAddrBytes bounds a member's raft or gRPC address in a Join (host:port: a
// DNS name is at most 253 bytes); each is kept in the replicated member table.
const MaxAddrBytes = 1024

// checkAddrs is checkNames for addresses, with MaxAddrBytes.
func checkAddrs(fields ...string) error { return checkLimit(MaxAddrBytes, fields) }

func checkLimit(limit int, fields []string) error {
	for i := 0; i+1 < len(fields); i += 2 {
		if n := len(fields[i+1]); n > limit {
			return fmt.Errorf("%w: %s is %d bytes, more than the limit of %d", ErrTooLarge, fields[i], n, limit)
		}
	}
	return nil
}
