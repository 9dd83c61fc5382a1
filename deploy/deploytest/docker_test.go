package deploytest

import (
	"bytes"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/kvindex/kvindex/bench/fakeengine"
	"github.com/kvindex/kvindex/internal/router"
	"github.com/kvindex/kvindex/internal/server"
	"github.com/kvindex/kvindex/internal/workerspec"
)

const dockerDir = "../docker"

// parsed is what one binary's own flag parser made of an argument list: the
// addresses it listens on (by flag) and the parsed config for cross-checks.
type parsed struct {
	listens map[string]string // flag -> host:port
	indexer *server.Config
	router  *router.Config
	engine  *fakeengine.Config
}

// An image per Dockerfile.<name>, built from ./cmd/<name>. parse runs args
// through that binary's real parser, which starts from its DefaultConfig(), so
// the ports below are the binaries' own, not copies.
var images = map[string]func(args []string) (parsed, error){
	"indexer": func(args []string) (parsed, error) {
		// An operator supplies the admin token through the environment.
		cfg, err := server.ParseFlags(args, io.Discard, env("KVINDEX_ADMIN_TOKEN", "secret"))
		if err != nil {
			return parsed{}, err
		}
		l := map[string]string{"--grpc-addr": cfg.GRPCAddr, "--http-addr": cfg.HTTPAddr, "--raft-addr": cfg.Raft.RaftAddr}
		if cfg.Ingest.ZMQBind != "" {
			l["--zmq-bind"] = zmqHostPort(cfg.Ingest.ZMQBind)
		}
		return parsed{listens: l, indexer: &cfg}, nil
	},
	"router": func(args []string) (parsed, error) {
		cfg, err := router.ParseFlags(args, io.Discard, env())
		if err != nil {
			return parsed{}, err
		}
		l := map[string]string{"--listen": cfg.Listen}
		if cfg.EPP.Addr != "" {
			l["--epp-addr"] = cfg.EPP.Addr
		}
		return parsed{listens: l, router: &cfg}, nil
	},
	"fakeengine": func(args []string) (parsed, error) {
		cfg, err := fakeengine.ParseFlags(args, io.Discard, env())
		if err != nil {
			return parsed{}, err
		}
		l := map[string]string{"--port": net.JoinHostPort(cfg.Host, strconv.Itoa(cfg.Port))}
		for flag, ep := range map[string]string{"--kv-events-endpoint": cfg.KVEventsEndpoint, "--kv-events-replay-endpoint": cfg.KVEventsReplayEndpoint} {
			if strings.Contains(ep, "*") { // binds (vLLM's rule); otherwise it dials out
				l[flag] = zmqHostPort(ep)
			}
		}
		return parsed{listens: l, engine: &cfg}, nil
	},
	// kvctl is a client: it listens on nothing and its image exposes nothing.
	"kvctl": nil,
}

// zmqHostPort turns tcp://*:5557 into 0.0.0.0:5557 (and tcp://h:p into h:p).
func zmqHostPort(ep string) string {
	hp := strings.TrimPrefix(ep, "tcp://")
	if h, p, err := net.SplitHostPort(hp); err == nil && h == "*" {
		return net.JoinHostPort("0.0.0.0", p)
	}
	return hp
}

func portsOf(t *testing.T, listens map[string]string) []string {
	var ports []string
	for _, a := range listens {
		ports = append(ports, strconv.Itoa(int(portOf(t, a))))
	}
	slices.Sort(ports)
	return slices.Compact(ports)
}

// goBuild is the build stage's `go build` line, as the image smoke test
// (scripts/image-smoke.sh) replays it.
type goBuild struct {
	cgo, out, pkg string
}

var goBuildLine = regexp.MustCompile(`(?:^|&&\s*)(?:CGO_ENABLED=(\d)\s+)?go build\s+(.*)$`)

