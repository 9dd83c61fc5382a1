package deploytest

import (
	"fmt"
	"io"
	"net"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	"github.com/kvindex/kvindex/internal/router"
	"github.com/kvindex/kvindex/internal/server"
)

const namespace = "llm"

// rendered is a chart rendering decoded into k8s.io/api types.
type rendered struct {
	statefulSets map[string]*appsv1.StatefulSet
	deployments  map[string]*appsv1.Deployment
	services     map[string]*corev1.Service
	pdbs         []*policyv1.PodDisruptionBudget
	hpas         []*autoscalingv2.HorizontalPodAutoscaler
	roles        []*rbacv1.Role
	bindings     []*rbacv1.RoleBinding
	accounts     []*corev1.ServiceAccount
	configMaps   []*corev1.ConfigMap
	netpols      []*networkingv1.NetworkPolicy
	custom       map[string][]map[string]any // kind -> objects (CRDs: not in k8s.io/api)
}

// render renders the chart with values (YAML, merged over values.yaml) and
// decodes every object strictly: a field k8s.io/api does not know fails.
func render(t *testing.T, values string) (*rendered, error) {
	t.Helper()
	ch, err := loader.Load(filepath.Join("..", "helm", "kvindex"))
	if err != nil {
		t.Fatal(err)
	}
	var vals map[string]any
	if err := yaml.Unmarshal([]byte(values), &vals); err != nil {
		t.Fatal(err)
	}
	rv, err := chartutil.ToRenderValues(ch, vals, chartutil.ReleaseOptions{Name: "kv", Namespace: namespace, IsInstall: true}, chartutil.DefaultCapabilities)
	if err != nil {
		t.Fatal(err)
	}
	files, err := engine.Render(ch, rv)
	if err != nil {
		return nil, err
	}
	r := &rendered{statefulSets: map[string]*appsv1.StatefulSet{}, deployments: map[string]*appsv1.Deployment{},
		services: map[string]*corev1.Service{}, custom: map[string][]map[string]any{}}
	names := slices.Sorted(func(yield func(string) bool) {
		for k := range files {
			if !yield(k) {
				return
			}
		}
	})
	for _, name := range names {
		if filepath.Ext(name) != ".yaml" {
			continue
		}
		for i, doc := range strings.Split(files[name], "\n---") {
			if strings.TrimSpace(strings.ReplaceAll(doc, "---", "")) == "" {
				continue
			}
			var meta struct{ APIVersion, Kind string }
			if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
				t.Fatalf("%s #%d: %v\n%s", name, i, err, doc)
			}
			var obj any
			switch meta.Kind {
			case "StatefulSet":
				o := &appsv1.StatefulSet{}
				obj, r.statefulSets[""] = o, o
			case "Deployment":
				o := &appsv1.Deployment{}
				obj = o
				defer func() { r.deployments[o.Name] = o }()
			case "Service":
				o := &corev1.Service{}
				obj = o
				defer func() { r.services[o.Name] = o }()
			case "PodDisruptionBudget":
				o := &policyv1.PodDisruptionBudget{}
				obj, r.pdbs = o, append(r.pdbs, o)
			case "HorizontalPodAutoscaler":
				o := &autoscalingv2.HorizontalPodAutoscaler{}
				obj, r.hpas = o, append(r.hpas, o)
			case "Role":
				o := &rbacv1.Role{}
				obj, r.roles = o, append(r.roles, o)
			case "RoleBinding":
				o := &rbacv1.RoleBinding{}
				obj, r.bindings = o, append(r.bindings, o)
			case "ServiceAccount":
				o := &corev1.ServiceAccount{}
				obj, r.accounts = o, append(r.accounts, o)
			case "ConfigMap":
				o := &corev1.ConfigMap{}
				obj, r.configMaps = o, append(r.configMaps, o)
			case "NetworkPolicy":
				o := &networkingv1.NetworkPolicy{}
				obj, r.netpols = o, append(r.netpols, o)
			case "ServiceMonitor", "InferencePool":
				m := map[string]any{}
				obj = &m
				defer func() { r.custom[meta.Kind] = append(r.custom[meta.Kind], m) }()
			default:
				t.Fatalf("%s: kind %q has no decoding in this test", name, meta.Kind)
			}
			if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
				t.Fatalf("%s #%d (%s): strict decode: %v\n%s", name, i, meta.Kind, err, doc)
			}
		}
	}
	// The statefulset was keyed "" while decoding; key it by name.
	if s := r.statefulSets[""]; s != nil {
		delete(r.statefulSets, "")
		r.statefulSets[s.Name] = s
	}
	return r, nil
}

// expand substitutes Kubernetes' $(VAR) references as the kubelet does.
func expand(args []string, env map[string]string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		for k, v := range env {
			a = strings.ReplaceAll(a, "$("+k+")", v)
		}
		out[i] = a
	}
	return out
}

func containerPort(t *testing.T, c corev1.Container, name string) int32 {
	t.Helper()
	for _, p := range c.Ports {
		if p.Name == name {
			return p.ContainerPort
		}
	}
	t.Fatalf("container %s has no port %q", c.Name, name)
	return 0
}

