#!/usr/bin/env bash
# Image smoke test (`make test-images`, not part of `make test`): replays the
# RUNTIME stage of every deploy/docker/Dockerfile.* without a Docker engine, then
# starts compose.yaml's demo topology from those replayed stages and routes one
# chat completion through it.
#
# What it proves: the runtime stages as written — the RUN lines (apt-get install
# libzmq5 ca-certificates, useradd, mkdir) run in a Debian bookworm root, the
# binaries (built on this host with the Dockerfiles' own `go build` lines) find
# their shared libraries there, run as the Dockerfiles' USER (uid 65532) through
# their exec-form ENTRYPOINT, accept `--help` and compose.yaml's flags, and the
# topology answers.
# What it does NOT prove: the build stage (the golang:*-bookworm image, `go mod
# download` in it), the real base images (debian:bookworm-slim is stood in for by
# a debootstrap --variant=minbase bookworm; gcr.io/distroless/static-debian12 by
# an empty root holding only the binary, /etc/passwd with nonroot 65532, and CA
# certificates), Docker's networking, volumes and published ports (everything
# runs on this host's 127.0.0.1 with free ports in place of service names and
# fixed ports), or a real vLLM engine.
#
# Needs root (debootstrap, chroot, mount). The bookworm root is cached under
# .cache/image-smoke/ (gitignored); the first run downloads it (about 10 minutes
# here), later runs copy it.
set -euo pipefail

