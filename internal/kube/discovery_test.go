package kube

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kvindex/kvindex/internal/workerspec"
)

func pod(name, ip string, ready bool, labels, annotations map[string]string) *corev1.Pod {
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "llm", Labels: labels, Annotations: annotations},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: status}}},
	}
}

// The pod → spec mapping, one case per label or annotation.
func TestSpecsFromPods(t *testing.T) {
	d, err := NewWithClient(Config{HTTPPort: 8000, Resync: time.Minute, DefaultModel: ""}, fake.NewClientset(), nil)
	if err != nil {
		t.Fatal(err)
	}
	app := map[string]string{"app": "vllm", KeyModel: "Qwen/Qwen3-8B"}
	with := func(m map[string]string, kv ...string) map[string]string {
		out := map[string]string{}
		for k, v := range m {
			out[k] = v
		}
		for i := 0; i+1 < len(kv); i += 2 {
			out[kv[i]] = kv[i+1]
		}
		return out
	}
	cases := []struct {
		name string
		pod  *corev1.Pod
		want string // workerspec String(); "" = skipped
	}{
		{"plain", pod("vllm-0", "10.0.0.5", true, app, nil), "id=vllm-0,model=Qwen/Qwen3-8B,http=http://10.0.0.5:8000"},
		{"not ready", pod("vllm-1", "10.0.0.6", false, app, nil), ""},
		{"no ip", pod("vllm-2", "", true, app, nil), ""},
		{"no model", pod("vllm-3", "10.0.0.7", true, map[string]string{"app": "vllm"}, nil), ""},
		{"llm-d role and model", pod("pf-0", "10.0.0.8", true, map[string]string{"llm-d.ai/role": "prefill", KeyLLMDModel: "m"}, nil),
			"id=pf-0,model=m,http=http://10.0.0.8:8000,role=prefill"},
		{"llm-d both", pod("b-0", "10.0.0.8", true, map[string]string{"llm-d.ai/role": "both", KeyModel: "m"}, nil),
			"id=b-0,model=m,http=http://10.0.0.8:8000"},
		{"bad role", pod("x-0", "10.0.0.8", true, with(app, KeyRole, "router"), nil), ""},
		{"annotations", pod("vllm-4", "10.0.0.9", true, app, map[string]string{KeyHTTPPort: "9000", KeyDPSize: "2", KeyBlockSize: "16",
			KeyEventsPort: "5557", KeyEventsTopic: "kv", KeyReplayPort: "5558", KeyRole: "decode", KeyWorkerID: "w9", "kvindex.io/label.zone": "a"}),
			"id=w9,model=Qwen/Qwen3-8B,block-size=16,dp-size=2,endpoint=tcp://10.0.0.9:5557,topic=kv,replay=tcp://10.0.0.9:5558,http=http://10.0.0.9:9000,role=decode,label.zone=a"},
		{"bad port", pod("vllm-5", "10.0.0.9", true, app, map[string]string{KeyHTTPPort: "http"}), ""},
		{"ipv6", pod("vllm-6", "fd00::1", true, app, nil), "id=vllm-6,model=Qwen/Qwen3-8B,http=http://[fd00::1]:8000"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			specs := d.Specs([]*corev1.Pod{c.pod})
			switch {
			case c.want == "" && len(specs) != 0:
				t.Errorf("want the pod skipped, got %v", specs)
			case c.want != "" && len(specs) != 1:
				t.Errorf("want one spec, got %v", specs)
			case c.want != "":
				want, err := workerspec.Parse(c.want)
				if err != nil {
					t.Fatal(err)
				}
				if !specs[0].Equal(want) {
					t.Errorf("got  %s\nwant %s", specs[0], want)
				}
			}
		})
	}
}

// recorder keeps the lists discovery reported.
type recorder struct {
	mu   sync.Mutex
	last []workerspec.Spec
	n    int
}

func (r *recorder) update(s []workerspec.Spec) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.last, r.n = s, r.n+1
}

func (r *recorder) ids() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var ids []string
	for _, s := range r.last {
		ids = append(ids, s.ID)
	}
	return strings.Join(ids, ",")
}

