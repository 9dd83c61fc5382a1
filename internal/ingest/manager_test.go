package ingest

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/internal/workerspec"
)

func TestManagerConfigValidate(t *testing.T) {
	for _, c := range []struct {
		name   string
		mutate func(*ManagerConfig)
		err    string
	}{
		{"transport", func(c *ManagerConfig) { c.Transport = "kafka" }, "--kv-event-transport=\"kafka\""},
		{"nats url", func(c *ManagerConfig) { c.Transport = TransportNATS }, "needs --nats-url"},
		{"nats url without nats", func(c *ManagerConfig) { c.NATSURL = "nats://x" }, "--nats-url=\"nats://x\" needs --kv-event-transport=nats"},
		{"nats and bind", func(c *ManagerConfig) { c.Transport, c.NATSURL, c.ZMQBind = TransportNATS, "nats://x", "tcp://*:1" }, "--zmq-bind"},
		{"subject prefix", func(c *ManagerConfig) {
			c.Transport, c.NATSURL, c.NATSSubjectPrefix = TransportNATS, "nats://x", "kv.*"
		}, "--nats-subject-prefix"},
		{"block size", func(c *ManagerConfig) { c.DefaultBlockSize = -1 }, "--block-size=-1"},
		{"frame", func(c *ManagerConfig) { c.MaxFrameBytes = 10 }, "--max-frame-bytes=10"},
		{"replay timeout", func(c *ManagerConfig) { c.ReplayTimeout = 0 }, "--replay-timeout"},
		{"idle replay", func(c *ManagerConfig) { c.IdleReplayInterval = -1 }, "--idle-replay-interval"},
		{"bind", func(c *ManagerConfig) { c.ZMQBind = "5557" }, "--zmq-bind=\"5557\""},
		{"no dp rank for discovered workers", func(c *ManagerConfig) { c.MaxDiscoveredDPRanks = 0 }, "--max-discovered-dp-ranks=0 must be between 1 and 1024"},
		{"more dp ranks than a worker can have", func(c *ManagerConfig) { c.MaxDiscoveredDPRanks = 1025 }, "--max-discovered-dp-ranks=1025"},
		{"replay pattern without pod", func(c *ManagerConfig) { c.BindReplayPattern = "tcp://engine:5558" }, "--bind-replay-pattern=\"tcp://engine:5558\" must be a tcp:// endpoint with {pod}"},
		{"replay pattern not tcp", func(c *ManagerConfig) { c.BindReplayPattern = "ipc:///{pod}" }, "--bind-replay-pattern=\"ipc:///{pod}\" must be a tcp://"},
		{"replay pattern without port", func(c *ManagerConfig) { c.BindReplayPattern = "tcp://{pod}.svc" }, "--bind-replay-pattern=\"tcp://{pod}.svc\" is no endpoint"},
		{"worker", func(c *ManagerConfig) { c.Workers = []workerspec.Spec{{ID: "w"}} }, "model must not be empty"},
		{"duplicate worker", func(c *ManagerConfig) { c.Workers = []workerspec.Spec{{ID: "w", Model: "m"}, {ID: "w", Model: "m"}} }, "given twice"},
	} {
		cfg := DefaultManagerConfig()
		c.mutate(&cfg)
		err := cfg.Validate()
		if err == nil || !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), c.err) {
			t.Errorf("%s: Validate() = %v, want ErrInvalidConfig mentioning %q", c.name, err, c.err)
		}
	}
	if err := DefaultManagerConfig().Validate(); err != nil {
		t.Errorf("defaults invalid: %v", err)
	}
}

// A worker given by --worker cannot be replaced through the registry; registry
// workers can be replaced and removed; an invalid workers file fails NewManager.
func TestWorkerSourcesAndConflicts(t *testing.T) {
	cfg := testManagerConfig()
	cfg.Workers = []workerspec.Spec{{ID: "static", Model: "m"}}
	m, err := NewManager(cfg, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := m.AddWorker(workerspec.Spec{ID: "static", Model: "other"}); !errors.Is(err, ErrWorkerConflict) {
		t.Errorf("replacing a --worker = %v, want ErrWorkerConflict", err)
	}
	if err := m.AddWorker(workerspec.Spec{ID: "dyn", Model: "m"}); err != nil {
		t.Fatal(err)
	}
	if err := m.AddWorker(workerspec.Spec{ID: "dyn", Model: "m2"}); err != nil {
		t.Fatal(err)
	}
	if err := m.AddWorker(workerspec.Spec{ID: "bad"}); !errors.Is(err, workerspec.ErrInvalid) {
		t.Errorf("AddWorker(invalid) = %v", err)
	}
	ws := m.Workers()
	if len(ws) != 2 || ws[0].Spec.ID != "dyn" || ws[0].Spec.Model != "m2" || ws[0].Source != SourceRegistry || ws[1].Source != SourceFlag {
		t.Errorf("Workers() = %+v", ws)
	}
	m.RemoveWorker("dyn")
	m.RemoveWorker("never-there")
	if ws := m.Workers(); len(ws) != 1 {
		t.Errorf("after RemoveWorker: %+v", ws)
	}

	path := filepath.Join(t.TempDir(), "w.yaml")
	if err := os.WriteFile(path, []byte("workers:\n  - id: x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg.WorkersFile = path
	if _, err := NewManager(cfg, nil, nil); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("NewManager with an invalid workers file = %v, want ErrInvalidConfig", err)
	}
}
