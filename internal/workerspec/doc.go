// Package workerspec owns the description of one inference engine that every kvindex
// binary shares: its id, model, block size, data-parallel ranks, event, replay and
// HTTP endpoints, disaggregation role and labels, together with the `--worker k=v,...`
// flag syntax and the `--workers-file` YAML layout that the indexer and the router
// both read.
//
// It is pure: no I/O besides LoadFile reading the file it is given, no goroutines,
// no logging, and it imports nothing of ours, so that light binaries (the router)
// can parse worker lists without pulling in the ingest stack (ZMQ). Values are plain
// data and safe for concurrent reads.
package workerspec
