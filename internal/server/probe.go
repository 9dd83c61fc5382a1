package server

import (
	"net/http"
	"slices"
)

// probePatterns are the only routes the probe listener (--probe-addr) serves:
// liveness, readiness and metrics. Why a listener of its own: with
// --tls-client-ca the HTTP listener requires a client certificate, which the
// kubelet's HTTPS probes and most Prometheus setups do not present, and the
// CA cannot be dropped because members trust it for each other's gRPC. As
// etcd's --listen-metrics-urls, the probe listener is plain HTTP and needs no
// certificate or token; it may listen beyond loopback without the INSECURE
// warning because it serves nothing an attacker could use: no data API, no
// admin call, no dump, no console (the access test holds it to this list).
var probePatterns = []string{"GET /healthz", "GET /readyz", "GET /metrics"}

// probeRoutes are the routes of routes() whose pattern is in probePatterns,
// with the same handlers (and so the same answers) as on the HTTP listener.
func (a *API) probeRoutes() []route {
	var rs []route
	for _, rt := range a.routes() {
		if slices.Contains(probePatterns, rt.pattern) {
			rs = append(rs, rt)
		}
	}
	return rs
}

// ProbeHandler serves the probe listener: GET /healthz, /readyz and /metrics,
// a 404 for everything else.
func (a *API) ProbeHandler() http.Handler { return a.serve(a.probeRoutes()) }
