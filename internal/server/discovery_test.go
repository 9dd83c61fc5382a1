package server

import (
	"encoding/binary"
	"fmt"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvindex/kvindex/bench/fakeengine"
)

// TestDiscoveryFloodIsBoundedOnEveryReplica publishes batches of ever new
// workers to the leader's bind socket: the leader discovers (and registers)
// --max-discovered-workers of them and counts the rest, and every replica's
// registry stays at that size.
func TestDiscoveryFloodIsBoundedOnEveryReplica(t *testing.T) {
	const limit = 3
	c := makeCluster(t, 3, func(cfg *Config) {
		cfg.Ingest.ZMQBind = "tcp://127.0.0.1:*"
		cfg.Ingest.MaxDiscoveredWorkers = limit
	})
	leader := c.leader(10 * time.Second)
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	defer zctx.Term()
	pub, err := zctx.NewSocket(zmq.PUB)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	pub.SetLinger(0)
	if err := pub.Connect(leader.srv.Ingest().BindEndpoint()); err != nil {
		t.Fatal(err)
	}
	payload, err := fakeengine.EncodeBatch(fakeengine.Batch{TS: 1, Events: []fakeengine.Event{{
		Kind: fakeengine.BlockStored, BlockHashes: []uint64{1}, TokenIDs: []uint32{1, 2, 3, 4}, BlockSize: 4, Medium: fakeengine.MediumGPU,
	}}}, fakeengine.WireMap)
	if err != nil {
		t.Fatal(err)
	}
	refused := func() float64 {
		return labeled(t, leader.srv, "kvindex_ingest_decode_errors_total", "reason", "discovery_limit")
	}
	// A PUB drops what it sends before the subscription reaches it: keep
	// flooding new ids until refusals are counted, then once more.
	next := 0
	flood := func(n int) {
		for range n {
			topic := fmt.Sprintf("kv@flood-%d@%s", next, testModel)
			next++
			if _, err := pub.SendMessage(topic, binary.BigEndian.AppendUint64(nil, 1), payload); err != nil {
				t.Fatal(err)
			}
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for refused() < 50 {
		if time.Now().After(deadline) {
			t.Fatalf("only %v discovery refusals counted after %d new workers", refused(), next)
		}
		flood(20)
		time.Sleep(10 * time.Millisecond)
	}
	// Every replica's registry holds the limit: the leader registered what it
	// discovered, and nothing more.
	for _, cn := range c.live() {
		for len(cn.srv.node.Workers()) != limit {
			if time.Now().After(deadline) {
				t.Fatalf("%s's registry holds %d workers, want %d", cn.id, len(cn.srv.node.Workers()), limit)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	before := refused()
	flood(100)
	for refused() < before+50 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	// The leader registers what it discovered every publishInterval: after two
	// of them, the registries are still at the limit.
	time.Sleep(2 * publishInterval)
	for _, cn := range c.live() {
		if n := len(cn.srv.node.Workers()); n != limit {
			t.Errorf("%s's registry holds %d workers after a flood of %d, want %d", cn.id, n, next, limit)
		}
	}
	t.Logf("%d new workers published, %v refused, registries at %d", next, refused(), limit)
}
