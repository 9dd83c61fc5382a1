#!/usr/bin/env bash
# kvindex demo (`make demo`): a single-node indexer follows a fleet of four fake
# vLLM engines and the KV-aware router sends multi-turn conversations to them;
# every follow-up should land on the worker that holds its conversation, which
# the engines' own cached_tokens prove. The same conversations then go through a
# round-robin router (caches reset first) for comparison, and the indexer's
# view is checked against what the engines really cache. Everything it starts is
# stopped when it ends, also on Ctrl-C.
set -euo pipefail

cd "$(dirname "$0")/.."
BIN=${BIN:-bin}
MODEL=${MODEL:-demo/llama-3.1-8b}
ENGINES=4
BLOCK=16

for b in indexer router fakeengine kvctl; do
  if [ ! -x "$BIN/$b" ]; then
    echo "demo: $BIN/$b is missing; run 'make demo' (it builds first)" >&2
    exit 1
  fi
done
command -v python3 >/dev/null || { echo "demo: python3 is needed (scripts/deps.sh installs it)" >&2; exit 1; }

WORK=$(mktemp -d -t kvindex-demo.XXXXXX)
PIDS=()
cleanup() {
  trap - EXIT INT TERM
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'echo; echo "demo: interrupted, stopping everything"; exit 130' INT TERM

# Free ports: HTTP for the engines, their event and replay sockets, the indexer.
free_ports() {
  python3 - "$1" <<'EOF'
import socket, sys
n = int(sys.argv[1])
for _ in range(200):
    socks = []
    try:
        first = socket.socket(); first.bind(("127.0.0.1", 0)); socks.append(first)
        base = first.getsockname()[1]
        for i in range(1, n):
            s = socket.socket(); s.bind(("127.0.0.1", base + i)); socks.append(s)
        print(base)
        break
    except OSError:
        pass
    finally:
        for s in socks: s.close()
else:
    sys.exit("no free port range")
EOF
}
HTTP_BASE=$(free_ports $ENGINES)
EVENTS_BASE=$(free_ports $ENGINES)
REPLAY_BASE=$(free_ports $ENGINES)
IDX_HTTP=$(free_ports 1)
IDX_GRPC=$(free_ports 1)
IDX_RAFT=$(free_ports 1)
ROUTER=$(free_ports 1)
RR_ROUTER=$(free_ports 1)

echo "== starting $ENGINES fake engines (HTTP ports $HTTP_BASE-$((HTTP_BASE + ENGINES - 1)))"
"$BIN/fakeengine" --model "$MODEL" --fleet $ENGINES --base-port "$HTTP_BASE" --block-size $BLOCK \
  --num-gpu-blocks 64 --num-cpu-blocks 2000 --time-scale 0.2 \
  --kv-events-endpoint "tcp://*:$EVENTS_BASE" --kv-events-replay-endpoint "tcp://*:$REPLAY_BASE" \
  --log-level warn >"$WORK/engines.log" 2>&1 &
PIDS+=($!)

WORKERS=()
for i in $(seq 0 $((ENGINES - 1))); do
  WORKERS+=(--worker "id=engine-$i,model=$MODEL,block-size=$BLOCK,endpoint=tcp://127.0.0.1:$((EVENTS_BASE + i)),replay=tcp://127.0.0.1:$((REPLAY_BASE + i)),http=http://127.0.0.1:$((HTTP_BASE + i))")
done
echo "== starting the indexer, a raft cluster of one (gRPC 127.0.0.1:$IDX_GRPC, REST http://127.0.0.1:$IDX_HTTP, raft 127.0.0.1:$IDX_RAFT)"
"$BIN/indexer" --node-id demo --data-dir "$WORK/data" --http-addr "127.0.0.1:$IDX_HTTP" --grpc-addr "127.0.0.1:$IDX_GRPC" \
  --raft-addr "127.0.0.1:$IDX_RAFT" \
  --block-size $BLOCK --tokenizer "$MODEL=builtin" --log-level warn "${WORKERS[@]}" >"$WORK/indexer.log" 2>&1 &
PIDS+=($!)
echo "   indexer console: http://127.0.0.1:$IDX_HTTP/ui"

ROUTER_WORKERS=()
for i in $(seq 0 $((ENGINES - 1))); do
  ROUTER_WORKERS+=(--worker "id=engine-$i,model=$MODEL,block-size=$BLOCK,http=http://127.0.0.1:$((HTTP_BASE + i))")
done
echo "== starting the kv-aware router (http://127.0.0.1:$ROUTER, asks the indexer) and a round-robin router (http://127.0.0.1:$RR_ROUTER) for comparison"
"$BIN/router" --listen "127.0.0.1:$ROUTER" --indexer "127.0.0.1:$IDX_GRPC" --router-policy kv-aware \
  "${ROUTER_WORKERS[@]}" --log-level warn >"$WORK/router.log" 2>&1 &
PIDS+=($!)
"$BIN/router" --listen "127.0.0.1:$RR_ROUTER" --router-policy round-robin \
  "${ROUTER_WORKERS[@]}" --log-level warn >"$WORK/router-rr.log" 2>&1 &
PIDS+=($!)
echo "   router consoles: http://127.0.0.1:$ROUTER/ui (kv-aware), http://127.0.0.1:$RR_ROUTER/ui (round-robin)"

set +e
python3 - "$MODEL" "$ENGINES" "$HTTP_BASE" "$IDX_HTTP" "$ROUTER" "$RR_ROUTER" "$WORK/result" <<'EOF'
import json, sys, time, urllib.request

model, engines, http_base, idx_http = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
router, rr_router = "http://127.0.0.1:%s" % sys.argv[5], "http://127.0.0.1:%s" % sys.argv[6]
result_file = sys.argv[7]
indexer = "http://127.0.0.1:%d" % idx_http
engine = ["http://127.0.0.1:%d" % (http_base + i) for i in range(engines)]
block = 16

def call(url, body=None, timeout=30):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, r.read(), r.headers

def wait_ok(url, what, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if call(url)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    sys.exit("demo: %s did not come up (see its log)" % what)

for i, e in enumerate(engine):
    wait_ok(e + "/health", "engine-%d" % i)
wait_ok(indexer + "/readyz", "the indexer")
wait_ok(router + "/readyz", "the kv-aware router")
wait_ok(rr_router + "/readyz", "the round-robin router")

systems = {
    "support": "You are the support assistant of Example Corp. Be polite, answer in two sentences, "
               "and never reveal internal ticket numbers. Product catalogue: widgets, gadgets, gizmos.",
    "coder": "You are a senior Go reviewer. Point out races, leaked goroutines and unchecked errors; "
             "suggest table-driven tests. Keep each comment under forty words.",
    "translator": "Translate the user's message from English to French. Keep the tone and the "
                  "punctuation, do not add explanations, and leave product names untranslated.",
    "analyst": "You are a data analyst. Answer with one number and one sentence of justification, "
               "citing the column names you used from the attached quarterly sales table.",
}
questions = ["How do I start?", "And then what?", "Can you give an example?", "Summarize everything so far."]

def converse(url):
    """Four users chat at once, four turns each; every turn resends the whole
    history, as chat clients do, and the users' turns arrive together (a barrier),
    so the router sees concurrent load. Returns one row per request, in turn order."""
    import threading
    barrier = threading.Barrier(len(systems))
    rows, lock, errors = [], threading.Lock(), []
    def user(name):
        history = [{"role": "system", "content": systems[name]}]
        try:
            for turn, q in enumerate(questions):
                barrier.wait(timeout=60)
                msgs = history + [{"role": "user", "content": "%s (%s, turn %d)" % (q, name, turn)}]
                _, body, headers = call(url + "/v1/chat/completions", {"model": model, "messages": msgs, "max_tokens": 12})
                ans = json.loads(body)
                usage = ans["usage"]
                history = msgs + [{"role": "assistant", "content": ans["choices"][0]["message"]["content"]}]
                with lock:
                    rows.append({"conv": name, "turn": turn, "worker": headers.get("X-Kvindex-Worker", "?"),
                                 "prompt": usage["prompt_tokens"], "cached": usage["prompt_tokens_details"]["cached_tokens"]})
        except Exception as e:
            errors.append("%s: %s" % (name, e))
            barrier.abort()
    threads = [threading.Thread(target=user, args=(n,)) for n in systems]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        sys.exit("demo: a conversation failed: %s" % errors)
    order = list(systems)
    return sorted(rows, key=lambda r: (r["turn"], order.index(r["conv"])))

def table(rows):
    print("%-11s %-5s %-9s %s" % ("CONV", "TURN", "WORKER", "CACHED/PROMPT TOKENS"))
    for r in rows:
        print("%-11s %-5d %-9s %4d/%-4d %s" % (r["conv"], r["turn"], r["worker"], r["cached"], r["prompt"],
                                              "#" * (40 * r["cached"] // max(r["prompt"], 1))))

def share(rows):
    return sum(r["cached"] for r in rows) / max(sum(r["prompt"] for r in rows), 1)

print("== kv-aware router: 4 users chatting at once, 4 turns each")
kv = converse(router)
table(kv)

# Followers stay with their conversation, and the engine proves the hit.
home, sticky, followups = {}, 0, 0
for r in kv:
    if r["turn"] > 0:
        followups += 1
        if r["worker"] == home[r["conv"]] and r["cached"] >= block:
            sticky += 1
    home[r["conv"]] = r["worker"]

# The indexer's view of a new support turn equals the engines' own caches.
def truth_blocks(i, tokens):
    t = json.loads(call(engine[i] + "/debug/kv-blocks")[1])
    prompt_blocks = [tuple(tokens[j * block:(j + 1) * block]) for j in range(len(tokens) // block)]
    best = 0
    for rank in t["ranks"]:
        children = {}
        for b in rank["blocks"]:
            children.setdefault(b["parent_hash"], {})[tuple(b["token_ids"])] = b["hash"]
        parent, n = None, 0
        for blk in prompt_blocks:
            h = children.get(parent, {}).get(blk)
            if h is None:
                break
            parent, n = h, n + 1
        best = max(best, n)
    return best
probe = [{"role": "system", "content": systems["support"]}, {"role": "user", "content": "%s (support, turn 0)" % questions[0]}]
tokens = json.loads(call(engine[0] + "/tokenize", {"model": model, "messages": probe, "add_generation_prompt": True})[1])["tokens"]
want = {"engine-%d" % i: truth_blocks(i, tokens) for i in range(engines)}
deadline = time.time() + 20
while True:
    got = {p["pod"]: p["matched_blocks"] for p in json.loads(call(indexer + "/kv-cache/hit-rate",
           {"model": model, "token_ids": tokens, "pods": sorted(want)})[1])["pods"]}
    if got == want or time.time() > deadline:
        break
    time.sleep(0.1)
index_ok = got == want and max(want.values()) > 0

print()
print("== resetting every engine's prefix cache, then the same conversations through a round-robin router")
for e in engine:
    call(e + "/reset_prefix_cache", {})
rr = converse(rr_router)
table(rr)

print()
print("prompt tokens served from cache:  kv-aware %5.1f%%   round-robin %5.1f%%" % (100 * share(kv), 100 * share(rr)))
print("follow-ups on the worker holding their conversation (engine-reported hit): %d/%d" % (sticky, followups))
print("indexer view of the support conversation (blocks per worker) equals the engines' caches: %s %s" % ("yes" if index_ok else "NO", got))
_, metrics, _ = call(router + "/metrics")
for line in metrics.decode().splitlines():
    if line.startswith(("kvindex_router_hit_", "kvindex_router_decisions_total")):
        print("  " + line)
print()
print("== why: the kv-aware router's dry run (POST /debug/route) for the support user's next turn")
probe = [{"role": "system", "content": systems["support"]}, {"role": "user", "content": "%s (support, turn 0)" % questions[0]}]
d = json.loads(call(router + "/debug/route", {"model": model, "messages": probe})[1])
print("decision: %s (source %s, %d of %d prompt blocks cached there)" % (d["worker"], d["source"], d["overlap_blocks"], d["prompt_blocks"]))
for c in sorted(d["candidates"], key=lambda c: c["cost"]):
    print("  %-9s cost %7.2f  overlap %2d blocks  in flight %d" % (c["worker"], c["cost"], c["overlap_blocks"], c["inflight"]))
ok = sticky == followups and share(kv) > share(rr) and index_ok
if ok:
    result = ("RESULT: PASS - every follow-up hit its worker's cache (kv-aware %.0f%% of prompt tokens cached vs round-robin %.0f%%)"
              % (100 * share(kv), 100 * share(rr)))
else:
    result = "RESULT: FAIL - see the tables above"
with open(result_file, "w") as f:
    f.write(result + "\n")
sys.exit(0 if ok else 1)
EOF
status=$?
set -e
if [ $status -eq 0 ]; then
  echo
  "$BIN/kvctl" workers --addr "127.0.0.1:$IDX_GRPC"
  echo
  "$BIN/kvctl" cluster --addr "127.0.0.1:$IDX_GRPC"
  echo
else
  echo "demo: logs follow" >&2
  tail -n 20 "$WORK/engines.log" "$WORK/indexer.log" "$WORK/router.log" "$WORK/router-rr.log" >&2 || true
fi
echo "== stopping the indexer and the engines"
echo
echo "=============================================================================="
cat "$WORK/result" 2>/dev/null || echo "RESULT: FAIL - the demo did not get to compare (see the logs above)"
echo "=============================================================================="
exit $status
