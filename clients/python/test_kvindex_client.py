"""Tests of kvindex_client against a real indexer following a fake engine.

Run by `make test` through clients/go's TestPythonClient, which starts both in
process and passes their addresses in KVINDEX_URL, KVINDEX_ENGINE_URL,
KVINDEX_MODEL and KVINDEX_ADMIN_TOKEN. Without those variables the suite
builds bin/indexer and bin/fakeengine itself (needs `go`) and starts them:

    cd clients/python && python3 -m unittest -v
"""

import http.server
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from kvindex_client import Client, KVIndexError  # noqa: E402

ENV = {}
_processes = []
_tmp = None


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(predicate, what, timeout=30.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if predicate():
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise AssertionError("timed out waiting for " + what)


def setUpModule():
    global _tmp
    if os.environ.get("KVINDEX_URL"):
        for k in ("KVINDEX_URL", "KVINDEX_ENGINE_URL", "KVINDEX_MODEL", "KVINDEX_ADMIN_TOKEN"):
            ENV[k] = os.environ[k]
        return
    # Standalone: build and start a fake engine and an indexer following it.
    _tmp = tempfile.mkdtemp(prefix="kvindex-pytest-")
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
    subprocess.run(["go", "build", "-o", _tmp + "/", "./cmd/indexer", "./cmd/fakeengine"], cwd=root, check=True)
    model, token = "demo/model", "py-admin-token"
    http_port, events, replay = _free_port(), _free_port(), _free_port()
    _processes.append(subprocess.Popen([
        _tmp + "/fakeengine", "--model", model, "--port", str(http_port), "--block-size", "4",
        "--kv-events-endpoint", "tcp://*:%d" % events, "--kv-events-replay-endpoint", "tcp://*:%d" % replay,
        "--time-scale", "0", "--log-level", "warn"]))
    idx_http, idx_grpc, idx_raft = _free_port(), _free_port(), _free_port()
    _processes.append(subprocess.Popen([
        _tmp + "/indexer", "--http-addr", "127.0.0.1:%d" % idx_http, "--grpc-addr", "127.0.0.1:%d" % idx_grpc,
        "--raft-addr", "127.0.0.1:%d" % idx_raft, "--data-dir", _tmp + "/data",
        "--block-size", "4", "--admin-token", token, "--tokenizer", model + "=builtin", "--log-level", "warn",
        "--worker", "id=engine-0,model=%s,endpoint=tcp://127.0.0.1:%d,replay=tcp://127.0.0.1:%d" % (model, events, replay)]))
    ENV.update(KVINDEX_URL="http://127.0.0.1:%d" % idx_http, KVINDEX_ENGINE_URL="http://127.0.0.1:%d" % http_port,
               KVINDEX_MODEL=model, KVINDEX_ADMIN_TOKEN=token)
    c = Client(ENV["KVINDEX_URL"])
    _wait(c.ready, "the indexer to be ready")
    _wait(lambda: urllib.request.urlopen(ENV["KVINDEX_ENGINE_URL"] + "/health").status == 200, "the engine")


def tearDownModule():
    for p in _processes:
        p.terminate()
    for p in _processes:
        p.wait(timeout=20)
    if _tmp:
        shutil.rmtree(_tmp, ignore_errors=True)


def complete(prompt):
    """Runs a completion on the fake engine, which caches the prompt's blocks."""
    body = json.dumps({"model": ENV["KVINDEX_MODEL"], "prompt": prompt, "max_tokens": 1}).encode()
    req = urllib.request.Request(ENV["KVINDEX_ENGINE_URL"] + "/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        json.loads(resp.read())


def tokenize(prompt):
    body = json.dumps({"model": ENV["KVINDEX_MODEL"], "prompt": prompt}).encode()
    req = urllib.request.Request(ENV["KVINDEX_ENGINE_URL"] + "/tokenize", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())["tokens"]


class ClientTest(unittest.TestCase):
    def setUp(self):
        self.model = ENV["KVINDEX_MODEL"]
        self.c = Client(ENV["KVINDEX_URL"], admin_token=ENV["KVINDEX_ADMIN_TOKEN"])

    def cached(self, prompt):
        """Sends prompt to the engine and waits until the indexer sees it whole."""
        complete(prompt)
        blocks = len(tokenize(prompt)) // 4

        def seen():
            r = self.c.hit_rate(self.model, prompt=prompt, pods=["engine-0"])
            return r["pods"][0]["matched_blocks"] == blocks
        _wait(seen, "the indexer to see the prompt")
        return blocks

    def test_hit_rate_by_prompt_tokens_and_messages(self):
        prompt = "Python client: the quick brown fox jumps over the lazy dog."
        blocks = self.cached(prompt)
        self.assertGreater(blocks, 5)
        r = self.c.hit_rate(self.model, prompt=prompt, pods=["engine-0", "not-a-pod"])
        self.assertEqual(r["model"], self.model)
        self.assertEqual(r["block_size"], 4)
        self.assertEqual(r["total_blocks"], blocks)
        by_pod = {p["pod"]: p for p in r["pods"]}
        self.assertEqual(by_pod["engine-0"]["hit_rate"], 1.0)
        self.assertEqual(by_pod["engine-0"]["gpu_hit_rate"], 1.0)
        self.assertEqual(by_pod["engine-0"]["matched_tokens"], 4 * blocks)
        self.assertEqual(by_pod["not-a-pod"]["hit_rate"], 0)
        ids = tokenize(prompt)
        self.assertEqual(self.c.hit_rate(self.model, token_ids=ids)["pods"][0]["matched_blocks"], blocks)
        # A longer prompt with the same beginning hits only its cached prefix.
        longer = self.c.hit_rate(self.model, token_ids=ids + [1] * 40)
        self.assertEqual(longer["pods"][0]["matched_blocks"], blocks)
        self.assertLess(longer["pods"][0]["hit_rate"], 1.0)
        chat = self.c.hit_rate(self.model, messages=[{"role": "user", "content": "never sent"}])
        self.assertEqual(chat["pods"][0]["matched_blocks"], 0)

    def test_query_shapes(self):
        prompt = "Query shapes: Dynamo and Mooncake clients read the same answer."
        blocks = self.cached(prompt)
        ids = tokenize(prompt)
        both = self.c.query(self.model, ids)
        self.assertEqual(both["scores"]["engine-0"]["0"], 4 * blocks)
        self.assertEqual(len(both["frequencies"]), blocks)
        self.assertGreaterEqual(both["tree_sizes"]["engine-0"]["0"], blocks)
        self.assertEqual(both["default"]["engine-0"]["longest_matched"], 4 * blocks)
        mooncake = self.c.query(self.model, ids, tenant_id="t1", fmt="mooncake")
        self.assertEqual(list(mooncake), ["t1"])
        self.assertEqual(mooncake["t1"]["engine-0"]["GPU"], 4 * blocks)
        self.assertEqual(mooncake["t1"]["engine-0"]["DP"], {"0": 4 * blocks})

    def test_score_workers_cluster_stats_dump(self):
        prompt = "Typed API: kvindex.v1 messages as JSON."
        blocks = self.cached(prompt)
        r = self.c.score({"model": self.model, "text": prompt})
        self.assertEqual(r["scores"][0]["worker"], "engine-0")
        self.assertEqual(r["scores"][0]["matched_blocks"], blocks)
        self.assertGreater(int(r["applied_index"]), 0)
        workers = self.c.workers(model=self.model)["workers"]
        self.assertIn("engine-0", [w["spec"]["id"] for w in workers])
        self.assertGreater(int(workers[0]["gpu_blocks"]), 0)
        cluster = self.c.cluster()
        self.assertEqual(cluster["leader"], cluster["node_id"])
        self.assertEqual(len(cluster["members"]), 1)
        self.assertGreater(int(self.c.stats()["nodes"]), 0)
        dump = self.c.dump(worker="engine-0")
        self.assertTrue(all(ch["worker"] == "engine-0" for ch in dump["changes"]))
        self.assertGreaterEqual(len(dump["changes"]), blocks)
        # Several workers: the parameter repeated, as the API takes it.
        several = self.c.dump(worker=["engine-0", "no-such-worker"])
        self.assertTrue(all(ch["worker"] == "engine-0" for ch in several["changes"]))
        self.assertGreaterEqual(len(several["changes"]), blocks)
        self.assertEqual(self.c.dump(worker=["no-such-worker"])["changes"], [])
        self.assertTrue(self.c.healthy())
        self.assertTrue(self.c.ready())

    def test_register_and_unregister(self):
        r = self.c.register("py-worker", self.model, endpoint="tcp://127.0.0.1:1", block_size=4, role="decode")
        self.assertEqual(r["worker"]["spec"]["id"], "py-worker")
        self.assertIn("py-worker", [w["spec"]["id"] for w in self.c.workers()["workers"]])
        self.c.unregister("py-worker")
        self.assertNotIn("py-worker", [w["spec"]["id"] for w in self.c.workers()["workers"]])
        with self.assertRaises(KVIndexError) as e:
            self.c.unregister("py-worker")
        self.assertEqual((e.exception.status, e.exception.code), (404, "not_found"))

    def test_admin_calls_need_the_token(self):
        anonymous = Client(ENV["KVINDEX_URL"])
        with self.assertRaises(KVIndexError) as e:
            anonymous.register("py-intruder", self.model)
        self.assertEqual((e.exception.status, e.exception.code), (401, "unauthenticated"))
        wrong = Client(ENV["KVINDEX_URL"], admin_token="wrong")
        with self.assertRaises(KVIndexError) as e:
            wrong.unregister("engine-0")
        self.assertEqual(e.exception.status, 403)

    def test_errors_are_clear(self):
        cases = [
            (lambda: self.c.hit_rate(self.model, token_ids=[1, 2, 3, 4], block_size=-16), 400, "invalid_argument", "block_size=-16"),
            (lambda: self.c.hit_rate("no/such-model", prompt="hi"), 404, "unknown_model", "no tokenizer"),
            (lambda: self.c.hit_rate(self.model), 400, "invalid_argument", "prompt is missing"),
            (lambda: self.c.query_by_hash(self.model, [1, 2], fmt="xml"), 400, "invalid_argument", "format="),
        ]
        for call, status, code, text in cases:
            with self.assertRaises(KVIndexError) as e:
                call()
            self.assertEqual((e.exception.status, e.exception.code), (status, code))
            self.assertIn(text, e.exception.message)
        self.assertTrue(self.c.healthy())



class _CutShort(http.server.BaseHTTPRequestHandler):
    """Answers as an indexer whose dump was cut short: /closed closes the
    connection mid-body, /ended ends the body where the JSON does not."""

    body = b'{"applied_index": "7", "changes": [{"worker": "w"'

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        if self.path.startswith("/dump?worker=closed"):
            self.send_header("Content-Length", str(len(self.body) + 100))
        else:
            self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)
        self.close_connection = True

    def log_message(self, *args):
        pass


class OfflineTest(unittest.TestCase):
    """What needs no indexer: a node that is not there, an answer cut short."""

    def test_unreachable_node_is_neither_healthy_nor_ready(self):
        c = Client("http://127.0.0.1:%d" % _free_port(), timeout=2)
        self.assertFalse(c.healthy())
        self.assertFalse(c.ready())

    def test_truncated_dump_raises_the_clients_error(self):
        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _CutShort)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        self.addCleanup(srv.server_close)
        self.addCleanup(srv.shutdown)
        c = Client("http://127.0.0.1:%d" % srv.server_address[1], timeout=5)
        for how in ("closed", "ended"):
            with self.subTest(how=how), self.assertRaises(KVIndexError) as e:
                c.dump(worker=how)
            self.assertEqual((e.exception.status, e.exception.code), (200, "truncated"))


if __name__ == "__main__":
    unittest.main()
