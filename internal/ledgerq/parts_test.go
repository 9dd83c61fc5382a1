package ledgerq

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	kvindexv1 "github.com/kvindex/kvindex/api/proto/kvindex/v1"
)

// longLoads are n loads on targets with 250-byte names: ~260 bytes each on the
// wire, so 20,000 of them are over gRPC's 4 MiB.
func longLoads(n int) []*kvindexv1.TargetLoad {
	loads := make([]*kvindexv1.TargetLoad, n)
	for i := range loads {
		loads[i] = &kvindexv1.TargetLoad{Worker: fmt.Sprintf("%0250d", i), DpRank: uint32(i % 8), InFlight: uint32(i + 1),
			PrefillTokens: math.MaxUint64, DecodeBlocks: math.MaxUint64}
	}
	return loads
}

// A report or push whose loads are more than a message carries goes as
// several messages: each with at most LedgerMaxMessageBytes of loads, all of
// them in order, more on all but the last, full, decisions and bindings on
// the first only (a receiver that does not know more then applies the first as
// the whole view and the rest as changes), the router id or router count on
// each. One whose loads fit goes as it is.
func TestSplitCutsTheLoadsIntoMessages(t *testing.T) {
	loads := longLoads(20_000)
	pred := []*kvindexv1.PredictedPrefix{{Worker: "w", Keys: []uint64{1}, TtlMs: 1000}}
	sess := []*kvindexv1.SessionBinding{{Key: "k", Worker: "w", TtlMs: 1000}}
	rep := &kvindexv1.ReportRequest{RouterId: "r", Full: true, Loads: loads, Predicted: pred, Sessions: sess}
	push := &kvindexv1.ReportResponse{Full: true, Routers: 3, Loads: loads, Predicted: pred, Sessions: sess}
	if size := proto.Size(rep); size <= 4<<20 {
		t.Fatalf("the test's report is %d bytes, not over gRPC's 4 MiB", size)
	}
	type part struct {
		loads        []*kvindexv1.TargetLoad
		full, more   bool
		other        int // decisions and bindings
		id           string
		routers      uint32
		sectionBytes int
	}
	check := func(what string, parts []part, id string, routers uint32) {
		t.Helper()
		if len(parts) < 5 {
			t.Fatalf("%s: %d messages for %d bytes of loads", what, len(parts), proto.Size(&kvindexv1.ReportRequest{Loads: loads}))
		}
		var all []*kvindexv1.TargetLoad
		for i, p := range parts {
			first, last := i == 0, i == len(parts)-1
			if p.sectionBytes > kvindexv1.LedgerMaxMessageBytes || len(p.loads) == 0 {
				t.Errorf("%s: message %d carries %d loads, %d bytes (at most %d)", what, i, len(p.loads), p.sectionBytes, kvindexv1.LedgerMaxMessageBytes)
			}
			if p.more == last || p.full != first || (p.other == 2) != first || p.id != id || p.routers != routers {
				t.Errorf("%s: message %d of %d: more %v, full %v, %d decisions and bindings, router id %q, routers %d",
					what, i, len(parts), p.more, p.full, p.other, p.id, p.routers)
			}
			all = append(all, p.loads...)
		}
		if !slices.Equal(all, loads) {
			t.Errorf("%s: the messages carry %d loads, not the %d of the report in order", what, len(all), len(loads))
		}
	}
	var reqParts []part
	for _, m := range SplitReport(rep) {
		reqParts = append(reqParts, part{m.Loads, m.Full, m.More, len(m.Predicted) + len(m.Sessions), m.RouterId, 0,
			proto.Size(&kvindexv1.ReportRequest{Loads: m.Loads})})
	}
	check("report", reqParts, "r", 0)
	var pushParts []part
	for _, m := range SplitPush(push) {
		pushParts = append(pushParts, part{m.Loads, m.Full, m.More, len(m.Predicted) + len(m.Sessions), "", m.Routers,
			proto.Size(&kvindexv1.ReportResponse{Loads: m.Loads})})
	}
	check("push", pushParts, "", 3)

	small := &kvindexv1.ReportRequest{RouterId: "r", Full: true, Loads: loads[:100], Predicted: pred}
	if got := SplitReport(small); len(got) != 1 || got[0] != small {
		t.Errorf("a report that fits went as %d messages, or as a copy", len(got))
	}
	smallPush := &kvindexv1.ReportResponse{Routers: 2}
	if got := SplitPush(smallPush); len(got) != 1 || got[0] != smallPush {
		t.Errorf("a push with no loads went as %d messages, or as a copy", len(got))
	}
}

