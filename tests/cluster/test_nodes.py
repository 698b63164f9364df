"""Several real gateway processes on one PostgreSQL: what a team running recalld on more than one
machine relies on — events cross nodes, one run at a time per session in append order,
idempotency across nodes, a killed node's session taken over, nothing lost on restart, memory
shared (what one node indexed, another finds; each chunk embedded once across nodes).

Nodes run with memory off except in the memory scenarios, so the others start faster."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from gateway.client import Client
from tests.conftest import TOKEN
from tests.fake_openai import FakeOpenAI
from tests.faults.helpers import FaultDaemon, daemon_env

pytestmark = pytest.mark.slow



def node_env(fake: FakeOpenAI, dsn: str, *, memory: bool = False) -> dict[str, str]:
    extra = {"RECALLD_MEMORY_WATCH": "true"} if memory else {"RECALLD_MEMORY_ENABLED": "false"}
    return daemon_env(fake, embed=memory, RECALLD_STORAGE_BACKEND="postgres",
                      RECALLD_STORAGE_DSN=dsn, **extra)


@asynccontextmanager
async def nodes(tmp_path: Path, fake: FakeOpenAI, dsn: str, n: int = 2, *, memory: bool = False,
                names: tuple[str, ...] = ("a", "b", "c")) -> AsyncIterator[list[FaultDaemon]]:
    """``n`` nodes started at the same moment on one (maybe empty) database."""
    started = await asyncio.gather(*(FaultDaemon.start(tmp_path / name,
                                                       env=node_env(fake, dsn, memory=memory))
                                     for name in names[:n]), return_exceptions=True)
    up = [d for d in started if isinstance(d, FaultDaemon)]
    try:
        for d in started:
            if isinstance(d, BaseException):
                raise d
        yield up
    finally:
        await asyncio.gather(*(d.akill() for d in up), return_exceptions=True)


async def eventually(check: Callable[[], Awaitable[Any]], timeout: float) -> Any:
    async with asyncio.timeout(timeout):
        while True:
            result = await check()
            if result:
                return result
            await asyncio.sleep(0.2)


async def history(c: Client, key: str) -> list[dict[str, Any]]:
    return list((await c.call("sessions.history", {"sessionKey": key, "limit": 200}))["messages"])


async def history_via(d: FaultDaemon, key: str) -> list[dict[str, Any]]:
    async with Client.connect(d.url, TOKEN) as c:
        return await history(c, key)


async def final_of(c: Client, run_id: str, timeout: float = 60) -> dict[str, Any]:
    """The terminal event of ``run_id`` (chat.final, chat.error or chat.aborted)."""
    async with asyncio.timeout(timeout):
        while True:
            event = await c.next_event(timeout=timeout)
            if event["method"] in ("chat.final", "chat.error", "chat.aborted") \
                    and event["params"].get("runId") == run_id:
                return event


def no_transcripts(root: Path) -> None:
    assert not list(root.rglob("*.jsonl")), "no transcript files on a postgres node"


async def test_two_nodes_share_sessions_and_events(tmp_path: Path, fake_openai: FakeOpenAI,
                                                   pg_dsn: str) -> None:
    """A session made on A is listed on B, A streams a run sent through B and sees B's
    sessions.watch events; both messages are in A's history; no transcript file is written."""
    fake_openai.configure(reply="The capital of Portugal is Lisbon.")
    async with nodes(tmp_path, fake_openai, pg_dsn) as (a, b):
        async with Client.connect(a.url, TOKEN) as ca, Client.connect(b.url, TOKEN) as cb:
            await ca.call("sessions.watch", {})
            key = (await cb.call("sessions.create", {"title": "geo"}))["sessionKey"]
            created = await ca.next_event("sessions.created", timeout=30)
            assert created["params"]["sessionKey"] == key
            listed = await ca.call("sessions.list", {})
            assert key in [s["sessionKey"] for s in listed["sessions"]]
            await ca.call("sessions.subscribe", {"sessionKey": key})
            run = await cb.call("chat.send", {"sessionKey": key,
                                              "message": "What is the capital of Portugal?"})
            final = await final_of(ca, run["runId"])
            assert final["method"] == "chat.final"
            assert "Lisbon" in final["params"]["message"]["content"]
            roles = [(m["role"], m["content"]) for m in await history(ca, key)]
            assert roles == [("user", "What is the capital of Portugal?"),
                             ("assistant", "The capital of Portugal is Lisbon.")]
    no_transcripts(tmp_path)


