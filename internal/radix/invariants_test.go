package radix

import (
	"fmt"
	"slices"
)

// checkInvariants verifies the internal consistency of an index; tests call it after
// mutations. It returns the first violation found.
func checkInvariants(ix *Index) error {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	st := &ix.st

	children := make(map[uint32]uint32)
	live, hints, namespaces, blockNodes, residencies, spilled := 0, 0, 0, 0, 0, 0
	for i := uint32(1); int(i) < st.nodes.len(); i++ {
		n := st.nodes.at(i)
		if n.parent == noNode {
			continue
		}
		live++
		if n.parent == 0 {
			namespaces++
			if n.held() {
				return fmt.Errorf("namespace root %d has holders", i)
			}
		} else {
			blockNodes++
		}
		if p := st.nodes.at(n.parent).parent; n.parent != 0 && p == noNode {
			return fmt.Errorf("node %d has freed parent %d", i, n.parent)
		}
		children[n.parent]++
		if got := st.child(n.parent, n.key); got != i {
			return fmt.Errorf("child (%d,%x) finds %d, want %d", n.parent, n.key, got, i)
		}
		wantTabled := i
		if st.nodes.at(n.parent).hint == i {
			wantTabled = 0
			hints++
		}
		if got := st.edges.find(&st.nodes, n.parent, n.key); got != wantTabled {
			return fmt.Errorf("edge table finds %d for node %d (hint of its parent: %v)", got, i, wantTabled == 0)
		}
		if !n.held() && n.children == 0 {
			return fmt.Errorf("node %d kept with neither holders nor children", i)
		}
		if err := checkHolderForm(st, n); err != nil {
			return fmt.Errorf("node %d: %v", i, err)
		}
		if n.more != 0 {
			spilled++
		}
		if n.hint != 0 && (st.nodes.at(n.hint).parent != i) {
			return fmt.Errorf("node %d hints at %d, not its child", i, n.hint)
		}
		holders := appendHolders(st, nil, i)
		for k, r := range holders {
			wid := r >> 3
			if r&7 == 0 || int(wid) >= len(st.workers) || st.workers[wid] == nil {
				return fmt.Errorf("node %d has bad holder %x", i, r)
			}
			if k > 0 && holders[k-1]>>3 >= wid {
				return fmt.Errorf("node %d holders not sorted by worker id at %d", i, k)
			}
			residencies++
		}
	}
	for i := range uint32(st.nodes.len()) {
		if st.nodes.at(i).parent != noNode || i == 0 {
			if st.nodes.at(i).children != children[i] {
				return fmt.Errorf("node %d counts %d children, has %d", i, st.nodes.at(i).children, children[i])
			}
		}
	}
	if len(st.sets) != 1+spilled+len(st.freeSets) {
		return fmt.Errorf("%d holder sets, %d spilled nodes and %d free sets", len(st.sets)-1, spilled, len(st.freeSets))
	}
	if st.edges.count != live-hints {
		return fmt.Errorf("edge table holds %d edges for %d nodes that are not hints", st.edges.count, live-hints)
	}
	if namespaces != st.namespaces || blockNodes != st.blockNodes || residencies != st.residencies {
		return fmt.Errorf("counts namespaces/nodes/residencies %d/%d/%d, actual %d/%d/%d",
			st.namespaces, st.blockNodes, st.residencies, namespaces, blockNodes, residencies)
	}

	detached := 0
	for wid, ws := range st.workers {
		if ws == nil {
			continue
		}
		if st.workerIDs[ws.key] != uint32(wid) || !slices.Contains(st.byName[ws.key.Worker], uint32(wid)) {
			return fmt.Errorf("worker %v id %d not interned", ws.key, wid)
		}
		type acc struct {
			entries uint32
			tiers   [NumTiers]uint32
			mask    uint8
		}
		perNode := map[uint32]*acc{}
		for h, e := range ws.blocks.all() {
			if e.tiers == 0 || e.tiers >= 1<<NumTiers {
				return fmt.Errorf("%v hash %x has tiers %d", ws.key, h, e.tiers)
			}
			if st.nodes.at(e.node).parent == noNode || st.nodes.at(e.node).parent == 0 {
				return fmt.Errorf("%v hash %x points at non-block node %d", ws.key, h, e.node)
			}
			if _, ok := ws.detached[h]; ok {
				return fmt.Errorf("%v hash %x attached and detached", ws.key, h)
			}
			a := perNode[e.node]
			if a == nil {
				a = &acc{}
				perNode[e.node] = a
			}
			a.entries++
			a.mask |= e.tiers
			for t := range NumTiers {
				if e.tiers&(1<<t) != 0 {
					a.tiers[t]++
				}
			}
		}
		for n, a := range perNode {
			if got := st.holderMask(n, uint32(wid)); got != a.mask {
				return fmt.Errorf("%v at node %d: residency mask %b, entries say %b", ws.key, n, got, a.mask)
			}
			al, ok := ws.aliases[n]
			if ok != (a.entries > 1) || (ok && (al.entries != a.entries || al.tiers != a.tiers)) {
				return fmt.Errorf("%v at node %d: alias record %+v (present %v), entries say %d %v", ws.key, n, al, ok, a.entries, a.tiers)
			}
		}
		if len(ws.aliases) > len(perNode) {
			return fmt.Errorf("%v has stale alias records", ws.key)
		}
		for i := uint32(1); int(i) < st.nodes.len(); i++ {
			if st.nodes.at(i).parent != noNode && st.holderMask(i, uint32(wid)) != 0 && perNode[i] == nil {
				return fmt.Errorf("%v holds node %d without an entry", ws.key, i)
			}
		}
		waiting := 0
		for p, kids := range ws.waiting {
			if _, ok := ws.blocks.get(p); ok {
				return fmt.Errorf("%v: detached blocks wait for attached %x", ws.key, p)
			}
			for _, c := range kids {
				if d, ok := ws.detached[c]; !ok || d.parent != p {
					return fmt.Errorf("%v: waiting %x -> %x inconsistent", ws.key, p, c)
				}
				waiting++
			}
		}
		for h, d := range ws.detached {
			if d.tiers == 0 || d.tiers >= 1<<NumTiers {
				return fmt.Errorf("%v detached %x has tiers %d", ws.key, h, d.tiers)
			}
		}
		if waiting != len(ws.detached) {
			return fmt.Errorf("%v: %d waiting, %d detached", ws.key, waiting, len(ws.detached))
		}
		detached += len(ws.detached)
	}
	if detached != st.detached {
		return fmt.Errorf("detached count %d, actual %d", st.detached, detached)
	}
	if len(st.order) != len(st.workerIDs) {
		return fmt.Errorf("order has %d workers, %d interned", len(st.order), len(st.workerIDs))
	}
	for i, wid := range st.order {
		if st.rank[wid] != uint32(i) || (i > 0 && st.workers[st.order[i-1]].key.compare(st.workers[wid].key) >= 0) {
			return fmt.Errorf("worker order broken at %d", i)
		}
	}
	return nil
}

