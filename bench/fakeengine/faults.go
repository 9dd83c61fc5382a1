package fakeengine

import (
	"encoding/json"
	"fmt"
	"math"
	"time"
)

// faultsJSON is the body of GET and POST /admin/faults. In a POST every field is
// optional and only the given ones change, e.g.
//
//	{"fail_rate": 0.25, "fail_status": 429, "hang_before_first_token": "2s", "abort_after_tokens": 3}
type faultsJSON struct {
	DropEveryNBatches    *int     `json:"drop_every_n_batches,omitempty"`
	FailRate             *float64 `json:"fail_rate,omitempty"`
	FailStatus           *int     `json:"fail_status,omitempty"`
	HangBeforeFirstToken *string  `json:"hang_before_first_token,omitempty"`
	AbortAfterTokens     *int     `json:"abort_after_tokens,omitempty"`
	StallAfterTokens     *int     `json:"stall_after_tokens,omitempty"`
}

// MarshalJSON renders every field, the hang as a Go duration string.
func (f Faults) MarshalJSON() ([]byte, error) {
	hang := f.HangBeforeFirstToken.String()
	return json.Marshal(faultsJSON{&f.DropEveryNBatches, &f.FailRate, &f.FailStatus, &hang, &f.AbortAfterTokens, &f.StallAfterTokens})
}

// UnmarshalJSON sets the fields present in data (the MarshalJSON form).
func (f *Faults) UnmarshalJSON(data []byte) error {
	nf, err := f.apply(data)
	if err != nil {
		return err
	}
	*f = nf
	return nil
}

// patch applies the fields present in data to f and validates the result.
func (f Faults) patch(data []byte) (Faults, error) {
	f, err := f.apply(data)
	if err != nil {
		return f, err
	}
	if err := f.validate(); err != nil {
		return f, fmt.Errorf("%w: %v", ErrBadRequest, err)
	}
	return f, nil
}

func (f Faults) apply(data []byte) (Faults, error) {
	var p faultsJSON
	if err := json.Unmarshal(data, &p); err != nil {
		return f, fmt.Errorf("%w: faults: %v", ErrBadRequest, err)
	}
	if p.DropEveryNBatches != nil {
		f.DropEveryNBatches = *p.DropEveryNBatches
	}
	if p.FailRate != nil {
		f.FailRate = *p.FailRate
	}
	if p.FailStatus != nil {
		f.FailStatus = *p.FailStatus
	}
	if p.AbortAfterTokens != nil {
		f.AbortAfterTokens = *p.AbortAfterTokens
	}
	if p.StallAfterTokens != nil {
		f.StallAfterTokens = *p.StallAfterTokens
	}
	if p.HangBeforeFirstToken != nil {
		d, err := time.ParseDuration(*p.HangBeforeFirstToken)
		if err != nil {
			return f, fmt.Errorf("%w: hang_before_first_token=%q: %v", ErrBadRequest, *p.HangBeforeFirstToken, err)
		}
		f.HangBeforeFirstToken = d
	}
	return f, nil
}

// shouldFail spreads failures evenly: of the first k requests, floor(k*rate) fail.
// It is deterministic so tests can count.
func (e *Engine) shouldFail(rate float64) bool {
	if rate <= 0 {
		return false
	}
	k := float64(e.failSeq.Add(1) - 1)
	return math.Floor((k+1)*rate) > math.Floor(k*rate)
}