func parseGoBuild(run string) (goBuild, bool) {
	m := goBuildLine.FindStringSubmatch(run)
	if m == nil {
		return goBuild{}, false
	}
	b := goBuild{cgo: m[1]}
	f := strings.Fields(m[2])
	for i, a := range f {
		if a == "-o" && i+1 < len(f) {
			b.out = f[i+1]
		}
	}
	if len(f) > 0 {
		b.pkg = f[len(f)-1]
	}
	return b, true
}

// importsZMQ reports whether ./cmd/name links libzmq (through pebbe/zmq4),
// which decides whether its image needs cgo and libzmq5.
func importsZMQ(t *testing.T, name string) bool {
	cmd := exec.Command("go", "list", "-deps", "./cmd/"+name)
	cmd.Dir = "../.."
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps ./cmd/%s: %v", name, err)
	}
	return slices.Contains(strings.Fields(string(out)), "github.com/pebbe/zmq4")
}

func goMinor(t *testing.T) string {
	data, err := os.ReadFile("../../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindSubmatch(data)
	if m == nil {
		t.Fatal("go.mod has no go directive")
	}
	return string(m[1])
}

// TestDockerfiles checks each deploy/docker/Dockerfile.<name>: a golang build
// stage that builds ./cmd/<name> with cgo exactly when it links libzmq, on the
// Go of go.mod; a separate runtime stage that has libzmq5 when cgo is on, runs
// as a numeric non-root user, and whose exec-form ENTRYPOINT is the binary the
// COPY --from=build put there; EXPOSE equals the ports the binary listens on
// with its defaults and the image's CMD, none of them on loopback only.
func TestDockerfiles(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(dockerDir, "Dockerfile.*"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range files {
		names = append(names, strings.TrimPrefix(filepath.Base(f), "Dockerfile."))
	}
	want := slices.Sorted(func(yield func(string) bool) {
		for k := range images {
			if !yield(k) {
				return
			}
		}
	})
	if !slices.Equal(names, want) {
		t.Fatalf("Dockerfiles for %v, want one per image %v", names, want)
	}
	goVersion := goMinor(t)
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			stages, err := readDockerfile(filepath.Join(dockerDir, "Dockerfile."+name))
			if err != nil {
				t.Fatal(err)
			}
			if len(stages) < 2 {
				t.Fatalf("%d stage(s): want a build stage and a runtime stage", len(stages))
			}
			build, rt := stages[0], stages[len(stages)-1]
			if build.name != "build" || !strings.HasPrefix(build.base, "golang:"+goVersion+"-") {
				t.Errorf("first stage FROM %s AS %s: want golang:%s-* AS build (go.mod's Go)", build.base, build.name, goVersion)
			}
			if rt.name == "build" || strings.HasPrefix(rt.base, "golang:") {
				t.Errorf("runtime stage FROM %s: must not be the build image", rt.base)
			}

			// Build: go build ... -o OUT ./cmd/<name>, cgo iff the binary links libzmq.
			var gb goBuild
			for _, in := range build.all("RUN") {
				if b, ok := parseGoBuild(in.args); ok {
					gb = b
				}
			}
			if gb.pkg != "./cmd/"+name || gb.out == "" {
				t.Fatalf("build stage builds %q -o %q: want ./cmd/%s with -o", gb.pkg, gb.out, name)
			}
			zmq := importsZMQ(t, name)
			if wantCGO := map[bool]string{true: "1", false: "0"}[zmq]; gb.cgo != wantCGO {
				t.Errorf("go build with CGO_ENABLED=%q: ./cmd/%s links libzmq: %v, want CGO_ENABLED=%s", gb.cgo, name, zmq, wantCGO)
			}
			libzmq := slices.ContainsFunc(rt.all("RUN"), func(in instruction) bool {
				return regexp.MustCompile(`apt-get install .*\blibzmq5\b`).MatchString(in.args)
			})
			if libzmq != zmq {
				t.Errorf("runtime stage installs libzmq5: %v, binary links libzmq: %v", libzmq, zmq)
			}

			// Runtime: USER, COPY --from=build, ENTRYPOINT.
			user, ok := rt.last("USER")
			if !ok {
				t.Fatal("runtime stage has no USER: it would run as root")
			}
			uid, gid, _ := strings.Cut(user.args, ":")
			if n, err := strconv.Atoi(uid); err != nil || n == 0 {
				t.Errorf("USER %s: want a numeric non-root uid (Kubernetes' runAsNonRoot cannot check a name)", user.args)
			}
			if _, err := strconv.Atoi(gid); gid != "" && err != nil {
				t.Errorf("USER %s: want a numeric gid", user.args)
			}
			var dest string
			for _, in := range rt.all("COPY") {
				f := strings.Fields(in.args)
				if len(f) == 3 && f[0] == "--from=build" && f[1] == gb.out {
					dest = f[2]
				}
			}
			if dest == "" {
				t.Fatalf("runtime stage does not COPY --from=build %s", gb.out)
			}
			ep, ok := rt.last("ENTRYPOINT")
			if !ok {
				t.Fatal("runtime stage has no ENTRYPOINT")
			}
			argv, err := execForm(ep)
			if err != nil {
				t.Fatal(err)
			}
			if argv[0] != dest {
				t.Errorf("ENTRYPOINT runs %s, but the binary was copied to %s", argv[0], dest)
			}

			// EXPOSE: the ports the binary listens on by default (DefaultConfig
			// and the image's CMD, through its own parser).
			var exposed []string
			for _, in := range rt.all("EXPOSE") {
				for _, p := range strings.Fields(in.args) {
					exposed = append(exposed, strings.TrimSuffix(p, "/tcp"))
				}
			}
			slices.Sort(exposed)
			parse := images[name]
			if parse == nil {
				if len(exposed) > 0 {
					t.Errorf("EXPOSE %v: %s listens on nothing", exposed, name)
				}
				return
			}
			args := argv[1:]
			if cmd, ok := rt.last("CMD"); ok {
				c, err := execForm(cmd)
				if err != nil {
					t.Fatal(err)
				}
				args = append(args, c...)
			}
			p, err := parse(args)
			if err != nil {
				t.Fatalf("%s refuses the image's default arguments %q: %v", name, args, err)
			}
			// Only raft may stay on loopback: the image's default is a single
			// node, which no peer dials (clusters set --raft-addr and
			// --raft-advertise); every other listener serves clients.
			outside := map[string]string{}
			for flag, a := range p.listens {
				h, _, _ := net.SplitHostPort(a)
				switch loopback := h == "localhost" || net.ParseIP(h).IsLoopback(); {
				case loopback && flag == "--raft-addr":
				case loopback:
					t.Errorf("with the image's defaults %s=%s: loopback is unreachable from outside the container; set it in CMD", flag, a)
				default:
					outside[flag] = a
				}
			}
			if got := portsOf(t, outside); !slices.Equal(got, exposed) {
				t.Errorf("EXPOSE %v, but with the image's defaults %s listens beyond loopback on %v (%v)", exposed, name, got, p.listens)
			}
		})
	}
}

