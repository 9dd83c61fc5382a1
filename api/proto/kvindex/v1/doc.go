// Package kvindexv1 is kvindex's public protobuf API, package kvindex.v1: the
// IndexService (Score, QueryByHash, Workers, Stats, Watch), the AdminService
// (worker registry and raft membership), the LoadService (the routers' shared
// load), the MemberService (between members only: bind-mode event frames a
// follower forwards to the leader) and the router's RouteDecision.
//
// The .proto files beside this file are the source of truth; the *.pb.go files are
// generated from them by `make proto` (buf with local protoc-gen-go and
// protoc-gen-go-grpc) and committed. Edit the .proto files, never the generated code.
//
// Field names, numbers and JSON names are public API: never rename or renumber a
// field, add new ones instead. Encode JSON with protojson and UseProtoNames set,
// so that names are the documented snake_case ones (matched_blocks, hit_rate);
// the golden files in testdata/ pin them.
//
// Concurrency: messages are plain structs, safe for concurrent reads but not for
// concurrent mutation. Generated clients are safe for concurrent use, like the
// grpc.ClientConn they wrap.
package kvindexv1
