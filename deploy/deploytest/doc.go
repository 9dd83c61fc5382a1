// Package deploytest holds no code, only tests of deploy/: the Helm chart is
// rendered with Helm's Go library for several value sets and every object is
// decoded strictly with k8s.io/api types, the rendered flags are run through the
// binaries' own parsers; the Grafana dashboard's and the alert rules' metric
// names are checked against the /metrics of an in-process indexer and router;
// the rules and the panel queries go through promtool, and the cluster alerts
// through promtool's unit tests (deploy/prometheus/kvindex-alerts_test.yaml).
// The Dockerfiles are read statically (no Docker engine runs here): stages,
// non-root numeric USER, ENTRYPOINT against COPY --from=build, the go build
// package and cgo setting, EXPOSE against the ports the binaries' own
// parsers derive from DefaultConfig() and the image's CMD; compose.yaml's
// commands go through the binaries' parsers and the services' cross
// references (indexer gRPC, engine event/replay/HTTP ports) must agree.
// scripts/image-smoke.sh (make test-images) runs the runtime stages. Tests start their own servers on loopback and
// share nothing, so they may run in parallel with other packages.
package deploytest
