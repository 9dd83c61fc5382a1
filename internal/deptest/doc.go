// Package deptest holds no code, only a test that enforces docs/design.md's import rules:
// the data path reads in one direction (kvblock, radix → ingest → raftstore → server),
// radix and kvblock import nothing of ours and nothing outside the standard library
// but the hash they need, and light packages stay free of raft, bolt and libzmq.
package deptest