// composeService is the subset of the Compose spec compose.yaml may use;
// decoding is strict, so a field outside it fails the test.
type composeService struct {
	Build struct {
		Context    string `yaml:"context"`
		Dockerfile string `yaml:"dockerfile"`
	} `yaml:"build"`
	Image     string   `yaml:"image"`
	Command   []string `yaml:"command"`
	Ports     []string `yaml:"ports"`
	Volumes   []string `yaml:"volumes"`
	DependsOn []string `yaml:"depends_on"`
}

type composeFile struct {
	Engine   composeService            `yaml:"x-engine"`
	Services map[string]composeService `yaml:"services"`
	Volumes  map[string]struct{}       `yaml:"volumes"`
}

// composeTopology is compose.yaml decoded, each service's command run through
// its binary's parser.
type composeTopology struct {
	file    composeFile
	image   map[string]string // service -> image name (Dockerfile.<name>)
	parsed  map[string]parsed
	engines []string // services running fakeengine, sorted
}

func loadCompose(t *testing.T) composeTopology {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dockerDir, "compose.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	c := composeTopology{image: map[string]string{}, parsed: map[string]parsed{}}
	if err := dec.Decode(&c.file); err != nil {
		t.Fatalf("compose.yaml: %v", err)
	}
	for svc, s := range c.file.Services {
		df := filepath.Join(dockerDir, s.Build.Context, s.Build.Dockerfile)
		if _, err := os.Stat(df); err != nil || s.Build.Context != "../.." {
			t.Fatalf("service %s: build %+v: want context ../.. (the repository) and an existing Dockerfile: %v", svc, s.Build, err)
		}
		name := strings.TrimPrefix(filepath.Base(df), "Dockerfile.")
		parse, ok := images[name]
		if !ok || parse == nil {
			t.Fatalf("service %s: %s is not a server image", svc, df)
		}
		if repo, _, _ := strings.Cut(s.Image, ":"); repo != "kvindex/"+name {
			t.Errorf("service %s: image %q, want kvindex/%s:<tag> (built from %s)", svc, s.Image, name, df)
		}
		p, err := parse(s.Command)
		if err != nil {
			t.Fatalf("service %s: %s refuses the compose command %q: %v", svc, name, s.Command, err)
		}
		c.image[svc], c.parsed[svc] = name, p
		if name == "fakeengine" {
			c.engines = append(c.engines, svc)
		}
	}
	slices.Sort(c.engines)
	return c
}

