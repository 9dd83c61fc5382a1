package workerspec

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"unicode"

	"gopkg.in/yaml.v3"
)

// ErrInvalid is wrapped by every worker specification error; the message
// names the worker and the bad value.
var ErrInvalid = errors.New("invalid worker")

// Spec is what the indexer knows about one inference engine: who it is, which
// model it serves and where its event, replay and HTTP endpoints are. It mirrors
// kvindex.v1.Spec (the replicated registry entry).
type Spec struct {
	// ID names the worker in the index, in metrics and in NATS subjects: a pod
	// name, host:port, or any string without whitespace.
	ID    string `yaml:"id"`
	Model string `yaml:"model"`
	// BlockSize is the engine's tokens per block. 0 takes it from each event's
	// block_size, checked against the Manager's default block size when that is set.
	BlockSize int `yaml:"block-size"`
	// DPSize is the number of data-parallel ranks (0 means 1). Rank r publishes on
	// Endpoint's port + r and replays on Replay's port + r.
	DPSize int `yaml:"dp-size"`
	// Endpoint is the PUB endpoint of rank 0 to dial ("connect mode"). Empty when
	// the engine connects to the indexer's --zmq-bind socket or events come over NATS.
	Endpoint string `yaml:"endpoint"`
	// Topic is the ZMQ subscription prefix; empty subscribes to every topic.
	Topic string `yaml:"topic"`
	// Replay is the ROUTER replay endpoint of rank 0; empty when the engine keeps no
	// replay buffer (a gap then drops the worker's blocks).
	Replay string `yaml:"replay"`
	// HTTP is the engine's OpenAI-compatible base URL (for routers; ingest ignores it).
	HTTP string `yaml:"http"`
	// Role is "", "aggregated", "prefill" or "decode" (for routers; ingest ignores it).
	// "both", the fake engine's and vLLM-style spelling of aggregated, is read as
	// "aggregated".
	Role   string            `yaml:"role"`
	Labels map[string]string `yaml:"labels"`
}

// normalRole reads "both" as "aggregated".
func normalRole(r string) string {
	if r == "both" {
		return "aggregated"
	}
	return r
}

// Roles a Spec may name.
var workerRoles = []string{"", "aggregated", "prefill", "decode"}

func invalidWorker(id, format string, args ...any) error {
	if id == "" {
		return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
	}
	return fmt.Errorf("%w %q: %s", ErrInvalid, id, fmt.Sprintf(format, args...))
}

// Validate reports the first bad value of w.
func (w Spec) Validate() error {
	if w.ID == "" {
		return invalidWorker("", "id must not be empty")
	}
	if strings.IndexFunc(w.ID, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) >= 0 {
		return invalidWorker(w.ID, "id must not contain whitespace or control characters")
	}
	switch {
	case len(w.ID) > MaxNameBytes:
		return invalidWorker(w.ID[:32]+"...", "id is %d bytes, more than %d", len(w.ID), MaxNameBytes)
	case w.Model == "":
		return invalidWorker(w.ID, "model must not be empty")
	case len(w.Model) > MaxNameBytes:
		return invalidWorker(w.ID, "model is %d bytes, more than %d", len(w.Model), MaxNameBytes)
	case w.BlockSize < 0 || w.BlockSize > MaxBlockSize:
		return invalidWorker(w.ID, "block-size=%d must be between 1 and %d (0: from the events)", w.BlockSize, MaxBlockSize)
	case w.DPSize < 0 || w.DPSize > MaxDPSize:
		return invalidWorker(w.ID, "dp-size=%d must be between 1 and %d", w.DPSize, MaxDPSize)
	case !slices.Contains(workerRoles, w.Role):
		return invalidWorker(w.ID, "role=%q must be aggregated, prefill or decode", w.Role)
	}
	for _, ep := range []struct{ key, v string }{{"endpoint", w.Endpoint}, {"replay", w.Replay}} {
		if ep.v == "" {
			continue
		}
		for r := range w.Ranks() {
			if _, err := OffsetEndpoint(ep.v, r); err != nil {
				return invalidWorker(w.ID, "%s=%q for dp rank %d: %v", ep.key, ep.v, r, err)
			}
		}
	}
	return nil
}

