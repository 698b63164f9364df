"""A gateway run with memory.enabled = false holds a MemoryOff: chat, sessions and retention
work as on any node, nothing is indexed or recalled, and the memory methods say memory is off."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest

from gateway.client import Client, RpcError
from gateway.config import Config
from gateway.retention import RetentionSweeper
from memory import MemoryOff, MemoryUnavailable
from tests.conftest import TOKEN, running
from tests.fake_openai import FakeOpenAI
from tests.gateway.test_chat import run_to_end


async def test_chat_runs_and_sessions_go_on_with_memory_off(config_factory: Callable[..., Config],
                                                           fake_openai: FakeOpenAI) -> None:
    """A reply streams and is kept, the prompt carries no recall and no memory tools, health
    says memory is off, memory.search is refused, and sessions.delete deletes."""
    fake_openai.configure(reply="Noted.")
    cfg = config_factory(llm={"base_url": fake_openai.base_url, "model": "fake-model",
                              "max_retries": 0},
                         memory={"enabled": False})
    async with running(cfg) as app, Client.connect(app.url, TOKEN) as c:
        assert app.memory is None and not (app.config.data_dir / "memory.db").exists()
        key = (await c.call("sessions.create", {"systemPrompt": "Be brief."}))["sessionKey"]
        run_id = (await c.call("chat.send",
                               {"sessionKey": key, "message": "I live in Porto"}))["runId"]
        _, final = await run_to_end(c, run_id)
        assert final["method"] == "chat.final" and final["params"]["message"]["content"] == "Noted."
        sent = fake_openai.chat_requests[-1].json
        assert sent["messages"][0] == {"role": "system", "content": "Be brief."}
        assert "tools" not in sent
        health = await c.call("gateway.health")
        assert health["memory"] == {"enabled": False}
        with pytest.raises(RpcError) as refused:
            await c.call("memory.search", {"query": "Porto"})
        assert refused.value.code == -32601  # declared without a handler, as before MemoryOff
        assert (await c.call("sessions.delete", {"sessionKey": key}))["deleted"] is True
        assert not (app.config.data_dir / "memory.db").exists()


async def test_memory_off_keeps_nothing_and_refuses_what_needs_memory() -> None:
    """MemoryOff: the calls of a run or a sweep do nothing; a search, facts and episodes raise
    MemoryUnavailable naming memory.enabled."""
    off = MemoryOff()
    assert not off.config.enabled and not off.config.episodes and off.embedder is None
    off.nudge()
    off.catch_up()
    assert await off.delete_session("alice", "s") == 0
    assert await off.sweep_retention() == {}
    assert await off.recall("alice", "where do I live?", k=3) == []
    for needs_memory in (lambda: off.facts, lambda: off.episodes):
        with pytest.raises(MemoryUnavailable, match="memory.enabled"):
            needs_memory()
    with pytest.raises(MemoryUnavailable, match="memory.enabled"):
        await off.search("alice", "Porto")


async def test_retention_on_a_node_without_memory_sweeps_sessions_only(
        config_factory: Callable[..., Config]) -> None:
    """sessions.retention_days deletes an old session on a node without memory; the memory
    retention days are not a reason to sweep there."""
    cfg = config_factory(memory={"enabled": False})
    async with running(cfg) as app:
        app.store.create("default", created_at=datetime.now(UTC) - timedelta(days=400))
        off = MemoryOff()
        assert not RetentionSweeper(app.store, app.runs, off, sessions_days=0,
                                    memory_days=30).enabled
        sweeper = RetentionSweeper(app.store, app.runs, off, sessions_days=30, memory_days=30)
        assert sweeper.enabled
        assert (await sweeper.sweep())["sessions"] == 1
        assert app.store.list("default")[0] == []
