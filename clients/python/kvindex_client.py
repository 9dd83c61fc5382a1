"""kvindex REST client, standard library only (urllib).

Talks to the REST API of a kvindex indexer (docs/api.md):

    from kvindex_client import Client
    c = Client("http://127.0.0.1:7080")
    c.hit_rate("Qwen/Qwen3-8B", prompt="Hello", pods=["pod-a", "pod-b"])

Every method returns the decoded JSON body. Errors come as KVIndexError with
the HTTP status and the body's error code and message; an answer cut short (a
dump the indexer could not finish) as KVIndexError with code "truncated".
healthy() and ready() answer False, not an exception, for an unreachable node. A Client holds no
connection state and is safe to share between threads.
"""

import http.client
import json
import urllib.error
import urllib.parse
import urllib.request

__all__ = ["Client", "KVIndexError"]


class KVIndexError(Exception):
    """An error answer of the indexer: {"error": {"code", "message"}}."""

    def __init__(self, status, code, message, leader_addr=None):
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        # On "not_leader": the leader's gRPC address, when known.
        self.leader_addr = leader_addr


class Client:
    """A client of one indexer's REST API.

    base_url: e.g. "http://127.0.0.1:7080" (https for a TLS indexer; pass an
    ssl.SSLContext with a client certificate for mTLS).
    admin_token: sent as "Authorization: Bearer <token>" on register and
    unregister.
    """

    def __init__(self, base_url, admin_token=None, timeout=10.0, ssl_context=None):
        self.base_url = base_url.rstrip("/")
        self.admin_token = admin_token
        self.timeout = timeout
        self.ssl_context = ssl_context

    # --- scoring -----------------------------------------------------------

    def hit_rate(self, model, token_ids=None, prompt=None, messages=None, pods=None,
                 lora_name=None, cache_salt=None, block_size=None, **chat_options):
        """POST /kv-cache/hit-rate (hermes-router's contract).

        Give exactly one of token_ids, prompt (text) or messages (OpenAI chat
        messages; chat_options may hold add_generation_prompt, tools and
        chat_template_kwargs). pods restricts the answer to those workers;
        unknown ones get hit_rate 0.
        """
        body = _compact({
            "model": model, "token_ids": token_ids, "prompt": prompt, "messages": messages,
            "pods": pods, "lora_name": lora_name, "cache_salt": cache_salt, "block_size": block_size,
        })
        body.update(chat_options)
        return self._post("/kv-cache/hit-rate", body)

    def query(self, model, token_ids, lora_name=None, tenant_id=None, block_size=None,
              cache_salt=None, instance_id=None, fmt=None):
        """POST /query: Dynamo's and Mooncake's response shapes in one object,
        or only one of them with fmt="dynamo" or fmt="mooncake"."""
        body = _compact({
            "model": model, "token_ids": token_ids, "lora_name": lora_name, "tenant_id": tenant_id,
            "block_size": block_size, "cache_salt": cache_salt, "instance_id": instance_id,
        })
        return self._post(_with_query("/query", format=fmt), body)

    def query_by_hash(self, model, block_hashes, lora_name=None, fmt=None):
        """POST /query_by_hash with local block hashes (Dynamo's form)."""
        body = _compact({"model": model, "block_hashes": block_hashes, "lora_name": lora_name})
        return self._post(_with_query("/query_by_hash", format=fmt), body)

    def score(self, request):
        """POST /v1/score: a kvindex.v1.ScoreRequest as JSON (snake_case field
        names; 64-bit integers come back as strings)."""
        return self._post("/v1/score", request)

    # --- reads -------------------------------------------------------------

    def workers(self, model=None):
        """GET /workers: kvindex.v1.WorkersResponse."""
        return self._get(_with_query("/workers", model=model))

    def cluster(self):
        """GET /cluster: {"node_id", "leader", "term", "members": [...], ...} (docs/api.md)."""
        return self._get("/cluster")

    def stats(self):
        """GET /v1/stats: kvindex.v1.StatsResponse."""
        return self._get("/v1/stats")

    def dump(self, worker=None, model=None):
        """GET /dump: {"applied_index", "changes": [IndexChange...]}.

        worker is one worker id or a list of them. A dump cut short raises
        KVIndexError with code "truncated"."""
        return self._get(_with_query("/dump", worker=worker, model=model))

    def healthy(self):
        """GET /healthz answers 200 (False when the node is unreachable)."""
        return self._status("/healthz") == 200

    def ready(self):
        """GET /readyz answers 200 (the node has a leader and caught up; False
        when the node is unreachable)."""
        return self._status("/readyz") == 200

    # --- registry (admin token) ---------------------------------------------

    def register(self, worker_id, model, endpoint=None, replay_endpoint=None, block_size=None,
                 dp_size=None, http_endpoint=None, role=None, labels=None):
        """POST /register in kvindex's form; returns the RegisterWorkerResponse.

        role is "aggregated", "prefill" or "decode"."""
        spec = _compact({
            "id": worker_id, "model": model, "events_endpoint": endpoint,
            "replay_endpoint": replay_endpoint, "block_size": block_size, "dp_size": dp_size,
            "http_endpoint": http_endpoint, "labels": labels,
            "role": "WORKER_ROLE_" + role.upper() if role else None,
        })
        return self._post("/register", {"worker": spec}, admin=True)

    def unregister(self, worker_id):
        """POST /unregister: removes the worker and its blocks."""
        return self._post("/unregister", {"worker_id": worker_id}, admin=True)

    # --- transport ---------------------------------------------------------

    def _post(self, path, body, admin=False):
        return self._request("POST", path, json.dumps(body).encode("utf-8"), admin)

    def _get(self, path):
        return self._request("GET", path, None, False)

    def _status(self, path):
        """The answer's HTTP status; None when there is none (no connection,
        a timeout)."""
        try:
            with self._open("GET", path, None, False) as resp:
                return resp.status
        except urllib.error.HTTPError as e:
            return e.code
        except OSError:  # URLError, timeouts, resets
            return None

    def _open(self, method, path, data, admin):
        req = urllib.request.Request(self.base_url + path, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if admin and self.admin_token:
            req.add_header("Authorization", "Bearer " + self.admin_token)
        return urllib.request.urlopen(req, timeout=self.timeout, context=self.ssl_context)

    def _request(self, method, path, data, admin):
        try:
            with self._open(method, path, data, admin) as resp:
                try:
                    return json.loads(resp.read().decode("utf-8"))
                except (ValueError, http.client.IncompleteRead) as e:
                    # A streamed answer (a dump) the server cut short: the
                    # connection closed mid-body, or the JSON ends early.
                    raise KVIndexError(resp.status, "truncated",
                                       "the answer to %s %s ended early: %s" % (method, path, e)) from None
        except urllib.error.HTTPError as e:
            raw = e.read().decode("utf-8", "replace")
            try:
                err = json.loads(raw)["error"]
            except (ValueError, KeyError, TypeError):
                raise KVIndexError(e.code, "http_error", raw.strip() or e.reason) from None
            raise KVIndexError(e.code, err.get("code", ""), err.get("message", ""),
                               err.get("leader_addr")) from None


def _compact(d):
    return {k: v for k, v in d.items() if v is not None}


def _with_query(path, **params):
    params = _compact(params)
    if not params:
        return path
    # doseq: a list is the parameter repeated (worker=a&worker=b), not its repr.
    return path + "?" + urllib.parse.urlencode(params, doseq=True)