func portOf(t *testing.T, addr string) int32 {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		t.Fatal(err)
	}
	return int32(n)
}

// secretEnv is container c's environment as a lookup, a variable taken from a
// Secret's key reading "secret:<name>/<key>".
func secretEnv(c corev1.Container) func(string) (string, bool) {
	var kv []string
	for _, e := range c.Env {
		if ref := e.ValueFrom; ref != nil && ref.SecretKeyRef != nil {
			kv = append(kv, e.Name, "secret:"+ref.SecretKeyRef.Name+"/"+ref.SecretKeyRef.Key)
		} else if ref == nil {
			kv = append(kv, e.Name, e.Value)
		}
	}
	return env(kv...)
}

// adminSecret is the Secret the indexer StatefulSet s takes its admin token
// from ("": none).
func adminSecret(s *appsv1.StatefulSet) string {
	for _, e := range s.Spec.Template.Spec.Containers[0].Env {
		if e.Name == "KVINDEX_ADMIN_TOKEN" && e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			return e.ValueFrom.SecretKeyRef.Name
		}
	}
	return ""
}

// referencesSecret reports whether pod reads Secret name in any way: a
// variable of any container, a whole envFrom, or a volume.
func referencesSecret(pod corev1.PodSpec, name string) bool {
	for _, c := range slices.Concat(pod.InitContainers, pod.Containers) {
		for _, e := range c.Env {
			if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil && e.ValueFrom.SecretKeyRef.Name == name {
				return true
			}
		}
		for _, e := range c.EnvFrom {
			if e.SecretRef != nil && e.SecretRef.Name == name {
				return true
			}
		}
	}
	for _, v := range pod.Volumes {
		if v.Secret != nil && v.Secret.SecretName == name {
			return true
		}
		if v.Projected != nil && slices.ContainsFunc(v.Projected.Sources, func(p corev1.VolumeProjection) bool {
			return p.Secret != nil && p.Secret.Name == name
		}) {
			return true
		}
	}
	return false
}