async def test_memory_search_on_the_other_node_finds_the_run(
    tmp_path: Path, fake_openai: FakeOpenAI, pg_dsn: str
) -> None:
    """B's memory.search finds, within 30 s, what a run sent through A said."""
    fake_openai.configure(reply="The capital of Portugal is Lisbon.")
    async with nodes(tmp_path, fake_openai, pg_dsn, memory=True) as (a, b):
        async with Client.connect(a.url, TOKEN) as ca, Client.connect(b.url, TOKEN) as cb:
            key = (await ca.call("sessions.create", {}))["sessionKey"]
            run = await ca.call("chat.send", {"sessionKey": key,
                                              "message": "What is the capital of Portugal?"})
            await final_of(ca, run["runId"])

            async def found() -> bool:
                hits = (await cb.call("memory.search", {"query": "capital of Portugal"}))["results"]
                return any("Lisbon" in h["content"] for h in hits)

            await eventually(found, 30)


async def test_idempotent_retry_through_the_other_node(tmp_path: Path, fake_openai: FakeOpenAI,
                                                       pg_dsn: str) -> None:
    """A retry of a send through another node answers the first runId and adds nothing."""
    async with nodes(tmp_path, fake_openai, pg_dsn) as (a, b):
        async with Client.connect(a.url, TOKEN) as ca, Client.connect(b.url, TOKEN) as cb:
            key = (await ca.call("sessions.create", {}))["sessionKey"]
            first = await ca.call("chat.send", {"sessionKey": key, "message": "hi",
                                                "idempotencyKey": "k1"})
            assert not first.get("duplicate")
            await final_of(ca, first["runId"])
            again = await cb.call("chat.send", {"sessionKey": key, "message": "hi",
                                                "idempotencyKey": "k1"})
            assert again["runId"] == first["runId"]
            assert again.get("duplicate") is True
            assert len(await history(cb, key)) == 2
            assert len(fake_openai.chat_requests) == 1


async def test_concurrent_sends_through_both_nodes_run_one_at_a_time(
        tmp_path: Path, fake_openai: FakeOpenAI, pg_dsn: str) -> None:
    """8 sends through two nodes at once give 8 replies; runs never overlap, and each reply
    answers its own user message, in the order the user messages were appended (the user lines
    are appended on arrival, so the transcript holds u,u,…,a,a as on one node)."""
    fake_openai.configure(delta_delay_s=0.01)
    async with nodes(tmp_path, fake_openai, pg_dsn) as (a, b):
        async with Client.connect(a.url, TOKEN) as ca, Client.connect(b.url, TOKEN) as cb:
            key = (await ca.call("sessions.create", {}))["sessionKey"]
            await ca.call("sessions.subscribe", {"sessionKey": key})
            sends = [(ca if i % 2 else cb).call("chat.send", {"sessionKey": key,
                                                              "message": f"message {i}"})
                     for i in range(8)]
            run_ids = {r["runId"] for r in await asyncio.gather(*sends)}
            order: list[str] = []  # runIds in the order their events arrive, collapsed
            finals: set[str] = set()
            async with asyncio.timeout(120):
                while len(finals) < 8:
                    event = await ca.next_event(timeout=120)
                    rid = event["params"].get("runId")
                    if rid is None:
                        continue
                    if not order or order[-1] != rid:
                        order.append(rid)
                    if event["method"] == "chat.final":
                        finals.add(rid)
            assert finals == run_ids
            assert len(order) == 8, f"runs interleaved: {order}"
            msgs = await history(ca, key)
            assert len(msgs) == 16
            users = [m["runId"] for m in msgs if m["role"] == "user"]
            replies = [m["runId"] for m in msgs if m["role"] == "assistant"]
            assert replies == users == order
            assert not any(m.get("aborted") or m.get("failed") for m in msgs)