// checkHolderForm checks that n's holders are in the form holders.go describes:
// inline and packed while there are at most two, else spilled into a set of at
// least three whose planes cover exactly its holders.
func checkHolderForm(st *state, n *node) error {
	if n.more == 0 {
		if n.holders[0] == 0 && n.holders[1] != 0 {
			return fmt.Errorf("inline holders not packed: %x", n.holders)
		}
		return nil
	}
	if n.holders != [2]uint32{} {
		return fmt.Errorf("spilled, with inline holders %x", n.holders)
	}
	if int(n.more) >= len(st.sets) || slices.Contains(st.freeSets, n.more) {
		return fmt.Errorf("holder set %d is not in use", n.more)
	}
	s := &st.sets[n.more]
	if len(s.ids) < 3 {
		return fmt.Errorf("spilled with %d holders", len(s.ids))
	}
	if len(s.planes) != NumTiers*planeGroups(len(s.ids)) {
		return fmt.Errorf("%d plane words for %d holders", len(s.planes), len(s.ids))
	}
	if tail := len(s.ids) % 64; tail != 0 {
		for t, w := range s.planes[len(s.planes)-NumTiers:] {
			if w>>tail != 0 {
				return fmt.Errorf("tier %d plane has bits beyond the %d holders: %x", t, len(s.ids), w)
			}
		}
	}
	return nil
}

// appendHolders appends the residencies of node n's holders, in worker id order.
func appendHolders(st *state, dst []uint32, n uint32) []uint32 {
	nd := st.nodes.at(n)
	if nd.more == 0 {
		for _, r := range nd.holders {
			if r != 0 {
				dst = append(dst, r)
			}
		}
		return dst
	}
	s := &st.sets[nd.more]
	for i, wid := range s.ids {
		dst = append(dst, residency(wid, s.mask(i)))
	}
	return dst
}