func env(kv ...string) func(string) (string, bool) {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

// watchesPods reports whether ServiceAccount sa is bound, by a RoleBinding in
// the release namespace, to a Role that may get, list and watch pods.
func watchesPods(r *rendered, sa string) bool {
	for _, b := range r.bindings {
		if b.Namespace != "" && b.Namespace != namespace || b.RoleRef.Kind != "Role" ||
			!slices.ContainsFunc(b.Subjects, func(s rbacv1.Subject) bool {
				return s.Kind == "ServiceAccount" && s.Name == sa && s.Namespace == namespace
			}) {
			continue
		}
		for _, role := range r.roles {
			if role.Name != b.RoleRef.Name {
				continue
			}
			for _, rule := range role.Rules {
				if slices.Contains(rule.APIGroups, "") && slices.Contains(rule.Resources, "pods") &&
					slices.Contains(rule.Verbs, "get") && slices.Contains(rule.Verbs, "list") && slices.Contains(rule.Verbs, "watch") {
					return true
				}
			}
		}
	}
	return false
}

// checkIndexer: the StatefulSet's flags parse with the indexer's own parser,
// its ports and probes agree with them, and the PDB keeps a majority. With
// selector (Kubernetes discovery on), the indexer watches those pods in the
// release namespace and its ServiceAccount may; without, it has no token.
func checkIndexer(t *testing.T, r *rendered, replicas int, selector string) {
	s := r.statefulSets["kv-indexer"]
	if s == nil {
		t.Fatal("no indexer StatefulSet")
	}
	if *s.Spec.Replicas != int32(replicas) {
		t.Errorf("indexer replicas %d, want %d", *s.Spec.Replicas, replicas)
	}
	// After a full outage pod 0 alone cannot elect a leader and stays unready:
	// an OrderedReady set would never start the others (docs/deploy.md).
	if s.Spec.PodManagementPolicy != appsv1.ParallelPodManagement {
		t.Errorf("indexer podManagementPolicy %q, want Parallel", s.Spec.PodManagementPolicy)
	}
	if len(s.Spec.VolumeClaimTemplates) != 1 {
		t.Error("indexer: want one PVC template (data dir per pod)")
	}
	hl := r.services[s.Spec.ServiceName]
	if hl == nil || hl.Spec.ClusterIP != "None" || !hl.Spec.PublishNotReadyAddresses {
		t.Errorf("serviceName %q must be a headless Service publishing not-ready pods", s.Spec.ServiceName)
	}
	c := s.Spec.Template.Spec.Containers[0]
	script := strings.Join(c.Command, " ")
	if !strings.Contains(script, "--join=kv-indexer."+namespace+".svc:7070") || !strings.Contains(script, `"${POD_NAME##*-}" != "0"`) {
		t.Errorf("indexer command %q: pods other than 0 must --join through the indexer Service", script)
	}
	// Pod 0 asks the others, by the names they advertise, before it starts a
	// cluster (a lost volume must not make it start a second one).
	bootstrapPeers := regexp.MustCompile(`else set -- "\$@" (--bootstrap-peers=[^;' ]+);`).FindStringSubmatch(script)
	if bootstrapPeers == nil {
		t.Fatalf("indexer command %q: pod 0 must get --bootstrap-peers", script)
	}
	var advertised []string // --grpc-advertise of pods 1..replicas-1
	for i := 1; i < replicas; i++ {
		args := expand(c.Args, map[string]string{"POD_NAME": fmt.Sprintf("kv-indexer-%d", i), "POD_NAMESPACE": namespace})
		cfg, err := server.ParseFlags(append(args, "--join=kv-indexer."+namespace+".svc:7070"), io.Discard, env("KVINDEX_ADMIN_TOKEN", "secret"))
		if err != nil {
			t.Fatalf("kv-indexer-%d: the indexer refuses the chart's flags %q: %v", i, args, err)
		}
		advertised = append(advertised, cfg.GRPCAdvertise)
	}
	for _, pod := range []string{"kv-indexer-0", "kv-indexer-1"} {
		args := expand(c.Args, map[string]string{"POD_NAME": pod, "POD_NAMESPACE": namespace})
		if pod != "kv-indexer-0" {
			args = append(args, "--join=kv-indexer."+namespace+".svc:7070")
		} else {
			args = append(args, bootstrapPeers[1])
		}
		cfg, err := server.ParseFlags(args, io.Discard, env("KVINDEX_ADMIN_TOKEN", "secret"))
		if err != nil {
			t.Fatalf("%s: the indexer refuses the chart's flags %q: %v", pod, args, err)
		}
		if cfg.NodeID != pod {
			t.Errorf("--node-id %q, want the pod name %q", cfg.NodeID, pod)
		}
		if pod == "kv-indexer-0" && !slices.Equal(cfg.BootstrapPeers, advertised) {
			t.Errorf("kv-indexer-0 --bootstrap-peers %q, want the other pods' --grpc-advertise %q", cfg.BootstrapPeers, advertised)
		}
		if got, want := portOf(t, cfg.HTTPAddr), containerPort(t, c, "http"); got != want {
			t.Errorf("--http-addr port %d, container port http %d", got, want)
		}
		if got, want := portOf(t, cfg.GRPCAddr), containerPort(t, c, "grpc"); got != want {
			t.Errorf("--grpc-addr port %d, container port grpc %d", got, want)
		}
		if got, want := portOf(t, cfg.Raft.RaftAddr), containerPort(t, c, "raft"); got != want {
			t.Errorf("--raft-addr port %d, container port raft %d", got, want)
		}
		// Peers reach a member by its stable name through the headless Service (a
		// pod IP changes when the pod is rescheduled; the raft configuration keeps
		// what was advertised).
		stable := pod + "." + s.Spec.ServiceName + "." + namespace + ".svc"
		if want := fmt.Sprintf("%s:%d", stable, containerPort(t, c, "raft")); cfg.Raft.RaftAdvertise != want {
			t.Errorf("--raft-advertise %q, want the pod's stable name %q", cfg.Raft.RaftAdvertise, want)
		}
		if want := fmt.Sprintf("%s:%d", stable, containerPort(t, c, "grpc")); cfg.GRPCAdvertise != want {
			t.Errorf("--grpc-advertise %q, want the pod's stable name %q", cfg.GRPCAdvertise, want)
		}
		if cfg.Kube.Selector != selector || selector != "" && cfg.Kube.Namespace != namespace {
			t.Errorf("indexer discovery %+v, want selector %q in the release namespace", cfg.Kube, selector)
		}
	}
	podSpec := s.Spec.Template.Spec
	switch {
	case selector != "" && (podSpec.ServiceAccountName == "" || !watchesPods(r, podSpec.ServiceAccountName)):
		t.Errorf("the indexer's ServiceAccount %q must be bound to a Role that gets, lists and watches pods", podSpec.ServiceAccountName)
	case selector == "" && (podSpec.AutomountServiceAccountToken == nil || *podSpec.AutomountServiceAccountToken):
		t.Error("without discovery the indexer needs no Kubernetes API token: automountServiceAccountToken must be false")
	}
	// The kubelet presents no client certificate: each probe must reach a
	// listener that answers it without one.
	cfg := indexerConfig(t, s)
	for _, p := range []struct {
		what, path string
		probe      *corev1.Probe
	}{{"readiness", "/readyz", c.ReadinessProbe}, {"liveness", "/healthz", c.LivenessProbe}} {
		if g := p.probe.HTTPGet; g == nil || g.Path != p.path || !servesWithoutCertificate(t, cfg, portNumber(t, c, g.Port), g.Scheme) {
			t.Errorf("indexer %s probe %+v: want GET %s on a port that answers plain HTTP without a client certificate (--http-addr %s with TLS %v and client CA %q, --probe-addr %q)",
				p.what, p.probe, p.path, cfg.HTTPAddr, cfg.TLSCert != "", cfg.TLSClientCA, cfg.ProbeAddr)
		}
	}
	if sc := s.Spec.Template.Spec.SecurityContext; sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
		t.Error("indexer must run as non-root")
	}
	if len(r.pdbs) != 1 || r.pdbs[0].Spec.MaxUnavailable == nil || replicas-r.pdbs[0].Spec.MaxUnavailable.IntValue() < replicas/2+1 {
		t.Errorf("PDB %+v does not keep a majority of %d", r.pdbs, replicas)
	}
}