cd "$(dirname "$0")/.."
REPO=$PWD
CACHE=$REPO/.cache/image-smoke
BASE=$CACHE/bookworm-minbase
MIRROR=${MIRROR:-http://deb.debian.org/debian}
DEADLINE=${DEADLINE:-90} # seconds any one wait may take

[ "$(id -u)" -eq 0 ] || { echo "image-smoke: needs root (debootstrap, chroot)" >&2; exit 1; }
need=()
command -v debootstrap >/dev/null || need+=(debootstrap)
python3 -c 'import yaml' 2>/dev/null || need+=(python3-yaml)
command -v curl >/dev/null || need+=(curl)
if [ ${#need[@]} -gt 0 ]; then
  echo "image-smoke: installing ${need[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

start=$(date +%s)
step() { echo "== [$(($(date +%s) - start))s] $*"; }

if [ ! -f "$BASE/.kvindex-debootstrap-ok" ]; then
  step "debootstrap --variant=minbase bookworm into $BASE (cached for later runs)"
  rm -rf "$BASE.tmp"
  mkdir -p "$CACHE"
  debootstrap --variant=minbase bookworm "$BASE.tmp" "$MIRROR" >"$CACHE/debootstrap.log" 2>&1 ||
    { tail -20 "$CACHE/debootstrap.log" >&2; exit 1; }
  date -u >"$BASE.tmp/.kvindex-debootstrap-ok"
  mv "$BASE.tmp" "$BASE"
fi

WORK=$(mktemp -d "$CACHE/run.XXXXXX")
PIDS=()
MOUNTS=()
cleanup() {
  trap - EXIT INT TERM
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  for ((i = ${#MOUNTS[@]} - 1; i >= 0; i--)); do umount "${MOUNTS[i]}" 2>/dev/null || true; done
  if [ -n "${KEEP:-}" ]; then echo "image-smoke: kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Each Dockerfile's build `go build` line and runtime stage, as files under $WORK/<image>/.
python3 - "$WORK" deploy/docker/Dockerfile.* <<'EOF'
import json, os, re, shlex, sys
work = sys.argv[1]
for path in sys.argv[2:]:
    name = path.rsplit("Dockerfile.", 1)[1]
    stages, cur, lines = [], None, []
    for raw in open(path):
        line = raw.strip()
        if line.startswith("#") or (not line and not cur):
            continue
        if line.endswith("\\"):
            cur = (cur or "") + line[:-1] + " "
            continue
        text, cur = ((cur or "") + line).strip(), None
        if not text:
            continue
        cmd, _, args = text.partition(" ")
        cmd = cmd.upper()
        if cmd == "FROM":
            f = args.split()
            stages.append({"base": f[0], "name": f[2] if len(f) == 3 else "", "body": []})
        else:
            stages[-1]["body"].append((cmd, args.strip()))
    build, rt = stages[0], stages[-1]
    gobuild = [a for c, a in build["body"] if c == "RUN" and "go build" in a][-1]
    gobuild = gobuild[gobuild.rfind("&&") + 2:].strip() if "&&" in gobuild else gobuild
    out = re.search(r"-o\s+(\S+)", gobuild).group(1)
    last = lambda c: [a for k, a in rt["body"] if k == c][-1]
    copies = [a.split() for c, a in rt["body"] if c == "COPY"]
    dest = [f[2] for f in copies if f[:2] == ["--from=build", out]][0]
    d = os.path.join(work, name)
    os.makedirs(d)
    w = lambda f, s: open(os.path.join(d, f), "w").write(s + "\n")
    w("base", rt["base"])
    # The build line with its -o pointing into the work dir; everything else as written.
    w("gobuild", gobuild.replace("-o " + out, "-o " + shlex.quote(os.path.join(d, "bin"))))
    w("runs", "\n".join(a for c, a in rt["body"] if c == "RUN"))
    w("dest", dest)
    w("user", last("USER"))
    w("entrypoint", "\n".join(json.loads(last("ENTRYPOINT"))))
EOF

IMAGES=()
for d in "$WORK"/*/; do IMAGES+=("$(basename "$d")"); done

for img in "${IMAGES[@]}"; do
  step "$img: building on the host with the Dockerfile's line: $(cat "$WORK/$img/gobuild")"
  sh -c "$(cat "$WORK/$img/gobuild")"
done

# root_of IMG: the replayed runtime root of IMG.
root_of() { echo "$WORK/$1/root"; }

for img in "${IMAGES[@]}"; do
  root=$(root_of "$img")
  base=$(cat "$WORK/$img/base")
  case "$base" in
  debian:bookworm-slim)
    step "$img: FROM $base (stand-in: a copy of the debootstrapped bookworm minbase)"
    cp -a "$BASE" "$root"
    cp /etc/resolv.conf "$root/etc/resolv.conf"
    mount -t proc proc "$root/proc" && MOUNTS+=("$root/proc")
    while IFS= read -r run; do
      [ -n "$run" ] || continue
      step "$img: RUN $run"
      env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive \
        chroot "$root" /bin/sh -c "$run" >"$WORK/$img/run.log" 2>&1 || { cat "$WORK/$img/run.log" >&2; exit 1; }
    done <"$WORK/$img/runs"
    ;;
  gcr.io/distroless/static-debian12:nonroot)
    step "$img: FROM $base (stand-in: an empty root with /etc/passwd, CA certificates, /tmp; no libc, no shell)"
    ! grep -q . "$WORK/$img/runs" || { echo "image-smoke: $img: RUN on a distroless base cannot work (no shell)" >&2; exit 1; }
    mkdir -p "$root/etc/ssl/certs" "$root/tmp" "$root/proc" "$root/dev"
    chmod 1777 "$root/tmp"
    printf 'root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$root/etc/passwd"
    printf 'root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n' >"$root/etc/group"
    cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/"
    mount -t proc proc "$root/proc" && MOUNTS+=("$root/proc")
    for dev in null zero random urandom; do
      touch "$root/dev/$dev" && mount --bind "/dev/$dev" "$root/dev/$dev" && MOUNTS+=("$root/dev/$dev")
    done
    ;;
  *)
    echo "image-smoke: $img: no stand-in for base image $base" >&2
    exit 1
    ;;
  esac
  dest=$(cat "$WORK/$img/dest")
  step "$img: COPY --from=build -> $dest"
  install -D -m 0755 "$WORK/$img/bin" "$root$dest"
done

# run IMG ARGS...: IMG's ENTRYPOINT with ARGS in its replayed root as its USER,
# with the environment Docker gives a container (no KVINDEX_* from this shell).
run() {
  local img=$1
  shift
  local root entry=()
  root=$(root_of "$img")
  mapfile -t entry <"$WORK/$img/entrypoint"
  # exec: in a background subshell, $! is then the binary's own pid.
  exec env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/ HOSTNAME="$img" \
    chroot --userspec="$(cat "$WORK/$img/user")" "$root" "${entry[@]}" "$@"
}

for img in "${IMAGES[@]}"; do
  step "$img: ENTRYPOINT --help as USER $(cat "$WORK/$img/user")"
  if ! (run "$img" --help) >"$WORK/$img/help.txt" 2>&1; then
    cat "$WORK/$img/help.txt" >&2
    echo "image-smoke: $img --help failed" >&2
    exit 1
  fi
done

# compose.yaml's services with service names and fixed ports replaced by
# 127.0.0.1 and free ports (all share this host's network), one line each:
# service<TAB>image<TAB>json args.
python3 - deploy/docker/compose.yaml >"$WORK/services.tsv" <<'EOF'
import json, re, socket, sys, yaml
compose = yaml.safe_load(open(sys.argv[1]))
services = compose["services"]
hostport = re.compile(r"([A-Za-z0-9_.*-]+):(\d+)")
# The fake engine spells its HTTP listener --host=H --port=P.
portflag = re.compile(r"^--port=(\d+)$")
# Every (service, port) a service listens on (0.0.0.0, ZMQ's *, --port) gets a free port.
ports, socks = {}, []
for name, svc in services.items():
    for a in svc["command"]:
        listens = [p for h, p in hostport.findall(a) if h in ("0.0.0.0", "*")] + portflag.findall(a)
        for port in listens:
            if (name, port) not in ports:
                s = socket.socket(); s.bind(("127.0.0.1", 0)); socks.append(s)
                ports[(name, port)] = str(s.getsockname()[1])
for s in socks:
    s.close()
def adapt(name, a):
    if portflag.match(a):
        return "--port=" + ports[(name, portflag.match(a).group(1))]
    if a == "--host=0.0.0.0":
        return "--host=127.0.0.1"
    def sub(m):
        host, port = m.group(1), m.group(2)
        if host in ("0.0.0.0", "*"):
            return ("*" if host == "*" else "127.0.0.1") + ":" + ports[(name, port)]
        if host in services:
            if (host, port) not in ports:
                sys.exit(f"image-smoke: {name} refers to {host}:{port}, on which {host} does not listen")
            return "127.0.0.1:" + ports[(host, port)]
        return m.group(0)
    return hostport.sub(sub, a)
for name, svc in services.items():
    image = svc["build"]["dockerfile"].rsplit("Dockerfile.", 1)[1]
    print(name, image, json.dumps([adapt(name, a) for a in svc["command"]]), sep="\t")
EOF

# Start order: compose.yaml's depends_on puts the router last; engines and the indexer first.
declare -A PORT_OF
while IFS=$'\t' read -r name img args; do
  mapfile -t argv < <(python3 -c 'import json,sys; print("\n".join(json.loads(sys.argv[1])))' "$args")
  step "starting $name ($img) as USER $(cat "$WORK/$img/user"): ${argv[*]}"
  run "$img" "${argv[@]}" >"$WORK/$name.log" 2>&1 &
  PIDS+=($!)
  for a in "${argv[@]}"; do
    case "$a" in --http-addr=* | --listen=*) PORT_OF[$name]=${a##*:} ;; --port=*) PORT_OF[$name]=${a#--port=} ;; esac
  done
done < <(grep -v $'\trouter\t' "$WORK/services.tsv"; grep $'\trouter\t' "$WORK/services.tsv")

wait_ok() { # NAME URL
  local until=$(($(date +%s) + DEADLINE))
  until curl -fsS -o /dev/null "$2" 2>/dev/null; do
    if [ "$(date +%s)" -ge "$until" ]; then
      echo "image-smoke: $1 not ready at $2 within ${DEADLINE}s; its log:" >&2
      tail -30 "$WORK/$1.log" >&2
      exit 1
    fi
    sleep 0.5
  done
}
wait_ok indexer "http://127.0.0.1:${PORT_OF[indexer]}/readyz"
wait_ok router "http://127.0.0.1:${PORT_OF[router]}/readyz"
step "indexer and router ready"

# Every process (alive, past chroot's setuid) runs as uid 65532, not root.
for pid in "${PIDS[@]}"; do
  uid=$(awk '/^Uid:/ {print $2}' "/proc/$pid/status" 2>/dev/null || echo gone)
  if [ "$uid" != 65532 ]; then
    echo "image-smoke: pid $pid runs as uid $uid, want 65532" >&2
    exit 1
  fi
done


# One chat completion through the router: 200 and the worker it was routed to.
until=$(($(date +%s) + DEADLINE))
while :; do
  code=$(curl -sS -o "$WORK/reply.json" -D "$WORK/reply.headers" -w '%{http_code}' \
    "http://127.0.0.1:${PORT_OF[router]}/v1/chat/completions" -H 'Content-Type: application/json' \
    -d '{"model":"demo/model","messages":[{"role":"user","content":"hello from the image smoke test"}],"max_tokens":8}' || true)
  worker=$(awk -F': ' 'tolower($1) == "x-kvindex-worker" {gsub("\r", "", $2); print $2}' "$WORK/reply.headers" 2>/dev/null || true)
  if [ "$code" = 200 ] && [ -n "$worker" ]; then break; fi
  if [ "$(date +%s)" -ge "$until" ]; then
    echo "image-smoke: chat completion: HTTP $code, X-Kvindex-Worker '$worker' within ${DEADLINE}s" >&2
    cat "$WORK/reply.json" >&2
    tail -20 "$WORK/router.log" >&2
    exit 1
  fi
  sleep 0.5
done
step "chat completion through the router: HTTP 200, X-Kvindex-Worker: $worker"
echo "image-smoke: OK in $(($(date +%s) - start))s"