// The first message of a split report or push carries every field but the
// loads of the rest, including those added after this test was written; and
// Parts keeps every field of a load.
func TestSplitAndPartsCarryEveryField(t *testing.T) {
	loads := longLoads(10_000)
	for _, l := range loads {
		worker := l.Worker
		fill(t, l)
		l.Worker = worker // long, so that they go as several messages
	}
	rep := &kvindexv1.ReportRequest{}
	fill(t, rep)
	rep.More = false // what the sender sets on the messages, never on a report
	rep.Loads = loads
	rep.Predicted = []*kvindexv1.PredictedPrefix{{Worker: "w", Keys: []uint64{1}}}
	rep.Sessions = []*kvindexv1.SessionBinding{{Key: "k", Worker: "w"}}
	push := &kvindexv1.ReportResponse{}
	fill(t, push)
	push.More, push.Version = false, 0 // the sender's to set on each message
	push.Loads, push.Predicted, push.Sessions = loads, rep.Predicted, rep.Sessions

	var p Parts
	var gathered []*kvindexv1.TargetLoad
	reqs := SplitReport(rep)
	for _, m := range reqs {
		got, _, done, err := p.Add(m.Full, m.More, m.Loads)
		if err != nil {
			t.Fatal(err)
		}
		if done {
			gathered = got
		}
	}
	whole := proto.Clone(reqs[0]).(*kvindexv1.ReportRequest)
	whole.Loads, whole.More = gathered, false
	if len(reqs) < 2 || !proto.Equal(whole, rep) {
		t.Errorf("a report split in %d messages and gathered again differs from the report", len(reqs))
	}
	pushes := SplitPush(push)
	for _, m := range pushes {
		if got, _, done, _ := p.Add(m.Full, m.More, m.Loads); done {
			gathered = got
		}
	}
	wholePush := proto.Clone(pushes[0]).(*kvindexv1.ReportResponse)
	wholePush.Loads, wholePush.More = gathered, false
	if len(pushes) < 2 || !proto.Equal(wholePush, push) {
		t.Errorf("a push split in %d messages and gathered again differs from the push", len(pushes))
	}
}

