package server

import (
	"sync"
	"sync/atomic"

	"github.com/kvindex/kvindex/internal/kvblock"
)

// namespaceNames remembers the names of namespace ids the server has seen
// named: the base namespace of each registered model (ChangeFeed.WorkersChanged)
// and every namespace a query about a registered model asked about (score). The
// ids themselves are one-way hashes, so this is how Watch and Dump changes get
// their model, LoRA and cache salt.
//
// Concurrency: safe for concurrent use; learn and lookup never block (the apply
// goroutine calls both). It only grows, up to maxNamedNamespaces.
type namespaceNames struct {
	m     sync.Map // uint64 -> kvblock.Namespace
	count atomic.Int64
}

// maxNamedNamespaces bounds namespaceNames: cache salts may be per tenant.
const maxNamedNamespaces = 1 << 14

func (n *namespaceNames) learn(id uint64, ns kvblock.Namespace) {
	if _, known := n.m.Load(id); known || n.count.Load() >= maxNamedNamespaces {
		return
	}
	if _, loaded := n.m.LoadOrStore(id, ns); !loaded {
		n.count.Add(1)
	}
}

func (n *namespaceNames) lookup(id uint64) (kvblock.Namespace, bool) {
	v, ok := n.m.Load(id)
	if !ok {
		return kvblock.Namespace{}, false
	}
	return v.(kvblock.Namespace), true
}
