// Package deploytest holds no code, only tests of deploy/: the Helm chart is
// rendered with Helm's Go library for several value sets and every object is
// decoded strictly with k8s.io/api types, the rendered flags are run through the
// binaries' own parsers; the Grafana dashboard's and the alert rules' metric
// names are checked against the /metrics of an in-process indexer and router;
// the rules and the panel queries go through promtool, and the cluster alerts
// through promtool's unit tests (deploy/prometheus/kvindex-alerts_test.yaml). Tests start their own servers on loopback and
// share nothing, so they may run in parallel with other packages.
package deploytest