func waitIDs(t *testing.T, r *recorder, want string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for r.ids() != want {
		if time.Now().After(deadline) {
			t.Fatalf("workers %q, want %q", r.ids(), want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// The watch: only matching, ready pods; readiness changes and deletes are
// followed.
func TestDiscoveryFollowsPods(t *testing.T) {
	cs := fake.NewClientset(
		pod("vllm-0", "10.0.0.1", true, map[string]string{"app": "vllm", KeyModel: "m"}, nil),
		pod("vllm-1", "10.0.0.2", false, map[string]string{"app": "vllm", KeyModel: "m"}, nil),
		pod("other-0", "10.0.0.3", true, map[string]string{"app": "other", KeyModel: "m"}, nil),
	)
	d, err := NewWithClient(Config{Selector: "app=vllm", Namespace: "llm", HTTPPort: 8000, Resync: time.Minute}, cs, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	rec := &recorder{}
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx, rec.update) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	waitIDs(t, rec, "vllm-0")

	pods := cs.CoreV1().Pods("llm")
	p1 := pod("vllm-1", "10.0.0.2", true, map[string]string{"app": "vllm", KeyModel: "m"}, nil)
	if _, err := pods.UpdateStatus(ctx, p1, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitIDs(t, rec, "vllm-0,vllm-1")

	if _, err := pods.Create(ctx, pod("vllm-2", "10.0.0.4", true, map[string]string{"app": "vllm", KeyModel: "m"}, nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitIDs(t, rec, "vllm-0,vllm-1,vllm-2")

	if err := pods.Delete(ctx, "vllm-0", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitIDs(t, rec, "vllm-1,vllm-2")

	p2 := pod("vllm-2", "10.0.0.4", false, map[string]string{"app": "vllm", KeyModel: "m"}, nil)
	if _, err := pods.UpdateStatus(ctx, p2, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitIDs(t, rec, "vllm-1")
}

func TestConfigValidate(t *testing.T) {
	for _, c := range []struct {
		name string
		mut  func(*Config)
		bad  string
	}{
		{"defaults", func(*Config) {}, ""},
		{"selector", func(c *Config) { c.Selector = "app=vllm,tier in (a,b)" }, ""},
		{"bad selector", func(c *Config) { c.Selector = "app==(" }, "--kube-selector"},
		{"bad port", func(c *Config) { c.HTTPPort = 0 }, "--kube-http-port=0"},
		{"bad resync", func(c *Config) { c.Resync = 0 }, "--kube-resync"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := DefaultConfig()
			c.mut(&cfg)
			err := cfg.Validate()
			if (err != nil) != (c.bad != "") || err != nil && !strings.Contains(err.Error(), c.bad) {
				t.Errorf("Validate() = %v, want an error naming %q", err, c.bad)
			}
		})
	}
}

// Watch reports the pods that exist but are not ready (pending, or running
// and unready) besides the ready ones, and leaves out pods that are being
// deleted or finished, and pods of another selector, even ones a watch
// delivers (client-go's fake clientset does not filter watches).
func TestWatchReportsNotReadyPods(t *testing.T) {
	app := map[string]string{"app": "vllm", KeyModel: "m"}
	pending := pod("vllm-2", "", false, app, nil)
	pending.Status.Phase = corev1.PodPending
	finished := pod("vllm-3", "10.0.0.4", false, app, nil)
	finished.Status.Phase = corev1.PodFailed
	terminating := pod("vllm-4", "10.0.0.5", true, app, nil)
	terminating.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	cs := fake.NewClientset(
		pod("vllm-0", "10.0.0.1", true, app, nil),
		pod("vllm-1", "10.0.0.2", false, app, map[string]string{KeyWorkerID: "w1"}),
		pending, finished, terminating,
	)
	d, err := NewWithClient(Config{Selector: "app=vllm", Namespace: "llm", HTTPPort: 8000, Resync: time.Minute}, cs, nil)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var last Fleet
	got := func() string {
		mu.Lock()
		defer mu.Unlock()
		var ready []string
		for _, s := range last.Ready {
			ready = append(ready, s.ID)
		}
		return strings.Join(ready, ",") + "|" + strings.Join(last.NotReady, ",")
	}
	wait := func(want string) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for got() != want {
			if time.Now().After(deadline) {
				t.Fatalf("fleet %q, want %q", got(), want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- d.Watch(ctx, func(f Fleet) {
			mu.Lock()
			defer mu.Unlock()
			last = f
		})
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	wait("vllm-0|vllm-2,w1")

	pods := cs.CoreV1().Pods("llm")
	if _, err := pods.Create(ctx, pod("other-0", "10.0.0.9", true, map[string]string{"app": "other", KeyModel: "m"}, nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := pods.UpdateStatus(ctx, pod("vllm-1", "10.0.0.2", true, app, map[string]string{KeyWorkerID: "w1"}), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	wait("vllm-0,w1|vllm-2")
}

// Two ready pods that map to one worker id (one name in two namespaces when
// every namespace is watched, or one kvindex.io/worker-id in a Deployment's
// template): the older pod is the worker, whatever order the lister returns
// them in (a map's, new at every recomputation), so the worker does not flip
// between the two engines.
func TestDuplicateWorkerIDGoesToTheOlderPodInAnyOrder(t *testing.T) {
	d, err := NewWithClient(Config{HTTPPort: 8000, Resync: time.Minute, DefaultModel: "m"}, fake.NewClientset(), nil)
	if err != nil {
		t.Fatal(err)
	}
	older := pod("vllm-0", "10.0.0.2", true, map[string]string{"app": "vllm"}, nil)
	older.Namespace = "zz" // sorts after "llm": the age, not the name, decides
	older.CreationTimestamp = metav1.NewTime(time.Unix(1000, 0))
	newer := pod("vllm-0", "10.0.0.1", true, map[string]string{"app": "vllm"}, nil)
	newer.CreationTimestamp = metav1.NewTime(time.Unix(2000, 0))
	for _, order := range [][]*corev1.Pod{{older, newer}, {newer, older}} {
		got := d.Specs(order)
		if len(got) != 1 || got[0].HTTP != "http://10.0.0.2:8000" {
			t.Errorf("pods in order %s, %s give %v, want the older pod's engine http://10.0.0.2:8000 alone",
				order[0].Namespace, order[1].Namespace, got)
		}
	}
}
