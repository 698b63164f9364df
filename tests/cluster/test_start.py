"""Starting a node on PostgreSQL: the store opens through ``[storage]``, the node joins the
others, and a server it cannot reach is a clear start-up error naming the setting."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gateway.app import start_app
from gateway.chat.gate import RunGate
from gateway.client import Client
from gateway.cluster import ClusterHub, ClusterNode
from gateway.cluster.runs import unanswered_before
from gateway.config import Config
from gateway.storage import StorageUnavailable
from sessions import Message, PgSessionStore
from tests.conftest import TOKEN
from tests.fake_openai import FakeOpenAI
from tests.faults.helpers import free_port


def _message(role: str, run_id: str | None) -> Message:
    return Message(id=f"{role}-{run_id}", role=role, content="x", ts="2026-01-01T00:00:00.000Z",
                   run_id=run_id)


def test_unanswered_before_lists_the_earlier_runs_without_a_reply_in_append_order() -> None:
    """Settling a run looks only at earlier user lines whose run wrote no assistant line."""
    msgs = [_message("user", "r1"), _message("user", "r2"), _message("assistant", "r1"),
            _message("user", "r3"), _message("user", "me"), _message("user", "r4")]
    assert unanswered_before(msgs, "me") == ["r2", "r3"]
    assert unanswered_before(msgs, "r2") == []


def test_the_cluster_hub_ends_a_dead_run_with_the_seq_after_the_last_one_seen() -> None:
    """A run ended for a dead node continues its seq, from events of any node."""
    hub = ClusterHub()
    hub.publish("u", "s", "chat.delta", {"sessionKey": "s", "runId": "r", "seq": 4, "delta": "x"})
    hub.run_ended_elsewhere("u", "s", "r")
    hub.run_ended_elsewhere("u", "s", "other")
    hub.run_ended_elsewhere("u", "s", "r")  # its end was announced already
    sent = [event for queue in hub._queues.values() for _, event in queue]
    assert [(m, p["runId"], p["seq"]) for _, _, m, p in sent] == [
        ("chat.delta", "r", 4), ("chat.aborted", "r", 5), ("chat.aborted", "other", 0)]


async def test_a_postgres_node_keeps_no_transcript_and_joins_the_cluster(
        config_factory: Callable[..., Config], fake_openai: FakeOpenAI, pg_dsn: str) -> None:
    """On postgres a run's messages go to the database, the chat runs have a gate, and the
    data dir holds no transcript; the node closes cleanly."""
    config = config_factory(storage={"backend": "postgres", "dsn": pg_dsn},
                            memory={"enabled": False},
                            llm={"base_url": fake_openai.base_url, "api_key": "sk-test",
                                 "model": "fake-model", "max_retries": 0})
    app = await start_app(config)
    try:
        assert app.cluster is not None
        gate: RunGate | None = app.runs.gate
        assert gate is app.cluster.runs
        async with Client.connect(app.url, TOKEN) as c:
            key = (await c.call("sessions.create", {}))["sessionKey"]
            run = await c.call("chat.send", {"sessionKey": key, "message": "hi"})
            final = await c.next_event("chat.final", timeout=30)
            assert final["params"]["runId"] == run["runId"]
            msgs = (await c.call("sessions.history", {"sessionKey": key}))["messages"]
            assert [m["role"] for m in msgs] == ["user", "assistant"]
    finally:
        await app.close()
        await app.close()
    assert not list(config.data_dir.rglob("*.jsonl"))


async def test_an_unreachable_server_fails_the_start_naming_the_setting(
        config_factory: Callable[..., Config]) -> None:
    """start_app refuses a DSN whose server does not answer, naming storage.dsn, and leaves
    the data dir free for the next start."""
    dsn = f"postgresql://nobody@127.0.0.1:{free_port()}/recalld"
    config = config_factory(storage={"backend": "postgres", "dsn": dsn, "connect_timeout_s": 2})
    with pytest.raises(StorageUnavailable, match="storage.dsn"):
        await start_app(config)
    with pytest.raises(StorageUnavailable):  # the data-dir lock was let go
        await start_app(config)


def test_serve_prints_the_storage_error_and_exits_1(tmp_path: Path) -> None:
    """`recalld serve` against an unreachable server prints one line naming storage.dsn and
    exits 1, as for the other start errors."""
    env: dict[str, Any] = {k: v for k, v in os.environ.items()
                           if not k.startswith(("RECALLD_", "OPENAI_"))}
    env.update({"RECALLD_TOKEN": TOKEN, "RECALLD_STORAGE_BACKEND": "postgres",
                "RECALLD_STORAGE_DSN": f"postgresql://nobody@127.0.0.1:{free_port()}/recalld",
                "RECALLD_STORAGE_CONNECT_TIMEOUT_S": "2", "RECALLD_MEMORY_ENABLED": "false"})
    done = subprocess.run([sys.executable, "-m", "gateway", "--data-dir", str(tmp_path / "d"),
                           "serve", "--port", "0"], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 1
    assert "recalld: cannot start: storage.dsn (RECALLD_STORAGE_DSN)" in done.stderr


async def test_a_run_start_on_one_node_follows_the_events_another_node_sent(pg_dsn: str) -> None:
    """What a lease hand-over relies on: once the sender's hub says its queued events left
    (sent) and the receiver's bus has caught up (barrier), the receiver has every one of them."""
    store = PgSessionStore(pg_dsn)
    a, b = ClusterNode(pg_dsn, ClusterHub(), store), ClusterNode(pg_dsn, ClusterHub(), store)
    await a.start()
    await b.start()
    try:
        for seq in range(50):
            a.hub.publish("u", "s", "chat.delta", {"sessionKey": "s", "runId": "r", "seq": seq,
                                                   "delta": "x"})
        a.hub.publish("u", "s", "chat.final", {"sessionKey": "s", "runId": "r", "seq": 50,
                                               "message": {}})
        await a.hub.sent()
        assert await b.bus.barrier()
        assert b.bus.delivered == 51
    finally:
        await a.close()
        await b.close()
        store.close()
