package ledgerq

import (
	"errors"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	kvindexv1 "github.com/kvindex/kvindex/api/proto/kvindex/v1"
)

// SplitReport cuts a router's report into the messages it goes as: one, rep
// itself, when its loads fit in kvindexv1.LedgerMaxMessageBytes; otherwise
// several, each with at most that much of the loads on the wire (at least
// one), in order, each but the last with more set (load.proto). The first
// carries the rest of rep (full, decisions, bindings), the others the router
// id and their loads only. Nothing is copied but the slices' headers.
func SplitReport(rep *kvindexv1.ReportRequest) []*kvindexv1.ReportRequest {
	parts := splitLoads(rep.Loads)
	if len(parts) == 1 {
		return []*kvindexv1.ReportRequest{rep}
	}
	out := make([]*kvindexv1.ReportRequest, len(parts))
	for i, loads := range parts {
		out[i] = &kvindexv1.ReportRequest{RouterId: rep.RouterId, Loads: loads, More: i < len(parts)-1}
	}
	out[0].Full, out[0].Predicted, out[0].Sessions = rep.Full, rep.Predicted, rep.Sessions
	return out
}

// SplitPush cuts the leader's push as SplitReport a report: the first message
// carries the rest of resp (full, decisions, bindings), each carries routers;
// the sender numbers them (version).
func SplitPush(resp *kvindexv1.ReportResponse) []*kvindexv1.ReportResponse {
	parts := splitLoads(resp.Loads)
	if len(parts) == 1 {
		return []*kvindexv1.ReportResponse{resp}
	}
	out := make([]*kvindexv1.ReportResponse, len(parts))
	for i, loads := range parts {
		out[i] = &kvindexv1.ReportResponse{Routers: resp.Routers, Loads: loads, More: i < len(parts)-1}
	}
	out[0].Full, out[0].Predicted, out[0].Sessions = resp.Full, resp.Predicted, resp.Sessions
	return out
}

// splitLoads cuts loads into runs of at most LedgerMaxMessageBytes on the wire
// (at least one load each; no loads is one empty run).
func splitLoads(loads []*kvindexv1.TargetLoad) [][]*kvindexv1.TargetLoad {
	var parts [][]*kvindexv1.TargetLoad
	start, size := 0, 0
	for i, l := range loads {
		// loads is field 3 of a report and 1 of a push: a one-byte tag either way.
		s := protowire.SizeTag(3) + protowire.SizeBytes(proto.Size(l))
		if i > start && size+s > kvindexv1.LedgerMaxMessageBytes {
			parts = append(parts, loads[start:i:i])
			start, size = i, 0
		}
		size += s
	}
	return append(parts, loads[start:])
}

// Parts gathers the loads of one report or push, which may come as several
// messages (SplitReport, SplitPush), so that the receiver applies them
// together: a part of a full report or push must not be taken for the whole,
// which would clear, until the next part came, the targets listed in the
// others. The zero value is ready. Not safe for concurrent use.
type Parts struct {
	loads []*kvindexv1.TargetLoad // of the messages so far, known fields only
	full  bool
	open  bool // a message with more came, and the last has not
}

// ErrFullInParts: a full report or push began before the last message of the
// one before it, which a sender never does.
var ErrFullInParts = errors.New("a full load list began before the last message of the one before it")

// Len is how many loads the messages so far of a report or push listed.
func (p *Parts) Len() int { return len(p.loads) }

// Add takes one message's loads. Once it is the last of its report or push
// (more unset), done is true, loads are those of all its messages in order
// and full whether it is full, and p is empty again. While more are due, the
// loads are kept without their unknown fields, as the queue keeps messages
// (a peer could otherwise make the receiver hold a message's worth of unknown
// bytes per load); a report in one message is handed back as it came.
func (p *Parts) Add(full, more bool, msgLoads []*kvindexv1.TargetLoad) (loads []*kvindexv1.TargetLoad, isFull, done bool, err error) {
	if p.open && full {
		return nil, false, false, ErrFullInParts
	}
	if !p.open && !more {
		return msgLoads, full, true, nil
	}
	if !p.open {
		p.full, p.open = full, true
	}
	for _, l := range msgLoads {
		p.loads = append(p.loads, &kvindexv1.TargetLoad{Worker: l.Worker, DpRank: l.DpRank, InFlight: l.InFlight,
			PrefillTokens: l.PrefillTokens, DecodeBlocks: l.DecodeBlocks})
	}
	if more {
		return nil, false, false, nil
	}
	loads, isFull = p.loads, p.full
	*p = Parts{}
	return loads, isFull, true, nil
}

// Reset drops the messages so far (their stream ended).
func (p *Parts) Reset() { *p = Parts{} }