// service returns the compose service a host:port names and the flag of that
// service listening on the port, or fails the test.
func (c composeTopology) service(t *testing.T, from, hostPort, wantImage string) (string, parsed) {
	t.Helper()
	h, p, err := net.SplitHostPort(hostPort)
	if err != nil {
		t.Fatalf("%s: %q: %v", from, hostPort, err)
	}
	if c.image[h] != wantImage {
		t.Fatalf("%s: %s is not a %s service of compose.yaml", from, hostPort, wantImage)
	}
	pp := c.parsed[h]
	if !slices.Contains(portsOf(t, pp.listens), p) {
		t.Fatalf("%s: service %s does not listen on port %s (it listens on %v)", from, h, p, pp.listens)
	}
	return h, pp
}

// TestComposeTopology checks compose.yaml against the binaries: every
// command is accepted by its binary's own parser, every build names an
// existing Dockerfile, and the services agree on how they reach each other.
func TestComposeTopology(t *testing.T) {
	c := loadCompose(t)
	var indexers, routers []string
	for svc, img := range c.image {
		switch img {
		case "indexer":
			indexers = append(indexers, svc)
		case "router":
			routers = append(routers, svc)
		}
	}
	if len(indexers) != 1 || len(routers) != 1 || len(c.engines) < 2 {
		t.Fatalf("indexers %v, routers %v, engines %v: want the demo topology (1 indexer, 1 router, 2+ engines)", indexers, routers, c.engines)
	}
	ix, rt := c.parsed[indexers[0]].indexer, c.parsed[routers[0]].router

	for svc, s := range c.file.Services {
		for _, pm := range s.Ports {
			_, container, _ := strings.Cut(pm, ":")
			if !slices.Contains(portsOf(t, c.parsed[svc].listens), container) {
				t.Errorf("service %s publishes %q, but listens on %v", svc, pm, c.parsed[svc].listens)
			}
		}
		for _, d := range s.DependsOn {
			if _, ok := c.file.Services[d]; !ok {
				t.Errorf("service %s depends on unknown service %q", svc, d)
			}
		}
		for _, v := range s.Volumes {
			vol, target, _ := strings.Cut(v, ":")
			if _, ok := c.file.Volumes[vol]; !ok {
				t.Errorf("service %s mounts undeclared volume %q", svc, vol)
			}
			if c.image[svc] == "indexer" && target != ix.DataDir {
				t.Errorf("indexer mounts %s at %s, but --data-dir=%s", vol, target, ix.DataDir)
			}
		}
	}

	// The indexer advertises its raft address under its service name.
	if h, p, _ := net.SplitHostPort(ix.Raft.RaftAdvertise); h != indexers[0] || p != strconv.Itoa(int(portOf(t, ix.Raft.RaftAddr))) {
		t.Errorf("--raft-advertise=%s: want %s:<--raft-addr port>", ix.Raft.RaftAdvertise, indexers[0])
	}
	// The router asks the indexer service's gRPC port.
	for _, a := range rt.Indexer {
		if _, p := c.service(t, "router --indexer", a, "indexer"); portOf(t, p.indexer.GRPCAddr) != portOf(t, a) {
			t.Errorf("router --indexer=%s is not the indexer's --grpc-addr %s", a, p.indexer.GRPCAddr)
		}
	}
	if len(rt.Indexer) == 0 {
		t.Error("the router has no --indexer: the demo is kv-aware")
	}

	// Every engine is a worker of both, under the same id; the indexer dials
	// its event and replay sockets, the router its HTTP port; model and block
	// size agree.
	ixByEngine, rtByEngine := map[string]workerspec.Spec{}, map[string]workerspec.Spec{}
	for _, w := range ix.Ingest.Workers {
		from := "indexer --worker id=" + w.ID
		svc, p := c.service(t, from, strings.TrimPrefix(w.Endpoint, "tcp://"), "fakeengine")
		if w.Endpoint != "tcp://"+svc+":"+strconv.Itoa(int(portOf(t, p.listens["--kv-events-endpoint"]))) {
			t.Errorf("%s endpoint=%s is not %s's --kv-events-endpoint %s", from, w.Endpoint, svc, p.engine.KVEventsEndpoint)
		}
		if w.Replay != "tcp://"+svc+":"+strconv.Itoa(int(portOf(t, p.listens["--kv-events-replay-endpoint"]))) {
			t.Errorf("%s replay=%s is not %s's --kv-events-replay-endpoint %s", from, w.Replay, svc, p.engine.KVEventsReplayEndpoint)
		}
		if w.Model != p.engine.Model || w.BlockSize != p.engine.BlockSize {
			t.Errorf("%s model=%s block-size=%d, engine %s serves %s with blocks of %d", from, w.Model, w.BlockSize, svc, p.engine.Model, p.engine.BlockSize)
		}
		ixByEngine[svc] = w
	}
	for _, w := range rt.Workers {
		from := "router --worker id=" + w.ID
		u, err := url.Parse(w.HTTP)
		if err != nil || u.Scheme != "http" {
			t.Fatalf("%s http=%q: want http://service:port", from, w.HTTP)
		}
		svc, p := c.service(t, from, u.Host, "fakeengine")
		if portOf(t, u.Host) != portOf(t, p.listens["--port"]) {
			t.Errorf("%s http=%s is not engine %s's --port %d", from, w.HTTP, svc, p.engine.Port)
		}
		if w.Model != p.engine.Model || rt.BlockSize != p.engine.BlockSize {
			t.Errorf("%s model=%s (--block-size=%d), engine %s serves %s with blocks of %d", from, w.Model, rt.BlockSize, svc, p.engine.Model, p.engine.BlockSize)
		}
		rtByEngine[svc] = w
	}
	for _, e := range c.engines {
		if ixByEngine[e].ID == "" || ixByEngine[e].ID != rtByEngine[e].ID {
			t.Errorf("engine %s: indexer worker %q, router worker %q: want both, under the same id", e, ixByEngine[e].ID, rtByEngine[e].ID)
		}
	}
}