// indexerConfig is the configuration pod 0 of the indexer StatefulSet s runs
// with, as the indexer's own parser reads the rendered flags and environment
// (a token from a Secret reads "secret:<name>/<key>", see secretEnv).
func indexerConfig(t *testing.T, s *appsv1.StatefulSet) server.Config {
	t.Helper()
	c := s.Spec.Template.Spec.Containers[0]
	cfg, err := server.ParseFlags(expand(c.Args, map[string]string{"POD_NAME": "kv-indexer-0", "POD_NAMESPACE": namespace}),
		io.Discard, secretEnv(c))
	if err != nil {
		t.Fatalf("the indexer refuses the chart's flags: %v", err)
	}
	return cfg
}

// portNumber is the container port of c that p names (by name or number).
func portNumber(t *testing.T, c corev1.Container, p intstr.IntOrString) int32 {
	t.Helper()
	if p.Type == intstr.Int {
		return p.IntVal
	}
	return containerPort(t, c, p.StrVal)
}

// servesWithoutCertificate says whether the indexer configured by cfg answers
// a client without a certificate that speaks scheme to its port port: its
// probe listener (--probe-addr) is plain HTTP whatever the TLS flags say; its
// HTTP listener is plain HTTP without --tls-cert and asks for a client
// certificate with --tls-client-ca.
func servesWithoutCertificate(t *testing.T, cfg server.Config, port int32, scheme corev1.URIScheme) bool {
	t.Helper()
	plain := scheme == "" || scheme == corev1.URISchemeHTTP
	switch {
	case cfg.ProbeAddr != "" && port == portOf(t, cfg.ProbeAddr):
		return plain
	case port == portOf(t, cfg.HTTPAddr) && cfg.TLSCert == "":
		return plain
	case port == portOf(t, cfg.HTTPAddr):
		return cfg.TLSClientCA == "" && scheme == corev1.URISchemeHTTPS
	}
	return false
}

// secretOf is the Secret whose volume container c of pod mounts file from ("":
// none).
func secretOf(pod corev1.PodSpec, c corev1.Container, file string) string {
	for _, m := range c.VolumeMounts {
		if strings.HasPrefix(file, strings.TrimSuffix(m.MountPath, "/")+"/") {
			for _, v := range pod.Volumes {
				if v.Name == m.Name && v.Secret != nil {
					return v.Secret.SecretName
				}
			}
		}
	}
	return ""
}

// checkRaftCAApart: with TLS, the indexer's --tls-client-ca and --raft-tls-ca
// (and the raft certificate) come from two Secrets, apiSecret and raftSecret, so
// that no API client certificate can speak raft.
func checkRaftCAApart(t *testing.T, s *appsv1.StatefulSet, apiSecret, raftSecret string) {
	t.Helper()
	c := s.Spec.Template.Spec.Containers[0]
	cfg := indexerConfig(t, s)
	secretOf := func(file string) string { return secretOf(s.Spec.Template.Spec, c, file) }
	for _, f := range []struct{ flag, file, want string }{
		{"--tls-client-ca", cfg.TLSClientCA, apiSecret},
		{"--raft-tls-ca", cfg.RaftTLSCA, raftSecret},
		{"--raft-tls-cert", cfg.RaftTLSCert, raftSecret},
		{"--raft-tls-key", cfg.RaftTLSKey, raftSecret},
	} {
		if got := secretOf(f.file); got != f.want {
			t.Errorf("indexer %s=%q is from Secret %q, want %q", f.flag, f.file, got, f.want)
		}
	}
}