// Parts hands back a report's loads once its last message came, all of them,
// full when its first was; a report in one message as it came; a full one
// that begins before the last message of the one before is refused; and the
// loads kept meanwhile hold no unknown fields.
func TestPartsGatherAReport(t *testing.T) {
	loads := longLoads(20_000)
	blob := protowire.AppendBytes(protowire.AppendTag(nil, 99, protowire.BytesType), make([]byte, 1<<10))
	loads[7].ProtoReflect().SetUnknown(blob)
	for _, full := range []bool{true, false} {
		msgs := SplitReport(&kvindexv1.ReportRequest{RouterId: "r", Full: full, Loads: loads})
		var p Parts
		sent := 0
		for i, m := range msgs {
			got, isFull, done, err := p.Add(m.Full, m.More, m.Loads)
			sent += len(m.Loads)
			switch {
			case err != nil:
				t.Fatalf("full %v, message %d: %v", full, i, err)
			case done != (i == len(msgs)-1):
				t.Fatalf("full %v: done %v after message %d of %d", full, done, i, len(msgs))
			case !done && p.Len() != sent:
				t.Fatalf("full %v: Len %d after message %d, %d loads sent", full, p.Len(), i, sent)
			case !done:
				continue
			}
			if isFull != full || len(got) != len(loads) || p.Len() != 0 {
				t.Fatalf("full %v: gathered %d loads, full %v (%d left)", full, len(got), isFull, p.Len())
			}
			for j, l := range loads {
				want := proto.CloneOf(l)
				want.ProtoReflect().SetUnknown(nil)
				if !proto.Equal(got[j], want) {
					t.Fatalf("load %d gathered as %v, sent as %v", j, got[j], l)
				}
			}
			if n := len(got[7].ProtoReflect().GetUnknown()); n != 0 {
				t.Errorf("a gathered load holds %d bytes of unknown fields", n)
			}
		}
	}
	if len(loads[7].ProtoReflect().GetUnknown()) != len(blob) {
		t.Error("the sender's load was modified")
	}

	var p Parts
	one := loads[:3]
	if got, full, done, err := p.Add(true, false, one); err != nil || !done || !full || &got[0] != &one[0] {
		t.Errorf("a report in one message: done %v, full %v, %v; want it handed back as it came", done, full, err)
	}
	if _, _, done, err := p.Add(true, true, one); done || err != nil {
		t.Fatalf("the first of several messages: done %v, %v", done, err)
	}
	if _, _, _, err := p.Add(true, false, one); !errors.Is(err, ErrFullInParts) || !strings.Contains(err.Error(), "full") {
		t.Errorf("a full report before the last message of the one before: %v, want ErrFullInParts", err)
	}
}

// LedgerMinRecvBytes, the receive limit both sides need, holds the largest
// message a report or push can be: a message's worth of the smallest decisions
// and bindings (the most framing), of loads on targets with the longest
// names, and the longest router id.
func TestLargestMessageFitsLedgerMinRecvBytes(t *testing.T) {
	var q Queue
	name := strings.Repeat("w", 256) // the longest name the leader accepts (server.MaxNameBytes)
	for i := range kvindexv1.LedgerMaxQueued {
		// ~256 bytes each: a message's worth of the most decisions a queue holds.
		q.AddPredicted(t0, &kvindexv1.PredictedPrefix{Worker: name[:200], Keys: []uint64{uint64(i)}, TtlMs: 60000, RouterId: name[:40]})
		q.AddSessions(t0, &kvindexv1.SessionBinding{Key: fmt.Sprintf("%0240d", i), Worker: "w", TtlMs: 60000})
	}
	pred, sess, _ := q.Take(t0)
	loads := make([]*kvindexv1.TargetLoad, 1<<16)
	for i := range loads {
		loads[i] = &kvindexv1.TargetLoad{Worker: name, DpRank: math.MaxUint32, InFlight: math.MaxUint32,
			PrefillTokens: math.MaxUint64, DecodeBlocks: math.MaxUint64}
	}
	rep := SplitReport(&kvindexv1.ReportRequest{RouterId: name, Full: true, Loads: loads, Predicted: pred, Sessions: sess})[0]
	push := SplitPush(&kvindexv1.ReportResponse{Full: true, Routers: math.MaxUint32, Version: math.MaxUint64,
		Loads: loads, Predicted: pred, Sessions: sess})[0]
	for what, m := range map[string]proto.Message{"report": rep, "push": push} {
		if size := proto.Size(m); size > kvindexv1.LedgerMinRecvBytes || size < 3*kvindexv1.LedgerMaxMessageBytes-64<<10 {
			t.Errorf("the largest %s is %d bytes: LedgerMinRecvBytes (%d) must hold it, and this test must build it (about 3 MiB)",
				what, size, kvindexv1.LedgerMinRecvBytes)
		}
	}
	if kvindexv1.LedgerMinRecvBytes > 4<<20 {
		t.Errorf("LedgerMinRecvBytes %d is over the 4 MiB routers receive (gRPC's default)", kvindexv1.LedgerMinRecvBytes)
	}
}
