package server

import (
	"context"
	"net"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	kvindexv1 "github.com/kvindex/kvindex/api/proto/kvindex/v1"
	"github.com/kvindex/kvindex/bench/fakeengine"
	"github.com/kvindex/kvindex/internal/kube"
	"github.com/kvindex/kvindex/internal/radix"
	"github.com/kvindex/kvindex/internal/workerspec"
)

func mustSpec(t *testing.T, s string) workerspec.Spec {
	t.Helper()
	spec, err := workerspec.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return spec
}

// The reconciliation, one case per rule: what it registers, replaces,
// unregisters and refuses.
func TestPlanKube(t *testing.T) {
	now := time.Unix(1000, 0)
	pod := func(s string) workerspec.Spec { return mustSpec(t, s) }
	marked := func(s string) workerspec.Spec { return kubeSpec(pod(s)) }
	p0 := "id=p0,model=m,endpoint=tcp://10.0.0.1:5557,http=http://10.0.0.1:8000"
	p1 := "id=p1,model=m,endpoint=tcp://10.0.0.2:5557,http=http://10.0.0.2:8000"
	cases := []struct {
		name     string
		registry []workerspec.Spec
		ready    []workerspec.Spec
		notReady []string
		since    map[string]time.Time
		config   []string // configured ids
		disc     []string // discovered ids
		limit    int
		want     []string // "op id"
		refused  map[string]string
	}{
		{name: "ready pod registered", ready: []workerspec.Spec{pod(p0)}, want: []string{"register p0"}},
		{name: "registered and unchanged", registry: []workerspec.Spec{marked(p0)}, ready: []workerspec.Spec{pod(p0)}},
		{name: "deleted pod unregistered", registry: []workerspec.Spec{marked(p0)}, want: []string{"unregister p0"}},
		{name: "unready within the grace stays", registry: []workerspec.Spec{marked(p0)}, notReady: []string{"p0"},
			since: map[string]time.Time{"p0": now.Add(-59 * time.Second)}},
		{name: "unready past the grace goes", registry: []workerspec.Spec{marked(p0)}, notReady: []string{"p0"},
			since: map[string]time.Time{"p0": now.Add(-time.Minute)}, want: []string{"unregister p0"}},
		{name: "label change keeps the blocks", registry: []workerspec.Spec{marked(p0)}, ready: []workerspec.Spec{pod(p0 + ",role=decode")},
			want: []string{"replace p0"}},
		{name: "new pod ip registers anew", registry: []workerspec.Spec{marked(p0)},
			ready: []workerspec.Spec{pod("id=p0,model=m,endpoint=tcp://10.0.0.9:5557,http=http://10.0.0.9:8000")},
			want:  []string{"unregister p0", "register p0"}},
		{name: "unmarked workers are not discovery's", registry: []workerspec.Spec{pod(p0)}},
		{name: "configured id wins", ready: []workerspec.Spec{pod(p0)}, config: []string{"p0"}, refused: map[string]string{"p0": "conflict"}},
		{name: "registered by hand wins", registry: []workerspec.Spec{pod(p0)}, ready: []workerspec.Spec{pod(p0)}, refused: map[string]string{"p0": "conflict"}},
		{name: "discovered worker taken over", registry: []workerspec.Spec{pod("id=p0,model=m")}, disc: []string{"p0"},
			ready: []workerspec.Spec{pod(p0)}, want: []string{"replace p0"}},
		{name: "limit in id order", ready: []workerspec.Spec{pod(p0), pod(p1)}, limit: 1,
			want: []string{"register p0"}, refused: map[string]string{"p1": "limit"}},
		{name: "other registered workers count", registry: []workerspec.Spec{pod("id=x,model=m")}, ready: []workerspec.Spec{pod(p0)}, limit: 1,
			refused: map[string]string{"p0": "limit"}},
		{name: "configured workers do not count", registry: []workerspec.Spec{pod("id=x,model=m")}, config: []string{"x"},
			ready: []workerspec.Spec{pod(p0)}, limit: 1, want: []string{"register p0"}},
		{name: "a removal makes room", registry: []workerspec.Spec{marked(p0)}, ready: []workerspec.Spec{pod(p1)}, limit: 1,
			want: []string{"unregister p0", "register p1"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			st := kubeState{registry: c.registry, configured: map[string]bool{}, discovered: map[string]bool{},
				fleet: kube.Fleet{Ready: c.ready, NotReady: c.notReady}, unreadySince: c.since, now: now, grace: time.Minute, limit: c.limit}
			if st.limit == 0 {
				st.limit = 10
			}
			for _, id := range c.config {
				st.configured[id] = true
			}
			for _, id := range c.disc {
				st.discovered[id] = true
			}
			plan := planKube(st)
			var got []string
			for _, a := range plan.actions {
				got = append(got, []string{"register", "replace", "unregister"}[a.op]+" "+a.spec.ID)
				if a.op != kubeUnregister && !isKubeWorker(a.spec) {
					t.Errorf("%s writes %s without the %s label", got[len(got)-1], a.spec, KubeSourceLabel)
				}
			}
			if !slices.Equal(got, c.want) {
				t.Errorf("actions %q, want %q", got, c.want)
			}
			if len(plan.refused) != len(c.refused) {
				t.Errorf("refused %v, want %v", plan.refused, c.refused)
			}
			for id, r := range c.refused {
				if plan.refused[id] != r {
					t.Errorf("refused %v, want %v", plan.refused, c.refused)
				}
			}
		})
	}
}