// Bounds of a worker's block size and data-parallel size, shared by every reader of
// worker descriptions and engine events.
const (
	MaxBlockSize = 1 << 16
	MaxDPSize    = 1024
	// MaxNameBytes bounds a worker id and a model name (and, in queries, LoRA
	// names and cache salts): each is kept per worker on every replica, and
	// discovery takes them from whatever a publisher sends.
	MaxNameBytes = 256
)

// Ranks is the number of data-parallel ranks (DPSize, at least 1).
func (w Spec) Ranks() uint32 {
	if w.DPSize < 1 {
		return 1
	}
	return uint32(w.DPSize)
}

// EventEndpoint is the PUB endpoint of dp rank r ("" without Endpoint).
func (w Spec) EventEndpoint(r uint32) (string, error) {
	if w.Endpoint == "" {
		return "", nil
	}
	return OffsetEndpoint(w.Endpoint, r)
}

// ReplayEndpoint is the ROUTER endpoint of dp rank r ("" without Replay).
func (w Spec) ReplayEndpoint(r uint32) (string, error) {
	if w.Replay == "" {
		return "", nil
	}
	return OffsetEndpoint(w.Replay, r)
}

// Equal reports whether two specs say the same thing.
func (w Spec) Equal(o Spec) bool {
	return maps.Equal(w.Labels, o.Labels) && w.String() == o.String()
}

// OffsetEndpoint is the endpoint of dp rank r given rank 0's, as vLLM derives it
// (offset_endpoint_port): a tcp port grows by r, ipc and inproc endpoints get a
// "_dp<r>" suffix; rank 0 is the endpoint itself.
func OffsetEndpoint(ep string, r uint32) (string, error) {
	switch {
	case strings.HasPrefix(ep, "ipc://") || strings.HasPrefix(ep, "inproc://"):
		if len(ep) == strings.Index(ep, "://")+3 {
			return "", errors.New("empty address")
		}
		if r == 0 {
			return ep, nil
		}
		return ep + "_dp" + strconv.FormatUint(uint64(r), 10), nil
	case strings.HasPrefix(ep, "tcp://"):
		host, port, err := net.SplitHostPort(strings.TrimPrefix(ep, "tcp://"))
		if err != nil {
			return "", fmt.Errorf("want tcp://host:port: %w", err)
		}
		if host == "" {
			return "", errors.New("want tcp://host:port: empty host")
		}
		p, err := strconv.Atoi(port)
		if err != nil || p < 1 || p+int(r) > 65535 {
			return "", fmt.Errorf("port %q (+%d) is not a port", port, r)
		}
		return "tcp://" + net.JoinHostPort(host, strconv.Itoa(p+int(r))), nil
	}
	return "", errors.New("want a tcp://, ipc:// or inproc:// endpoint")
}

// Parse parses the --worker syntax: comma-separated key=value pairs with
// keys id, model, block-size, dp-size, endpoint, topic, replay, http, role and
// label.<name>, for example
//
//	id=w1,endpoint=tcp://10.0.0.5:5557,replay=tcp://10.0.0.5:5558,model=M,block-size=16,dp-size=2
//
// Values cannot contain commas. The result is validated.
func Parse(s string) (Spec, error) {
	var w Spec
	seen := map[string]bool{}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(kv, "=")
		k = strings.TrimSpace(k)
		if !ok || k == "" {
			return Spec{}, invalidWorker("", "--worker %q: %q is not key=value", s, kv)
		}
		if seen[k] {
			return Spec{}, invalidWorker("", "--worker %q: %s given twice", s, k)
		}
		seen[k] = true
		var err error
		switch k {
		case "id":
			w.ID = v
		case "model":
			w.Model = v
		case "block-size":
			w.BlockSize, err = strconv.Atoi(v)
		case "dp-size":
			w.DPSize, err = strconv.Atoi(v)
		case "endpoint":
			w.Endpoint = v
		case "topic":
			w.Topic = v
		case "replay":
			w.Replay = v
		case "http":
			w.HTTP = v
		case "role":
			w.Role = normalRole(v)
		default:
			name, isLabel := strings.CutPrefix(k, "label.")
			if !isLabel || name == "" {
				return Spec{}, invalidWorker("", "--worker %q: unknown key %q (want id, model, block-size, dp-size, endpoint, topic, replay, http, role or label.<name>)", s, k)
			}
			if w.Labels == nil {
				w.Labels = map[string]string{}
			}
			w.Labels[name] = v
		}
		if err != nil {
			return Spec{}, invalidWorker("", "--worker %q: %s=%q is not an integer", s, k, v)
		}
	}
	return w, w.Validate()
}

