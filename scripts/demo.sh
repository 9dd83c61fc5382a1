#!/usr/bin/env bash
# kvindex demo (`make demo`): a single-node indexer follows a fleet of four fake
# vLLM engines, traffic with shared prompt prefixes goes to the engines, and
# for a follow-up prompt the hit rate the indexer reports for every worker is
# printed next to what each engine really caches. Everything it starts is
# stopped when it ends, also on Ctrl-C.
set -euo pipefail

cd "$(dirname "$0")/.."
BIN=${BIN:-bin}
MODEL=${MODEL:-demo/llama-3.1-8b}
ENGINES=4
BLOCK=16

for b in indexer fakeengine kvctl; do
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

echo "== starting $ENGINES fake engines (HTTP ports $HTTP_BASE-$((HTTP_BASE + ENGINES - 1)))"
"$BIN/fakeengine" --model "$MODEL" --fleet $ENGINES --base-port "$HTTP_BASE" --block-size $BLOCK \
  --num-gpu-blocks 24 --num-cpu-blocks 2000 --time-scale 0.01 \
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

set +e
python3 - "$MODEL" "$ENGINES" "$HTTP_BASE" "$IDX_HTTP" "$WORK/result" <<'EOF'
import json, sys, time, urllib.request

model, engines, http_base, idx_http = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
result_file = sys.argv[5]
indexer = "http://127.0.0.1:%d" % idx_http
engine = ["http://127.0.0.1:%d" % (http_base + i) for i in range(engines)]

def call(url, body=None, timeout=30):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, r.read()

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

systems = {
    "support": "You are the support assistant of Example Corp. Be polite, answer in two sentences, "
               "and never reveal internal ticket numbers. Product catalogue: widgets, gadgets, gizmos. ",
    "coder": "You are a senior Go reviewer. Point out races, leaked goroutines and unchecked errors; "
             "suggest table-driven tests. Keep each comment under forty words. ",
    "translator": "Translate the user's message from English to French. Keep the tone and the "
                  "punctuation, do not add explanations, and leave product names untranslated. ",
}
# Which engine serves which conversations: shared prefixes land on several engines.
plan = [(0, "support"), (1, "coder"), (2, "support"), (2, "coder"), (3, "translator"),
        (0, "support"), (1, "coder"), (3, "translator"), (2, "support")]
print("== sending %d requests with shared system prompts" % (len(plan) * 3))
for round_ in range(3):
    for n, (i, system) in enumerate(plan):
        prompt = systems[system] + "User question %d.%d: what about item %d?" % (round_, n, n * 7 + round_)
        call(engine[i] + "/v1/completions", {"model": model, "prompt": prompt, "max_tokens": 8})

follow_up = systems["support"] + "User: my gadget arrived scratched, what now?"
tokens = json.loads(call(engine[0] + "/tokenize", {"model": model, "prompt": follow_up})[1])["tokens"]
block = 16
prompt_blocks = [tuple(tokens[i * block:(i + 1) * block]) for i in range(len(tokens) // block)]

def truth(i):
    """Cached prefix blocks of the follow-up on engine i, from its own cache
    (GET /debug/kv-blocks): walk the prompt's blocks through parent links."""
    t = json.loads(call(engine[i] + "/debug/kv-blocks")[1])
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

def indexer_view():
    body = {"model": model, "prompt": follow_up, "pods": ["engine-%d" % i for i in range(engines)]}
    return {p["pod"]: p for p in json.loads(call(indexer + "/kv-cache/hit-rate", body)[1])["pods"]}

want = {"engine-%d" % i: truth(i) for i in range(engines)}
# Events reach the indexer asynchronously: give it a moment to catch up.
deadline = time.time() + 20
while True:
    got = indexer_view()
    if all(got[w]["matched_blocks"] == want[w] for w in want) or time.time() > deadline:
        break
    time.sleep(0.1)

total = len(prompt_blocks)
print()
print("Follow-up prompt: %d tokens = %d full blocks of %d (support system prompt + a new question)" % (len(tokens), total, block))
print()
print("%-9s  %-25s  %-25s  %s" % ("WORKER", "INDEXER (hit rate)", "ENGINE TRUTH (hit rate)", ""))
ok = True
for w in sorted(want):
    g, t = got[w], want[w]
    same = g["matched_blocks"] == t
    ok = ok and same
    print("%-9s  %3d/%d blocks  %6.1f%%     %3d/%d blocks  %6.1f%%      %s" % (
        w, g["matched_blocks"], total, 100 * g["hit_rate"], t, total, 100 * t / total, "ok" if same else "MISMATCH"))
best = max(got.values(), key=lambda p: p["hit_rate"])
if ok and best["hit_rate"] > 0:
    result = ("RESULT: PASS - the indexer's view matches all %d engines; route the follow-up to %s (%.0f%% of its prompt cached)"
              % (engines, best["pod"], 100 * best["hit_rate"]))
else:
    result = "RESULT: FAIL - the indexer's view differs from the engines' caches"
with open(result_file, "w") as f:
    f.write(result + "\n")
sys.exit(0 if result.startswith("RESULT: PASS") else 1)
EOF
status=$?
set -e
if [ $status -eq 0 ]; then
  echo
  echo "== the same question over gRPC: bin/kvctl score --addr 127.0.0.1:$IDX_GRPC --model $MODEL --text ..."
  "$BIN/kvctl" score --addr "127.0.0.1:$IDX_GRPC" --model "$MODEL" \
    --text "$(printf '%s' "You are the support assistant of Example Corp. Be polite, answer in two sentences, and never reveal internal ticket numbers. Product catalogue: widgets, gadgets, gizmos. User: my gadget arrived scratched, what now?")"
  echo
  "$BIN/kvctl" workers --addr "127.0.0.1:$IDX_GRPC"
  echo
  "$BIN/kvctl" cluster --addr "127.0.0.1:$IDX_GRPC"
  echo
else
  echo "demo: logs follow" >&2
  tail -n 20 "$WORK/engines.log" "$WORK/indexer.log" >&2 || true
fi
echo "== stopping the indexer and the engines"
echo
echo "=============================================================================="
cat "$WORK/result" 2>/dev/null || echo "RESULT: FAIL - the demo did not get to compare (see the logs above)"
echo "=============================================================================="
exit $status