// enginePod is a pod at 127.0.0.1 whose annotations name e's ports, as an
// operator annotates a vLLM pod for connect mode.
func enginePod(t *testing.T, name string, e *fakeengine.Engine, ready bool, labels map[string]string) *corev1.Pod {
	t.Helper()
	port := func(endpoint string) string {
		u, err := url.Parse(strings.Replace(endpoint, "*", "127.0.0.1", 1))
		if err != nil {
			t.Fatal(err)
		}
		_, p, err := net.SplitHostPort(u.Host)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	cond := corev1.ConditionFalse
	if ready {
		cond = corev1.ConditionTrue
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "llm", Labels: labels, Annotations: map[string]string{
			kube.KeyModel: testModel, kube.KeyBlockSize: "4", kube.KeyHTTPPort: port(e.URL()),
			kube.KeyEventsPort: port(e.EventEndpoints()[0]), kube.KeyReplayPort: port(e.ReplayEndpoints()[0]),
		}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "127.0.0.1",
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: cond}}},
	}
}

// podSpec is the registry entry discovery makes of enginePod.
func podSpec(t *testing.T, name string, e *fakeengine.Engine) workerspec.Spec {
	loopback := strings.NewReplacer("tcp://*:", "tcp://127.0.0.1:")
	return kubeSpec(workerspec.Spec{ID: name, Model: testModel, BlockSize: 4, HTTP: e.URL(),
		Endpoint: loopback.Replace(e.EventEndpoints()[0]), Replay: loopback.Replace(e.ReplayEndpoints()[0])})
}

// waitRegistry waits until srv's registry holds exactly want.
func waitRegistry(t *testing.T, srv *Server, want ...workerspec.Spec) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		got := srv.node.Workers()
		if slices.EqualFunc(got, want, workerspec.Spec.Equal) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s's registry is %v, want %v", srv.cfg.NodeID, got, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

var vllmLabels = map[string]string{"app": "vllm"}

