package router

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
)

// maxPrefillBody bounds what the router reads of a prefill worker's answer.
const maxPrefillBody = 16 << 20

// prefillRequest is vLLM's prefill leg (its disaggregated-serving proxy): the
// original body asking the prefill engine to keep the KV for a remote decode,
// produce one token and answer in one piece.
func prefillRequest(body []byte, ep endpoint) ([]byte, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, err
	}
	m["kv_transfer_params"] = json.RawMessage(`{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`)
	m["stream"] = json.RawMessage("false")
	m["max_tokens"] = json.RawMessage("1")
	if _, ok := m["max_completion_tokens"]; ok || ep == endpointChat {
		m["max_completion_tokens"] = json.RawMessage("1")
	}
	delete(m, "stream_options")
	return json.Marshal(m)
}

// withKVTransfer is the decode leg's body: the original request carrying the
// prefill engine's kv_transfer_params.
func withKVTransfer(body []byte, kv json.RawMessage) ([]byte, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, err
	}
	m["kv_transfer_params"] = kv
	return json.Marshal(m)
}

// prefillLeg runs the prefill leg: on the decision's prefill target, then, while
// retries remain, on other prefill workers. It returns the kv_transfer_params for
// the decode leg and the worker that produced them, or false when every try
// failed (the decode worker then prefills locally: decode never waits on a dead
// prefill).
func (r *Router) prefillLeg(ctx context.Context, p *prepared, d *Decision) (json.RawMessage, string, bool) {
	body, err := prefillRequest(p.body, p.endpoint)
	if err != nil {
		r.breakers.Record(d.Prefill.Worker, OutcomeNeutral, d.prefillProbe)
		return nil, "", false
	}
	target, res, probe := *d.Prefill, d.prefillRes, d.prefillProbe
	tried := map[string]bool{}
	for attempt := 0; ; attempt++ {
		kv, err := r.runPrefill(ctx, p, target, body, res, probe)
		res.Release()
		if err == nil {
			return kv, target.Worker, true
		}
		if ctx.Err() != nil {
			return nil, "", false
		}
		r.log.Debug("prefill leg failed", "worker", target.Worker, "err", err)
		tried[target.Worker] = true
		if attempt >= r.cfg.RequestMaxRetries {
			return nil, "", false
		}
		r.metrics.retries.WithLabelValues("prefill_failed").Inc()
		if target, res, probe, err = r.pickPrefill(ctx, p, tried); err != nil {
			return nil, "", false
		}
	}
}

// runPrefill sends one prefill leg and returns its kv_transfer_params; probe says
// whether it is t's half-open breaker probe (its outcome is recorded either way).
func (r *Router) runPrefill(ctx context.Context, p *prepared, t Target, body []byte, res *Reservation, probe bool) (json.RawMessage, error) {
	w := r.fleet.View().byID[t.Worker]
	if w == nil {
		r.breakers.Record(t.Worker, OutcomeNeutral, probe)
		return nil, fmt.Errorf("prefill worker %s left the fleet", t.Worker)
	}
	resp, first, stop, fail := r.start(ctx, &leg{target: t, worker: w, path: p.path, body: body, header: p.header, res: res})
	if fail != nil {
		outcome := fail.outcome()
		if ctx.Err() != nil {
			outcome = OutcomeNeutral
		}
		r.breakers.Record(w.ID, outcome, probe)
		return nil, fail
	}
	defer stop()
	defer resp.Body.Close()
	res.FirstByte()
	rest, err := io.ReadAll(io.LimitReader(resp.Body, maxPrefillBody))
	if err != nil {
		r.breakers.Record(w.ID, OutcomeFailure, probe)
		return nil, fmt.Errorf("prefill worker %s: reading the answer: %w", w.ID, err)
	}
	r.breakers.Record(w.ID, OutcomeSuccess, probe)
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("prefill worker %s answered %s", w.ID, resp.Status)
	}
	var answer struct {
		KVTransferParams json.RawMessage `json:"kv_transfer_params"`
	}
	if err := json.Unmarshal(append(first, rest...), &answer); err != nil {
		return nil, fmt.Errorf("prefill worker %s: %w", w.ID, err)
	}
	if len(answer.KVTransferParams) == 0 || string(answer.KVTransferParams) == "null" {
		return nil, fmt.Errorf("prefill worker %s returned no kv_transfer_params", w.ID)
	}
	return answer.KVTransferParams, nil
}