// String formats w in the --worker syntax (Parse's inverse).
func (w Spec) String() string {
	var b strings.Builder
	add := func(k, v string) {
		if v == "" {
			return
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(k + "=" + v)
	}
	add("id", w.ID)
	add("model", w.Model)
	if w.BlockSize != 0 {
		add("block-size", strconv.Itoa(w.BlockSize))
	}
	if w.DPSize != 0 {
		add("dp-size", strconv.Itoa(w.DPSize))
	}
	add("endpoint", w.Endpoint)
	add("topic", w.Topic)
	add("replay", w.Replay)
	add("http", w.HTTP)
	add("role", w.Role)
	keys := make([]string, 0, len(w.Labels))
	for k := range w.Labels {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		add("label."+k, w.Labels[k])
	}
	return b.String()
}

// List is a repeatable --worker flag.
type List []Spec

// String lists the workers in flag syntax, separated by spaces.
func (l *List) String() string {
	if l == nil {
		return ""
	}
	s := make([]string, len(*l))
	for i, w := range *l {
		s[i] = w.String()
	}
	return strings.Join(s, " ")
}

// Set parses one --worker value and appends it.
func (l *List) Set(v string) error {
	ws, err := ParseList(v)
	if err != nil {
		return err
	}
	*l = append(*l, ws...)
	return nil
}

// ParseList parses one flag value holding one worker spec or several
// separated by ';'. A spec uses ',' itself, and an environment variable is set
// once, so ';' is how KVINDEX_WORKER (or the router's) declares more than one.
func ParseList(v string) ([]Spec, error) {
	var ws []Spec
	for _, item := range strings.Split(v, ";") {
		if strings.TrimSpace(item) == "" {
			continue
		}
		w, err := Parse(item)
		if err != nil {
			return nil, err
		}
		ws = append(ws, w)
	}
	if len(ws) == 0 {
		return nil, fmt.Errorf("%q names no worker", v)
	}
	return ws, nil
}

// workersFile is the YAML layout of --workers-file:
//
//	workers:
//	  - id: w1
//	    endpoint: tcp://10.0.0.5:5557
//	    replay: tcp://10.0.0.5:5558
//	    model: meta-llama/Llama-3.1-8B-Instruct
//	    block-size: 16
//	    dp-size: 2
type workersFile struct {
	Workers []Spec `yaml:"workers"`
}

// ParseFile parses a workers file (YAML, see workersFile); unknown keys are
// errors, every worker is validated and ids must be unique. An empty document is
// an empty list.
func ParseFile(data []byte) ([]Spec, error) {
	var f workersFile
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	// io.EOF: an empty document.
	if err := dec.Decode(&f); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	seen := map[string]bool{}
	for i := range f.Workers {
		f.Workers[i].Role = normalRole(f.Workers[i].Role)
		w := f.Workers[i]
		if err := w.Validate(); err != nil {
			return nil, fmt.Errorf("workers[%d]: %w", i, err)
		}
		if seen[w.ID] {
			return nil, fmt.Errorf("workers[%d]: %w", i, invalidWorker(w.ID, "id listed twice"))
		}
		seen[w.ID] = true
	}
	return f.Workers, nil
}

// LoadFile reads and parses a workers file.
func LoadFile(path string) ([]Spec, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("workers file: %w", err)
	}
	ws, err := ParseFile(data)
	if err != nil {
		return nil, fmt.Errorf("workers file %s: %w", path, err)
	}
	return ws, nil
}