// checkRouter: the router's flags parse with its own parser; the ports, probes
// and Services agree; its ServiceAccount may watch pods.
func checkRouter(t *testing.T, r *rendered, epp bool) {
	d := r.deployments["kv-router"]
	if d == nil {
		t.Fatal("no router Deployment")
	}
	c := d.Spec.Template.Spec.Containers[0]
	args := expand(c.Args, map[string]string{"POD_NAMESPACE": namespace})
	cfg, err := router.ParseFlags(args, io.Discard, secretEnv(c))
	if err != nil {
		t.Fatalf("the router refuses the chart's flags %q: %v", args, err)
	}
	// The routers' shared ledger (LoadService, on with --indexer) needs the
	// indexer's ledger token when the indexer checks tokens. The router never
	// holds the admin token, nor any reference to its Secret: whoever controls
	// a router must not be able to register workers or change the membership.
	// Without a ledger token the ledger is off rather than refused; with one,
	// or an indexer that checks none, it is on.
	icfg := indexerConfig(t, r.statefulSets["kv-indexer"])
	withoutToken := icfg.AdminToken != "" && icfg.LedgerToken == ""
	switch {
	case withoutToken && cfg.Ledger:
		t.Errorf("the indexer checks tokens and has no ledger token, yet the router runs the ledger (--ledger), which the indexer refuses")
	case !withoutToken && !cfg.Ledger:
		t.Errorf("the router could share load through the ledger but runs with --ledger=false")
	case cfg.Ledger && cfg.IndexerToken != icfg.LedgerToken:
		t.Errorf("router's indexer token %q, want the indexer's ledger token %q: without it the ledger stream is refused", cfg.IndexerToken, icfg.LedgerToken)
	}
	if icfg.AdminToken != "" && cfg.IndexerToken == icfg.AdminToken {
		t.Errorf("the router holds the indexer's admin token %q", icfg.AdminToken)
	}
	if admin := adminSecret(r.statefulSets["kv-indexer"]); admin != "" && referencesSecret(d.Spec.Template.Spec, admin) {
		t.Errorf("the router's pod references the admin Secret %q", admin)
	}
	if got, want := portOf(t, cfg.Listen), containerPort(t, c, "http"); got != want {
		t.Errorf("--listen port %d, container port http %d", got, want)
	}
	if cfg.Kube.Selector == "" || cfg.Kube.Namespace != namespace {
		t.Errorf("discovery %+v: want a selector in the release namespace", cfg.Kube)
	}
	if len(cfg.Indexer) != 1 || portOf(t, cfg.Indexer[0]) != 7070 || !strings.HasPrefix(cfg.Indexer[0], "kv-indexer.") {
		t.Fatalf("--indexer %v, want the indexer Service's gRPC port", cfg.Indexer)
	}
	// The router speaks to the indexer as the indexer serves: TLS when it
	// serves TLS, with a client certificate when it asks for one.
	switch {
	case (icfg.TLSCert != "") != (cfg.IndexerTLSCA != ""):
		t.Errorf("the indexer serves TLS: %v; the router dials it with TLS (--indexer-tls-ca %q): %v", icfg.TLSCert != "", cfg.IndexerTLSCA, cfg.IndexerTLSCA != "")
	case icfg.TLSClientCA != "" && (cfg.IndexerTLSCert == "" || cfg.IndexerTLSKey == ""):
		t.Errorf("the indexer requires client certificates (--tls-client-ca) but the router presents none (--indexer-tls-cert %q, --indexer-tls-key %q)", cfg.IndexerTLSCert, cfg.IndexerTLSKey)
	}
	if epp {
		port := containerPort(t, c, "epp")
		if portOf(t, cfg.EPP.Addr) != port {
			t.Errorf("--epp-addr %q, container port epp %d", cfg.EPP.Addr, port)
		}
		for what, p := range map[string]*corev1.Probe{router.HealthReadiness: c.ReadinessProbe, router.HealthLiveness: c.LivenessProbe} {
			if p.GRPC == nil || p.GRPC.Port != port || p.GRPC.Service == nil || *p.GRPC.Service != what {
				t.Errorf("%s probe %+v, want gRPC health %q on %d", what, p, what, port)
			}
		}
		if svc := r.services["kv-router-epp"]; svc == nil || svc.Spec.Ports[0].TargetPort.String() != "epp" {
			t.Error("no EPP Service targeting the epp port")
		}
	} else {
		if cfg.EPP.Addr != "" {
			t.Errorf("--epp-addr %q with the EPP off", cfg.EPP.Addr)
		}
		if p := c.ReadinessProbe.HTTPGet; p == nil || p.Path != "/readyz" {
			t.Errorf("router readiness %+v, want /readyz", c.ReadinessProbe)
		}
	}
	if sa := d.Spec.Template.Spec.ServiceAccountName; !watchesPods(r, sa) || !slices.ContainsFunc(r.accounts, func(a *corev1.ServiceAccount) bool { return a.Name == sa }) {
		t.Errorf("the router's ServiceAccount %q must be bound to a Role that gets, lists and watches pods", sa)
	}
}

// checkRouterTLS: the router dials the indexer with TLS, its CA, client
// certificate and key from Secret secret, verifying the indexer's certificate
// against serverName.
func checkRouterTLS(t *testing.T, r *rendered, secret, serverName string) {
	t.Helper()
	d := r.deployments["kv-router"]
	c := d.Spec.Template.Spec.Containers[0]
	cfg, err := router.ParseFlags(expand(c.Args, map[string]string{"POD_NAMESPACE": namespace}), io.Discard, env())
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []struct{ flag, file string }{
		{"--indexer-tls-ca", cfg.IndexerTLSCA}, {"--indexer-tls-cert", cfg.IndexerTLSCert}, {"--indexer-tls-key", cfg.IndexerTLSKey},
	} {
		if got := secretOf(d.Spec.Template.Spec, c, f.file); f.file == "" || got != secret {
			t.Errorf("router %s=%q is from Secret %q, want %q", f.flag, f.file, got, secret)
		}
	}
	if cfg.IndexerTLSServerName != serverName {
		t.Errorf("router --indexer-tls-server-name %q, want %q", cfg.IndexerTLSServerName, serverName)
	}
}

