"""A hypothesis state machine drives random sequences of calls with random params (and raw,
batch and binary frames) against one live daemon: every reply is well-formed JSON-RPC with a
known code and never -32603, the log records no crash, and the daemon never dies."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    rule,
    run_state_machine_as_test,
)
from websockets.sync.client import ClientConnection, connect

from tests.conftest import TOKEN
from tests.faults.helpers import FaultDaemon, free_port, kill_quietly

KNOWN_CODES = {-32700, -32600, -32601, -32602, -32001, -32002, -32003, -32004, -32010, -32011}
METHODS = ["auth", "gateway.health", "rpc.discover", "sessions.create", "sessions.list",
           "sessions.get", "sessions.history", "sessions.delete", "sessions.subscribe",
           "sessions.unsubscribe", "chat.send", "chat.abort", "memory.search", "memory.status",
           "memory.reindex"]
PARAM_NAMES = ["sessionKey", "message", "title", "systemPrompt", "model", "limit", "before",
               "query", "k", "mode", "after", "full", "runId", "idempotencyKey", "token",
               "excludeSessionKey"]
CRASH_EVENTS = {"rpc.crash", "connection.crash", "chat.run_crash", "memory.sync.failed"}

scalars = (st.none() | st.booleans() | st.integers(min_value=-(2**63), max_value=2**64 - 1)
           | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=40))
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=10), inner, max_size=4),
                           max_leaves=12)
texts = st.text(max_size=200) | st.sampled_from(["", " ", "\x00", "../../etc/passwd", "🦀" * 30,
                                                 "a" * 5000])


class Live:
    url = ""


class DaemonFuzz(RuleBasedStateMachine):
    keys = Bundle("keys")
    runs = Bundle("runs")

    def __init__(self) -> None:
        super().__init__()
        self._stack = contextlib.ExitStack()
        self.ws: ClientConnection = self._stack.enter_context(connect(
            Live.url, additional_headers={"Authorization": f"Bearer {TOKEN}"}, max_size=None,
            open_timeout=10, close_timeout=2))
        self.next_id = 0

    def teardown(self) -> None:
        self._stack.close()

    # -- plumbing --------------------------------------------------------------------------

    def _ids(self) -> int:
        self.next_id += 1
        return self.next_id

    def exchange(self, frame: str | bytes, expect_ids: list[Any],
                 expect_null: int = 0) -> list[dict[str, Any]]:
        """Send one frame; read until every expected reply is in, checking each reply's shape."""
        self.ws.send(frame)
        wanted = list(expect_ids)
        nulls = expect_null
        got: list[dict[str, Any]] = []
        while wanted or nulls:
            msg = orjson.loads(self.ws.recv(timeout=30))
            for item in msg if isinstance(msg, list) else [msg]:
                assert isinstance(item, dict), msg
                if "method" in item and "id" not in item:
                    assert (item["method"].startswith("chat.")
                            and isinstance(item["params"], dict)), item
                    continue  # an event of a run
                check_reply(item)
                if item["id"] is None and nulls:
                    nulls -= 1
                elif item["id"] in wanted:
                    wanted.remove(item["id"])
                else:
                    raise AssertionError(f"unexpected reply {item} (waiting for {wanted}, "
                                         f"{nulls} null ids)")
                got.append(item)
        return got

    def request(self, method: str, params: Any) -> dict[str, Any]:
        req_id = self._ids()
        frame: dict[str, Any] = {"jsonrpc": "2.0", "id": req_id, "method": method}
        if params is not None:
            frame["params"] = params
        return self.exchange(orjson.dumps(frame).decode(), [req_id])[0]

    # -- rules ------------------------------------------------------------------------------

    @rule(target=keys, title=st.none() | st.text(max_size=50))
    def create(self, title: str | None) -> str:
        reply = self.request("sessions.create", {} if title is None else {"title": title})
        return reply["result"]["sessionKey"] if "result" in reply else "0" * 32

    @rule(target=keys, key=texts)
    def a_made_up_key(self, key: str) -> str:
        return key

    @rule(target=runs, key=keys, message=texts, idem=st.none() | st.text(max_size=8))
    def send(self, key: str, message: str, idem: str | None) -> str:
        params: dict[str, Any] = {"sessionKey": key, "message": message}
        if idem is not None:
            params["idempotencyKey"] = idem
        reply = self.request("chat.send", params)
        return reply["result"]["runId"] if "result" in reply else "none"

    @rule(key=keys, run=runs)
    def abort(self, key: str, run: str) -> None:
        self.request("chat.abort", {"sessionKey": key, "runId": run})

    @rule(key=consumes(keys))
    def delete(self, key: str) -> None:
        self.request("sessions.delete", {"sessionKey": key})

    @rule(method=st.sampled_from(METHODS), key=keys,
          params=st.dictionaries(st.sampled_from(PARAM_NAMES), json_values | texts, max_size=4))
    def call_with_a_key(self, method: str, key: str, params: dict[str, Any]) -> None:
        self.request(method, {"sessionKey": key, **params})

    @rule(method=st.sampled_from(METHODS) | st.text(max_size=30), params=json_values)
    def call_anything(self, method: str, params: Any) -> None:
        self.request(method, params)

    @rule(query=texts, k=st.integers(-5, 80) | st.none(),
          mode=st.sampled_from(["hybrid", "keyword", "vector", "x"]),
          after=st.none() | st.text(max_size=30),
          before=st.none() | st.sampled_from(["2026-01-01", "yesterday"]))
    def search(self, query: str, k: int | None, mode: str, after: str | None,
               before: str | None) -> None:
        params = {"query": query, "mode": mode, "k": k, "after": after, "before": before}
        self.request("memory.search", {name: v for name, v in params.items() if v is not None})

    @rule(value=json_values)
    def raw_json_frame(self, value: Any) -> None:
        """Any JSON value as a whole frame. Objects get an id so their one reply can be awaited."""
        if isinstance(value, dict):
            req_id = self._ids()
            self.exchange(orjson.dumps({**value, "id": req_id}).decode(), [req_id])
        elif isinstance(value, list):
            if not value or len(value) > 50:
                self.exchange(orjson.dumps(value).decode(), [], 1)
            else:
                items = [dict(v, id=self._ids()) if isinstance(v, dict) else v for v in value]
                ids = [v["id"] for v in items if isinstance(v, dict)]
                self.exchange(orjson.dumps(items).decode(), ids, len(items) - len(ids))
        else:
            self.exchange(orjson.dumps(value).decode(), [], 1)

    @rule(text=st.text(max_size=100).filter(lambda t: not _is_json(t)))
    def not_json(self, text: str) -> None:
        self.exchange(text, [], 1)

    @rule(data=st.binary(max_size=100))
    def binary_frame(self, data: bytes) -> None:
        self.exchange(data, [], 1)

    @rule(methods=st.lists(st.sampled_from(METHODS), min_size=1, max_size=5), key=keys)
    def batch(self, methods: list[str], key: str) -> None:
        items = [{"jsonrpc": "2.0", "id": self._ids(), "method": m, "params": {"sessionKey": key}}
                 for m in methods]
        self.exchange(orjson.dumps(items).decode(), [i["id"] for i in items])

    @rule()
    def still_healthy(self) -> None:
        assert self.request("gateway.health", {})["result"]["status"] == "ok"