// TestKubeDiscoveryFollowsPods drives a real indexer with client-go's fake
// clientset: a ready pod matching the selector becomes a worker with the
// annotated endpoints, which the indexer follows (its engine's blocks score);
// a pod of another selector is ignored; an unready pod keeps its worker
// within the grace; a deleted pod's worker goes, and its blocks with it.
func TestKubeDiscoveryFollowsPods(t *testing.T) {
	cs := fake.NewClientset()
	f := newFixture(t, fixtureOptions{
		engines:  []engineSpec{{name: "e0", dp: 1, gpuBlocks: 256}, {name: "e1", dp: 1, gpuBlocks: 256}, {name: "e2", dp: 1, gpuBlocks: 256}},
		unlisted: true,
		configure: func(cfg *Config) {
			cfg.Kube.Selector, cfg.Kube.Namespace, cfg.KubeClient = "app=vllm", "llm", cs
			cfg.KubeUnreadyGrace = time.Hour
		},
	})
	ctx := context.Background()
	pods := cs.CoreV1().Pods("llm")
	create := func(p *corev1.Pod) {
		t.Helper()
		if _, err := pods.Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	create(enginePod(t, "e0", f.engines["e0"], true, vllmLabels))
	create(enginePod(t, "e2", f.engines["e2"], true, map[string]string{"app": "other"}))
	e0 := podSpec(t, "e0", f.engines["e0"])
	waitRegistry(t, f.srv, e0)

	prompt := tokens(0, 32)
	f.generate("e0", 0, prompt, "")
	if got := f.hitRate(t, map[string]any{"model": testModel, "token_ids": prompt}, 8); got["e0"].blocks != 8 {
		t.Fatalf("hit-rate after e0 cached the prompt: %+v, want e0 at 8 blocks", got)
	}

	create(enginePod(t, "e1", f.engines["e1"], true, vllmLabels))
	e1 := podSpec(t, "e1", f.engines["e1"])
	waitRegistry(t, f.srv, e0, e1)
	f.generate("e1", 0, prompt, "")
	if got := f.hitRate(t, map[string]any{"model": testModel, "token_ids": prompt}, 8); got["e0"].blocks != 8 || got["e1"].blocks != 8 {
		t.Fatalf("hit-rate after e0 and e1 cached the prompt: %+v, want both at 8 blocks", got)
	}

	// A worker discovery registered is the pods' to remove.
	_, err := f.admin.UnregisterWorker(ctx, &kvindexv1.UnregisterWorkerRequest{WorkerId: "e1"})
	if status.Code(err) != codes.FailedPrecondition {
		t.Errorf("unregistering a discovered pod's worker by hand: %v, want FailedPrecondition", err)
	}

	// e1 turns unready, then e0 is deleted: once e0 is gone, e1 (unready for
	// less than the grace) is still there, with its blocks.
	if _, err := pods.UpdateStatus(ctx, enginePod(t, "e1", f.engines["e1"], false, vllmLabels), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := pods.Delete(ctx, "e0", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitRegistry(t, f.srv, e1)
	if n := f.srv.Index().HeldBlocks(radix.WorkerKey{Worker: "e0"}); n != 0 {
		t.Errorf("e0's pod is deleted, yet the index holds %d of its blocks", n)
	}
	if n := f.srv.Index().HeldBlocks(radix.WorkerKey{Worker: "e1"}); n == 0 {
		t.Error("e1 is unready within the grace, yet its blocks left the index")
	}
	if got := f.hitRate(t, map[string]any{"model": testModel, "token_ids": prompt}, 8); got["e0"].blocks != 0 || got["e1"].blocks != 8 {
		t.Errorf("hit-rate after e0's pod was deleted: %+v, want e1 only", got)
	}

	if err := pods.Delete(ctx, "e1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitRegistry(t, f.srv)
	if n := f.srv.Index().HeldBlocks(radix.WorkerKey{Worker: "e1"}); n != 0 {
		t.Errorf("e1's pod is deleted, yet the index holds %d of its blocks", n)
	}
	// e2's pod (app=other) was never registered: the registry is empty.
}

// TestKubeDiscoveryNewLeaderReconciles: in a 3-node cluster every member is
// configured alike; the leader registers the pods. The leader dies; while the
// cluster elects another, one pod is deleted and another added. The new leader
// removes the worker of the deleted pod (and its blocks leave every replica),
// registers the new one and follows its engine.
func TestKubeDiscoveryNewLeaderReconciles(t *testing.T) {
	engines := map[string]*fakeengine.Engine{}
	for _, name := range []string{"e0", "e1", "e2"} {
		engines[name] = clusterEngine(t, name, 1)
	}
	cs := fake.NewClientset(enginePod(t, "e0", engines["e0"], true, vllmLabels), enginePod(t, "e1", engines["e1"], true, vllmLabels))
	c := makeCluster(t, 3, func(cfg *Config) {
		cfg.Kube.Selector, cfg.Kube.Namespace, cfg.KubeClient = "app=vllm", "llm", cs
	})
	e0, e1, e2 := podSpec(t, "e0", engines["e0"]), podSpec(t, "e1", engines["e1"]), podSpec(t, "e2", engines["e2"])
	for _, cn := range c.live() {
		waitRegistry(t, cn.srv, e0, e1)
	}
	ctx := context.Background()
	prompt := tokens(7, 32)
	for _, name := range []string{"e0", "e1"} {
		if _, err := engines[name].Generate(ctx, fakeengine.Request{Prompt: prompt, MaxTokens: 1}); err != nil {
			t.Fatal(err)
		}
	}
	c.caughtUp(c.live(), lastSeqs(t, map[string]*fakeengine.Engine{"e0": engines["e0"], "e1": engines["e1"]}), 30*time.Second)
	for _, cn := range c.live() {
		if cn.srv.Index().HeldBlocks(radix.WorkerKey{Worker: "e0"}) == 0 {
			t.Fatalf("%s holds no block of e0 before the failover", cn.id)
		}
	}

	old := c.leader(10 * time.Second)
	c.kill(old)
	pods := cs.CoreV1().Pods("llm")
	if err := pods.Delete(ctx, "e0", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := pods.Create(ctx, enginePod(t, "e2", engines["e2"], true, vllmLabels), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	leader := c.leader(30 * time.Second)
	t.Logf("leader %s died, %s leads", old.id, leader.id)
	for _, cn := range c.live() {
		waitRegistry(t, cn.srv, e1, e2)
	}
	if _, err := engines["e2"].Generate(ctx, fakeengine.Request{Prompt: prompt, MaxTokens: 1}); err != nil {
		t.Fatal(err)
	}
	c.caughtUp(c.live(), lastSeqs(t, map[string]*fakeengine.Engine{"e1": engines["e1"], "e2": engines["e2"]}), 30*time.Second)
	for _, cn := range c.live() {
		ix := cn.srv.Index()
		if n := ix.HeldBlocks(radix.WorkerKey{Worker: "e0"}); n != 0 {
			t.Errorf("%s holds %d blocks of e0, whose pod is gone", cn.id, n)
		}
		for _, w := range []string{"e1", "e2"} {
			if ix.HeldBlocks(radix.WorkerKey{Worker: w}) == 0 {
				t.Errorf("%s holds no block of %s", cn.id, w)
			}
		}
	}
}