// checkScrapedWithoutCertificates: every ServiceMonitor endpoint reaches,
// through the Services it selects, a port that answers GET /metrics to a
// scraper without a client certificate; the indexer is scraped through a
// Service that publishes members that are not ready (a catching-up member's
// metrics are the ones wanted), and both components are scraped.
func checkScrapedWithoutCertificates(t *testing.T, r *rendered) {
	t.Helper()
	indexer, rt := r.statefulSets["kv-indexer"], r.deployments["kv-router"]
	icfg := indexerConfig(t, indexer)
	selects := func(svc *corev1.Service, pod corev1.PodTemplateSpec) bool {
		for k, v := range svc.Spec.Selector {
			if pod.Labels[k] != v {
				return false
			}
		}
		return len(svc.Spec.Selector) > 0
	}
	scraped := map[string]bool{}
	for _, obj := range r.custom["ServiceMonitor"] {
		var sm struct {
			Spec struct {
				Selector struct {
					MatchLabels map[string]string `json:"matchLabels"`
				} `json:"selector"`
				Endpoints []struct{ Port, Path, Scheme string } `json:"endpoints"`
			} `json:"spec"`
		}
		data, err := yaml.Marshal(obj)
		if err == nil {
			err = yaml.Unmarshal(data, &sm)
		}
		if err != nil {
			t.Fatal(err)
		}
		for _, ep := range sm.Spec.Endpoints {
			scheme := corev1.URIScheme(strings.ToUpper(ep.Scheme))
			for name, svc := range r.services {
				matched := true
				for k, v := range sm.Spec.Selector.MatchLabels {
					matched = matched && svc.Labels[k] == v
				}
				for _, sp := range svc.Spec.Ports {
					if !matched || sp.Name != ep.Port {
						continue
					}
					switch {
					case selects(svc, indexer.Spec.Template):
						port := portNumber(t, indexer.Spec.Template.Spec.Containers[0], sp.TargetPort)
						if ep.Path != "/metrics" || !servesWithoutCertificate(t, icfg, port, scheme) || !svc.Spec.PublishNotReadyAddresses {
							t.Errorf("ServiceMonitor endpoint %+v scrapes the indexer through Service %s port %d: want /metrics on a port that needs no client certificate, through a Service publishing not-ready members", ep, name, port)
						}
						scraped["indexer"] = true
					case rt != nil && selects(svc, rt.Spec.Template):
						c := rt.Spec.Template.Spec.Containers[0]
						cfg, err := router.ParseFlags(expand(c.Args, map[string]string{"POD_NAMESPACE": namespace}), io.Discard, env())
						if err != nil {
							t.Fatal(err)
						}
						// The router's --listen is plain HTTP, without client certificates.
						if port := portNumber(t, c, sp.TargetPort); ep.Path != "/metrics" || port != portOf(t, cfg.Listen) || scheme == corev1.URISchemeHTTPS {
							t.Errorf("ServiceMonitor endpoint %+v scrapes the router through Service %s port %d: want /metrics on --listen (%s) in plain HTTP", ep, name, port, cfg.Listen)
						}
						scraped["router"] = true
					}
				}
			}
		}
	}
	if !scraped["indexer"] || rt != nil && !scraped["router"] {
		t.Errorf("scraped: %v; want the indexer and the router", scraped)
	}
}

// Every Service's target ports name a port of the pods it selects.
func checkServices(t *testing.T, r *rendered) {
	var pods []corev1.PodTemplateSpec
	for _, s := range r.statefulSets {
		pods = append(pods, s.Spec.Template)
	}
	for _, d := range r.deployments {
		pods = append(pods, d.Spec.Template)
	}
	for name, svc := range r.services {
		matched := false
		for _, p := range pods {
			ok := true
			for k, v := range svc.Spec.Selector {
				ok = ok && p.Labels[k] == v
			}
			if !ok {
				continue
			}
			matched = true
			for _, sp := range svc.Spec.Ports {
				found := false
				for _, c := range p.Spec.Containers {
					for _, cp := range c.Ports {
						found = found || cp.Name == sp.TargetPort.String() || cp.ContainerPort == sp.TargetPort.IntVal
					}
				}
				if !found {
					t.Errorf("Service %s port %s targets %q, which no selected pod has", name, sp.Name, sp.TargetPort.String())
				}
			}
		}
		if !matched {
			t.Errorf("Service %s selects no pod of the chart", name)
		}
	}
}