def _is_json(text: str) -> bool:
    try:
        orjson.loads(text)
    except orjson.JSONDecodeError:
        return False
    return True


def check_reply(item: dict[str, Any]) -> None:
    """A well-formed JSON-RPC 2.0 response with a known code; never an internal error."""
    assert item.get("jsonrpc") == "2.0", item
    assert ("result" in item) != ("error" in item), item
    assert set(item) <= {"jsonrpc", "id", "result", "error"}, item
    if "error" in item:
        err = item["error"]
        assert isinstance(err.get("code"), int) and isinstance(err.get("message"), str), item
        assert err["code"] != -32603, item
        assert err["code"] in KNOWN_CODES, item


@pytest.fixture(scope="module")
def live_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultDaemon]:
    port = free_port()
    model = subprocess.Popen([sys.executable, "-m", "tests.fake_openai", "--port", str(port)],
                             stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    assert model.stdout is not None
    model.stdout.readline()
    env = {"RECALLD_LLM_BASE_URL": f"http://127.0.0.1:{port}/v1", "RECALLD_LLM_API_KEY": "sk-fuzz",
           "RECALLD_LLM_MODEL": "fake-model", "RECALLD_LLM_MAX_RETRIES": "0",
           "RECALLD_MEMORY_DEBOUNCE_MS": "50", "RECALLD_AUTH_MAX_FAILURES": "1000000000",
           "RECALLD_SESSIONS_FSYNC": "never"}
    daemon = FaultDaemon(Path(tmp_path_factory.mktemp("fuzz")) / "data", env=env)
    try:
        yield daemon
    finally:
        daemon.kill()
        kill_quietly(model)
        model.stdout.close()


def test_random_call_sequences_never_break_the_daemon(live_daemon: FaultDaemon) -> None:
    """Random sequences of calls, params and frames: well-formed replies, no -32603, no crash
    in the log, and the daemon is alive at the end."""
    Live.url = live_daemon.url
    run_state_machine_as_test(DaemonFuzz, settings=settings(
        max_examples=250, stateful_step_count=40, deadline=None, database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                               HealthCheck.data_too_large]))
    assert live_daemon.proc.poll() is None
    crashes = [r for r in list(live_daemon.lines) if r.get("event") in CRASH_EVENTS]
    assert not crashes, crashes[:3]
