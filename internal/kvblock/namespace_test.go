package kvblock

import (
	"strings"
	"testing"
)

func TestNamespaceIDSeparatesFields(t *testing.T) {
	namespaces := []Namespace{
		{},
		{Model: "m"},
		{LoRA: "m"},
		{CacheSalt: "m"},
		{Model: "ab", LoRA: "c"},
		{Model: "a", LoRA: "bc"},
		{Model: "a", CacheSalt: "bc"},
		{Model: "a", LoRA: "b", CacheSalt: "c"},
		{Model: "a\x00", LoRA: "b"},
		{Model: "a", LoRA: "\x00b"},
		{Model: strings.Repeat("x", 300)},
		{Model: strings.Repeat("x", 299), LoRA: "x"},
	}
	seen := map[uint64]Namespace{}
	for _, ns := range namespaces {
		id := ns.ID()
		if prev, dup := seen[id]; dup {
			t.Errorf("%+v and %+v share ID %d", prev, ns, id)
		}
		seen[id] = ns
	}
}

func TestNamespaceIDIsDeterministic(t *testing.T) {
	ns := Namespace{Model: "meta-llama/Llama-3.1-8B-Instruct", LoRA: "adapter-a", CacheSalt: "tenant-7"}
	copyOfNS := Namespace{Model: strings.Clone(ns.Model), LoRA: strings.Clone(ns.LoRA), CacheSalt: strings.Clone(ns.CacheSalt)}
	if ns.ID() != copyOfNS.ID() {
		t.Errorf("equal namespaces gave IDs %d and %d", ns.ID(), copyOfNS.ID())
	}
}

func TestNamespaceIDAllocatesNothingForShortNames(t *testing.T) {
	ns := Namespace{Model: "meta-llama/Llama-3.1-8B-Instruct", LoRA: "adapter-a", CacheSalt: "tenant-7"}
	if allocs := testing.AllocsPerRun(100, func() { _ = ns.ID() }); allocs != 0 {
		t.Errorf("Namespace.ID: %v allocations per run, want 0", allocs)
	}
}