func TestChartRenders(t *testing.T) {
	cases := []struct {
		name   string
		values string
		check  func(t *testing.T, r *rendered)
	}{
		{"defaults with an admin token", `adminToken: {existingSecret: kv-admin}`, func(t *testing.T, r *rendered) {
			checkIndexer(t, r, 3, "")
			checkRouter(t, r, true)
			if len(r.hpas) != 1 || r.deployments["kv-router"].Spec.Replicas != nil {
				t.Error("autoscaling on: want an HPA and no fixed replicas")
			}
			if r.custom["ServiceMonitor"] != nil || len(r.netpols) != 0 {
				t.Error("ServiceMonitor and NetworkPolicy must be off by default")
			}
			tok := false
			for _, e := range r.statefulSets["kv-indexer"].Spec.Template.Spec.Containers[0].Env {
				tok = tok || e.Name == "KVINDEX_ADMIN_TOKEN" && e.ValueFrom.SecretKeyRef.Name == "kv-admin"
			}
			if !tok {
				t.Error("the admin token must come from the Secret as KVINDEX_ADMIN_TOKEN")
			}
		}},
		{"five voters, TLS, monitoring, network policy, examples", `
adminToken: {existingSecret: kv-admin}
tls: {enabled: true, secretName: kv-tls, raftSecretName: kv-raft-tls, routerSecretName: kv-router-tls}
indexer: {replicas: 5}
serviceMonitor: {enabled: true}
networkPolicy: {enabled: true, allowNamespaces: [gateway]}
examples: {vllm: {enabled: true}, inferencePool: {enabled: true}}
`, func(t *testing.T, r *rendered) {
			checkIndexer(t, r, 5, "")
			checkRouter(t, r, true)
			checkRaftCAApart(t, r.statefulSets["kv-indexer"], "kv-tls", "kv-raft-tls")
			checkRouterTLS(t, r, "kv-router-tls", "kv-indexer."+namespace+".svc")
			if len(r.custom["ServiceMonitor"]) != 2 || len(r.netpols) != 1 {
				t.Error("want a ServiceMonitor for the indexer and one for the router, and a NetworkPolicy")
			}
			checkScrapedWithoutCertificates(t, r)
			ip := r.custom["InferencePool"][0]
			ref, _ := ip["spec"].(map[string]any)["endpointPickerRef"].(map[string]any)
			if ref["name"] != "kv-router-epp" {
				t.Errorf("InferencePool endpointPickerRef %v, want the router's EPP Service", ref)
			}
			v := r.deployments["kv-vllm"]
			if v == nil || !strings.Contains(strings.Join(v.Spec.Template.Spec.Containers[0].Args, " "), `--kv-events-config={"enable_kv_cache_events":true`) {
				t.Error("the example vLLM must publish KV events with --kv-events-config")
			}
			if got := v.Spec.Template.Annotations["kvindex.io/model"]; got != "Qwen/Qwen3-8B" {
				t.Errorf("example vLLM model annotation %q", got)
			}
		}},
		{"bind mode with a replay pattern", `
adminToken: {existingSecret: kv-admin}
indexer: {bindReplayPattern: "tcp://{pod}.engines.llm.svc:5558"}
`, func(t *testing.T, r *rendered) {
			checkIndexer(t, r, 3, "") // the indexer's parser validates the pattern
			args := strings.Join(r.statefulSets["kv-indexer"].Spec.Template.Spec.Containers[0].Args, " ")
			if !strings.Contains(args, "--zmq-bind=tcp://*:5557") || !strings.Contains(args, "--bind-replay-pattern=tcp://{pod}.engines.llm.svc:5558") {
				t.Errorf("indexer args %q: want --zmq-bind and the --bind-replay-pattern", args)
			}
		}},
		{"monitoring without TLS", `
adminToken: {existingSecret: kv-admin}
serviceMonitor: {enabled: true}
`, func(t *testing.T, r *rendered) {
			checkIndexer(t, r, 3, "")
			checkRouter(t, r, true)
			checkScrapedWithoutCertificates(t, r)
		}},
		{"TLS, the proxy's probes over HTTP, another indexer certificate name", `
adminToken: {existingSecret: kv-admin}
tls: {enabled: true, secretName: kv-tls, raftSecretName: kv-raft-tls, routerSecretName: kv-router-tls, indexerServerName: indexer.example}
router: {eppPort: 0, extraVolumes: [{name: models, emptyDir: {}}], extraVolumeMounts: [{name: models, mountPath: /models}]}
`, func(t *testing.T, r *rendered) {
			checkIndexer(t, r, 3, "")
			checkRouter(t, r, false)
			checkRouterTLS(t, r, "kv-router-tls", "indexer.example")
			c := r.deployments["kv-router"].Spec.Template.Spec.Containers[0]
			if secretOf(r.deployments["kv-router"].Spec.Template.Spec, c, "/models/m/tokenizer.json") != "" ||
				!slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == "models" }) {
				t.Errorf("the router's extra volume mounts %+v are lost next to the TLS Secret", c.VolumeMounts)
			}
		}},
		{"proxy only, fixed replicas, nats", `
adminToken: {existingSecret: kv-admin}
indexer: {ingest: nats, natsURL: "nats://nats:4222"}
router: {eppPort: 0, autoscaling: {enabled: false}, replicas: 3}
`, func(t *testing.T, r *rendered) {
			checkIndexer(t, r, 3, "")
			checkRouter(t, r, false)
			if len(r.hpas) != 0 || *r.deployments["kv-router"].Spec.Replicas != 3 {
				t.Error("autoscaling off: want 3 fixed replicas and no HPA")
			}
		}},
		{"indexer discovery, connect mode, example engines", `
adminToken: {existingSecret: kv-admin}
indexer: {ingest: connect, discovery: {selector: "app=vllm", unreadyGrace: 30s}}
examples: {vllm: {enabled: true}}
`, func(t *testing.T, r *rendered) {
			checkIndexer(t, r, 3, "app=vllm")
			checkRouter(t, r, true)
			c := r.statefulSets["kv-indexer"].Spec.Template.Spec.Containers[0]
			cfg, err := server.ParseFlags(expand(c.Args, map[string]string{"POD_NAME": "kv-indexer-0", "POD_IP": "10.1.2.3", "POD_NAMESPACE": namespace}),
				io.Discard, env("KVINDEX_ADMIN_TOKEN", "secret"))
			if err != nil || cfg.KubeUnreadyGrace.String() != "30s" || cfg.Ingest.ZMQBind != "" {
				t.Errorf("indexer flags: %v; unready grace %v, --zmq-bind %q: want 30s and connect mode", err, cfg.KubeUnreadyGrace, cfg.Ingest.ZMQBind)
			}
			// The example engines are what the indexer discovers: they match its
			// selector and annotate the port they bind their events socket on.
			v := r.deployments["kv-vllm"].Spec.Template
			if v.Labels["app"] != "vllm" || v.Annotations["kvindex.io/kv-events-port"] != "5557" ||
				!strings.Contains(strings.Join(v.Spec.Containers[0].Args, " "), `"endpoint":"tcp://*:5557"`) {
				t.Errorf("example vLLM in connect mode: labels %v, annotations %v, args %q", v.Labels, v.Annotations, v.Spec.Containers[0].Args)
			}
		}},
		{"a ledger token for the routers", `
adminToken: {existingSecret: kv-admin}
ledgerToken: {existingSecret: kv-ledger}
`, func(t *testing.T, r *rendered) {
			checkIndexer(t, r, 3, "")
			checkRouter(t, r, true) // the router's token is the indexer's ledger token, and it has no admin Secret
			icfg := indexerConfig(t, r.statefulSets["kv-indexer"])
			if icfg.LedgerToken != "secret:kv-ledger/token" || icfg.AdminToken != "secret:kv-admin/token" {
				t.Errorf("indexer tokens: admin %q, ledger %q; want them from kv-admin and kv-ledger", icfg.AdminToken, icfg.LedgerToken)
			}
		}},
		{"indexer only, insecure", `
adminToken: {insecureNoAdminToken: true}
router: {enabled: false}
`, func(t *testing.T, r *rendered) {
			checkIndexer(t, r, 3, "")
			if len(r.deployments) != 0 {
				t.Error("router disabled but rendered")
			}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r, err := render(t, c.values)
			if err != nil {
				t.Fatal(err)
			}
			checkServices(t, r)
			c.check(t, r)
		})
	}
}

