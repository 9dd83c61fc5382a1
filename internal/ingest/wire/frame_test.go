package wire

import (
	"bytes"
	"errors"
	"reflect"
	"testing"
)

func be(seq uint64) []byte { return ReplayRequest(seq)[1] }

var endMarker = []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

func TestParseFrame(t *testing.T) {
	payload := []byte{0x92, 0x00, 0x90}
	cases := []struct {
		name    string
		parts   [][]byte
		want    Frame
		wantErr string
	}{
		{name: "topic, seq, payload", parts: [][]byte{[]byte("kv@p@m"), be(42), payload},
			want: Frame{Topic: "kv@p@m", Seq: 42, Payload: payload}},
		{name: "empty topic", parts: [][]byte{{}, be(0), payload}, want: Frame{Seq: 0, Payload: payload}},
		{name: "largest seq", parts: [][]byte{{}, be(1<<64 - 2), payload}, want: Frame{Seq: 1<<64 - 2, Payload: payload}},
		{name: "end marker's seq", parts: [][]byte{{}, endMarker, payload}, wantErr: "end marker's seq"},
		{name: "two parts", parts: [][]byte{be(1), payload}, wantErr: "2 parts"},
		{name: "four parts", parts: [][]byte{{}, {}, be(1), payload}, wantErr: "4 parts"},
		{name: "short seq", parts: [][]byte{{}, {0, 1}, payload}, wantErr: "sequence number has 2 bytes"},
		{name: "long seq", parts: [][]byte{{}, make([]byte, 9), payload}, wantErr: "sequence number has 9 bytes"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := ParseFrame(c.parts)
			if c.wantErr != "" {
				if !errors.Is(err, ErrBadFrame) || !bytes.Contains([]byte(err.Error()), []byte(c.wantErr)) {
					t.Fatalf("got %v, want ErrBadFrame saying %q", err, c.wantErr)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, c.want) {
				t.Fatalf("got %+v, %v; want %+v", got, err, c.want)
			}
		})
	}
}

func TestReplayRequestIsDelimiterAndBigEndianSeq(t *testing.T) {
	got := ReplayRequest(0x0102030405060708)
	want := [][]byte{{}, {1, 2, 3, 4, 5, 6, 7, 8}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %x, want %x", got, want)
	}
}

func TestParseReplayReply(t *testing.T) {
	payload := []byte{0x92, 0x00, 0x90}
	cases := []struct {
		name    string
		parts   [][]byte
		want    Frame
		wantEnd bool
		wantErr string
	}{
		{name: "vLLM with topic", parts: [][]byte{{}, []byte("kv@p@m"), be(7), payload},
			want: Frame{Topic: "kv@p@m", Seq: 7, Payload: payload}},
		{name: "SGLang without topic", parts: [][]byte{{}, be(7), payload}, want: Frame{Seq: 7, Payload: payload}},
		{name: "vLLM end marker", parts: [][]byte{{}, {}, endMarker, {}}, want: Frame{Seq: EndOfReplaySeq}, wantEnd: true},
		{name: "SGLang end marker", parts: [][]byte{{}, endMarker, {}}, want: Frame{Seq: EndOfReplaySeq}, wantEnd: true},
		{name: "missing delimiter", parts: [][]byte{[]byte("id"), be(7), payload}, wantErr: "want the empty delimiter"},
		{name: "too few parts", parts: [][]byte{{}, be(7)}, wantErr: "2 parts"},
		{name: "too many parts", parts: [][]byte{{}, {}, {}, be(7), payload}, wantErr: "5 parts"},
		{name: "bad seq", parts: [][]byte{{}, {1, 2, 3}, payload}, wantErr: "3 bytes"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, end, err := ParseReplayReply(c.parts)
			if c.wantErr != "" {
				if !errors.Is(err, ErrBadFrame) || !bytes.Contains([]byte(err.Error()), []byte(c.wantErr)) {
					t.Fatalf("got %v, want ErrBadFrame saying %q", err, c.wantErr)
				}
				return
			}
			if err != nil || end != c.wantEnd || !reflect.DeepEqual(got, c.want) {
				t.Fatalf("got %+v end=%v err=%v; want %+v end=%v", got, end, err, c.want, c.wantEnd)
			}
		})
	}
}

func TestParseTopic(t *testing.T) {
	cases := []struct {
		topic, worker, model string
		ok                   bool
	}{
		{"kv@vllm-0@meta-llama/Llama-3.1-8B-Instruct", "vllm-0", "meta-llama/Llama-3.1-8B-Instruct", true},
		{"kv@pod@model@with@ats", "pod", "model@with@ats", true},
		{"kv@pod@", "", "", false},
		{"kv@@model", "", "", false},
		{"kv@pod", "", "", false},
		{"KV@pod@model", "", "", false},
		{"", "", "", false},
		{"kv-events", "", "", false},
	}
	for _, c := range cases {
		worker, model, err := ParseTopic(c.topic)
		if !c.ok {
			if !errors.Is(err, ErrBadTopic) {
				t.Errorf("ParseTopic(%q): got %q, %q, %v; want ErrBadTopic", c.topic, worker, model, err)
			}
			continue
		}
		if err != nil || worker != c.worker || model != c.model {
			t.Errorf("ParseTopic(%q) = %q, %q, %v; want %q, %q", c.topic, worker, model, err, c.worker, c.model)
		}
		if back := FormatTopic(worker, model); back != c.topic {
			t.Errorf("FormatTopic(%q, %q) = %q, want %q", worker, model, back, c.topic)
		}
	}
}

// FuzzParseFrame checks that no message panics ParseFrame, that every error is
// ErrBadFrame, and that a parsed frame never carries the end marker's seq (a
// stream that took it would have no seq left after it).
func FuzzParseFrame(f *testing.F) {
	payload := []byte{0x92, 0x00, 0x90}
	f.Add([]byte("kv@p@m"), be(42), payload)
	f.Add([]byte{}, endMarker, payload)
	f.Add([]byte{}, be(1<<64-2), payload)
	f.Add([]byte{}, []byte{1, 2}, payload)
	f.Fuzz(func(t *testing.T, topic, seq, payload []byte) {
		got, err := ParseFrame([][]byte{topic, seq, payload})
		if err != nil {
			if !errors.Is(err, ErrBadFrame) {
				t.Fatalf("error %v is not ErrBadFrame", err)
			}
			return
		}
		if got.Seq == EndOfReplaySeq {
			t.Fatalf("ParseFrame took the end marker's seq in a live frame")
		}
		if got.Topic != string(topic) || !bytes.Equal(got.Payload, payload) {
			t.Fatalf("got %+v from topic %q payload %x", got, topic, payload)
		}
	})
}