async def test_a_killed_node_hands_its_session_over(tmp_path: Path, fake_openai: FakeOpenAI,
                                                    pg_dsn: str) -> None:
    """kill -9 of B mid-reply: A runs that session within 60 s, the killed run's user message is
    kept and its run ends as failed (chat.error, retryable; its line holds what B checkpointed);
    after every node restarts, the history is whole."""
    async with nodes(tmp_path, fake_openai, pg_dsn) as (a, b):
        async with Client.connect(a.url, TOKEN) as ca:
            key = (await ca.call("sessions.create", {}))["sessionKey"]
            await ca.call("sessions.subscribe", {"sessionKey": key})
            fake_openai.configure(reply="word " * 400, delta_delay_s=0.05)
            async with Client.connect(b.url, TOKEN) as cb:
                killed = await cb.call("chat.send", {"sessionKey": key,
                                                     "message": "tell me a long story"})
                delta = await ca.next_event("chat.delta", timeout=30)  # B's run, seen through A
                assert delta["params"]["runId"] == killed["runId"]
                os.kill(b.proc.pid, signal.SIGKILL)
            fake_openai.configure(reply="short answer", delta_delay_s=0.0)
            run = await ca.call("chat.send", {"sessionKey": key, "message": "are you there?"})
            ended = await final_of(ca, killed["runId"], timeout=60)
            assert ended["method"] == "chat.error" and ended["params"]["error"]["retryable"] is True
            assert ended["params"]["seq"] > delta["params"]["seq"]
            final = await final_of(ca, run["runId"], timeout=60)
            assert final["method"] == "chat.final"
            msgs = await history(ca, key)
            # The new user line was appended on arrival, before A ended the killed run.
            assert [(m["role"], m["runId"]) for m in msgs] == [
                ("user", killed["runId"]), ("user", run["runId"]),
                ("assistant", killed["runId"]), ("assistant", run["runId"])]
            assert msgs[0]["content"] == "tell me a long story"
            assert msgs[2].get("failed") is True and ("word " * 400).startswith(msgs[2]["content"])
            assert msgs[2]["content"] == ended["params"]["partial"]
            assert msgs[-1]["content"] == "short answer"
        before = await history_via(a, key)
    async with nodes(tmp_path, fake_openai, pg_dsn) as (a2, b2):
        assert await history_via(b2, key) == before
        assert await history_via(a2, key) == before
    no_transcripts(tmp_path)


async def test_three_nodes_restart_with_nothing_lost(tmp_path: Path, fake_openai: FakeOpenAI,
                                                     pg_dsn: str) -> None:
    """Runs through three nodes on an empty database, then every node restarted: every session
    and every message is still there, read through any node."""
    fake_openai.configure(reply="noted")
    async with nodes(tmp_path, fake_openai, pg_dsn, n=3) as ds:
        keys: dict[str, list[dict[str, Any]]] = {}
        for i, d in enumerate(ds):
            async with Client.connect(d.url, TOKEN) as c:
                key = (await c.call("sessions.create", {"title": f"node {i}"}))["sessionKey"]
                for j in range(2):
                    run = await c.call("chat.send", {"sessionKey": key,
                                                     "message": f"node {i} message {j}"})
                    await final_of(c, run["runId"])
                keys[key] = await history(c, key)
                assert len(keys[key]) == 4
    async with nodes(tmp_path, fake_openai, pg_dsn, n=3) as ds:
        for d in ds:
            async with Client.connect(d.url, TOKEN) as c:
                listed = {s["sessionKey"] for s in (await c.call("sessions.list", {}))["sessions"]}
                assert set(keys) <= listed
                for key, msgs in keys.items():
                    assert await history(c, key) == msgs
    no_transcripts(tmp_path)


async def test_each_chunk_is_embedded_once_across_nodes(tmp_path: Path, fake_openai: FakeOpenAI,
                                                        pg_dsn: str) -> None:
    """Messages sent through three nodes are indexed by whichever claims them; no text is sent to
    the embedder twice."""
    async with nodes(tmp_path, fake_openai, pg_dsn, n=3, memory=True) as ds:
        async with AsyncExitStack() as stack:
            clients = [await stack.enter_async_context(Client.connect(d.url, TOKEN)) for d in ds]
            for i, c in enumerate(clients):
                key = (await c.call("sessions.create", {}))["sessionKey"]
                run = await c.call("chat.send", {"sessionKey": key,
                                                 "message": f"node {i} talks about zebras {i}"})
                await final_of(c, run["runId"])

            async def indexed() -> bool:
                hits = (await clients[0].call("memory.search",
                                              {"query": "zebras", "k": 10}))["results"]
                return len({h["sessionKey"] for h in hits}) == 3

            await eventually(indexed, 30)
    texts = [t for r in fake_openai.requests if r.path.endswith("/embeddings")
             for t in (r.json["input"] if isinstance(r.json["input"], list) else [r.json["input"]])]
    passages = [t for t in texts if "zebras" in t and "talks" in t]
    assert passages and len(passages) == len(set(passages)), "a chunk was embedded twice"