// No router is ever given the admin token, whatever the values: not its
// Secret by any reference (variable, envFrom, volume), with or without a
// ledger token, TLS, the EPP, fixed replicas or the examples. Without a ledger
// token the routers run with the ledger off instead (checkRouter).
func TestChartNeverGivesRoutersTheAdminToken(t *testing.T) {
	tokens := []string{
		`adminToken: {existingSecret: kv-admin}`,
		"adminToken: {existingSecret: kv-admin}\nledgerToken: {existingSecret: kv-ledger}",
		`adminToken: {existingSecret: kv-admin, insecureNoAdminToken: true}`,
		`adminToken: {insecureNoAdminToken: true}`,
	}
	others := []string{
		``,
		`tls: {enabled: true, secretName: kv-tls, raftSecretName: kv-raft-tls, routerSecretName: kv-router-tls}`,
		`router: {eppPort: 0, autoscaling: {enabled: false}, replicas: 2, extraVolumes: [{name: m, emptyDir: {}}], extraVolumeMounts: [{name: m, mountPath: /m}]}`,
		"serviceMonitor: {enabled: true}\nnetworkPolicy: {enabled: true}\nexamples: {vllm: {enabled: true}, inferencePool: {enabled: true}}",
	}
	for _, tok := range tokens {
		for _, other := range others {
			values := tok + "\n" + other
			t.Run(values, func(t *testing.T) {
				r, err := render(t, values)
				if err != nil {
					t.Fatal(err)
				}
				d := r.deployments["kv-router"]
				if d == nil {
					t.Fatal("no router Deployment")
				}
				if referencesSecret(d.Spec.Template.Spec, "kv-admin") {
					t.Errorf("the router's pod references the admin Secret kv-admin")
				}
				checkRouter(t, r, !strings.Contains(other, "eppPort: 0"))
			})
		}
	}
}

// Values the chart refuses, with a message naming what is missing.
func TestChartRefuses(t *testing.T) {
	for _, c := range []struct{ values, want string }{
		{`{}`, "adminToken.existingSecret is required"},
		{`{adminToken: {existingSecret: a}, tls: {enabled: true, routerSecretName: c}}`, "tls.secretName is required"},
		{`{adminToken: {existingSecret: a}, tls: {enabled: true, secretName: t, routerSecretName: c}}`, "tls.raftSecretName is required"},
		{`{adminToken: {existingSecret: a}, tls: {enabled: true, secretName: t, raftSecretName: r}}`, "tls.routerSecretName is required"},
		{`{adminToken: {existingSecret: a}, indexer: {ingest: nats}}`, "indexer.natsURL is required"},
		{`{adminToken: {insecureNoAdminToken: true}, ledgerToken: {existingSecret: l}}`, "ledgerToken.existingSecret needs adminToken.existingSecret"},
	} {
		_, err := render(t, c.values)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("values %s: %v, want an error with %q", c.values, err, c.want)
		}
	}
}
