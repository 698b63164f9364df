"""kill -9 at randomised points, torn tails, a broken memory.db, SIGTERM mid-run.

The daemon runs as a real subprocess (``recalld serve``); the fake model and embedder run in
the test's own event loop. After every crash the next start must show whole transcripts,
every acknowledged user message exactly once, and — once the start-up sync is done — an index
equal to a fresh chunking of the transcripts, with no duplicated chunks.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gateway.client import Client
from memory.config import MemoryConfig
from sessions.config import SessionsConfig
from sessions.store import SessionStore
from tests.conftest import TOKEN
from tests.fake_openai import FakeOpenAI
from tests.faults.helpers import (
    Acked,
    FaultDaemon,
    check_index,
    check_transcripts,
    daemon_env,
    wait_synced,
)

ROUNDS = 8
_WORDS = ("river lantern copper orbit velvet quartz meadow signal harbor cipher ember willow "
          "falcon prism tundra saffron glacier marble thunder violet compass nectar basalt").split()


async def verify_after_restart(d: FaultDaemon, acked: Acked, *, embedded: bool,
                               config: MemoryConfig | None = None) -> dict[str, Any]:
    """The two invariants after a restart: transcripts whole with every acked message, index
    equal to the transcripts once the start-up sync is done; and the daemon serves."""
    check_transcripts(d.data_dir, acked)
    async with Client.connect(d.url, TOKEN) as c:
        status = await wait_synced(c, embedded=embedded)
        counts = check_index(d.data_dir, config, embedded=embedded)
        assert (status["files"], status["chunks"]) == (counts["files"], counts["chunks"])
        assert status["lastError"] is None
        for user_key in list(acked.by_session)[:3]:
            history = await c.call("sessions.history", {"sessionKey": user_key[1], "limit": 200})
            texts = {m["content"] for m in history["messages"]}
            assert set(acked.by_session[user_key].values()) <= texts
    return status


async def _send(c: Client, key: str, text: str, acked: Acked) -> None:
    reply = await c.request("chat.send", {"sessionKey": key, "message": text})
    if "result" in reply:
        acked.add(key, reply["result"]["runId"], text)


async def streaming_round(d: FaultDaemon, rng: random.Random, acked: Acked,
                          keys: list[str]) -> None:
    """Three clients start long streamed replies; the daemon dies at a random moment of them."""
    async with contextlib.AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(Client.connect(d.url, TOKEN)) for _ in range(3)]
        for i, c in enumerate(clients):
            if len(keys) < 6 or rng.random() < 0.3:
                keys.append((await c.call("sessions.create",
                                          {"title": f"s{len(keys)}"}))["sessionKey"])
            key = keys[-1] if i == 0 else rng.choice(keys)
            await _send(c, key, f"stream {len(acked)} {rng.choice(_WORDS)}", acked)
        await asyncio.sleep(rng.uniform(0.0, 0.9))
        await d.akill()


async def append_round(d: FaultDaemon, rng: random.Random, acked: Acked, keys: list[str]) -> None:
    """Eight clients append as fast as they can (creates and sends); kill -9 lands amid appends."""
    stop = asyncio.Event()

    async def worker(n: int) -> None:
        async with Client.connect(d.url, TOKEN) as c:
            while not stop.is_set():
                if rng.random() < 0.2 or not keys:
                    keys.append((await c.call("sessions.create"))["sessionKey"])
                await _send(c, rng.choice(keys), f"append {n} {len(acked)} {rng.choice(_WORDS)}",
                            acked)

    tasks = [asyncio.create_task(worker(n)) for n in range(8)]
    await asyncio.sleep(rng.uniform(0.05, 0.6))
    await d.akill()
    stop.set()
    await asyncio.gather(*tasks, return_exceptions=True)


def seed_transcripts(data_dir: Path, sessions: int, messages: int, rng: random.Random) -> None:
    """A history big enough that a full re-chunk and embed take a while."""
    with SessionStore(data_dir, SessionsConfig(fsync="never")) as store:
        for s in range(sessions):
            key = store.create("default", title=f"seed {s}").session_key
            for m in range(messages):
                text = " ".join(rng.choice(_WORDS) + str(rng.randrange(500))
                                for _ in range(rng.randrange(20, 120)))
                store.append_message("default", key, role="user" if m % 2 == 0 else "assistant",
                                     content=text)


@pytest.mark.parametrize("scenario", ["streaming", "append"])
async def test_kill_9_mid_run_loses_no_acknowledged_message(
    tmp_path: Path, fake_openai: FakeOpenAI, scenario: str
) -> None:
    """kill -9 during streamed replies / during a burst of appends, at random moments, over
    several rounds: every restart finds whole transcripts with each acked message once, and an
    index equal to the transcripts after the start-up sync."""
    rng = random.Random(f"{scenario}-{os.getpid()}-{time.time_ns()}")
    if scenario == "streaming":
        fake_openai.configure(reply=" ".join(_WORDS * 3), delta_delay_s=0.01)
        work, extra = streaming_round, {}
    else:
        work, extra = append_round, {"RECALLD_SESSIONS_FSYNC": "always"}
    env = daemon_env(fake_openai, embed=True, **extra)
    data = tmp_path / "data"
    acked, keys = Acked(), list[str]()
    for _ in range(ROUNDS):
        d = await FaultDaemon.start(data, env=env)
        try:
            if len(acked):
                await verify_after_restart(d, acked, embedded=True)
            await work(d, rng, acked, keys)
        finally:
            await d.akill()
    assert len(acked) >= ROUNDS
    d = await FaultDaemon.start(data, env=env)
    try:
        await verify_after_restart(d, acked, embedded=True)
        assert await d.astop(signal.SIGTERM) == 0
    finally:
        await d.akill()


async def test_kill_9_during_index_transactions_converges(
    tmp_path: Path, fake_openai: FakeOpenAI
) -> None:
    """kill -9 while the start-up sync re-chunks and embeds a large history (a new chunking each
    round, so every file is rewritten in the index): the next start converges to the transcripts,
    with no duplicated chunks and one vector per chunk."""
    rng = random.Random(f"index-{os.getpid()}-{time.time_ns()}")
    data = tmp_path / "data"
    await asyncio.to_thread(seed_transcripts, data, 40, 30, rng)
    interrupted = 0
    for _ in range(ROUNDS - 2):
        tokens = rng.randrange(48, 400)
        chunking = {"RECALLD_MEMORY_CHUNK_TOKENS": str(tokens),
                    "RECALLD_MEMORY_OVERLAP_TOKENS": str(tokens // 5)}
        d = await FaultDaemon.start(data, env=daemon_env(fake_openai, embed=True, **chunking))
        await asyncio.sleep(rng.uniform(0.0, 0.6))
        await d.akill()
        assert not d.events("memory.sync.failed")
        interrupted += not d.events("memory.sync")
        # Restart with the same settings: the interrupted work is finished, not duplicated.
        d = await FaultDaemon.start(data, env=daemon_env(fake_openai, embed=True, **chunking))
        try:
            cfg = MemoryConfig(chunk_tokens=tokens, overlap_tokens=tokens // 5)
            await verify_after_restart(d, Acked(), embedded=True, config=cfg)
        finally:
            await d.akill()
    assert interrupted >= 1, "no kill landed inside a sync; the rounds proved nothing"


# --- torn and garbage tails ------------------------------------------------------------------

TAILS: dict[str, Callable[[bytes], bytes]] = {
    "half-line": lambda line: line[: len(line) // 2],
    "zero-bytes": lambda line: b"\0" * 4096,
    "zero-bytes-line": lambda line: b"\0" * 100 + b"\n",
    "invalid-utf8": lambda line: b'{"type":"message","content":"zzjunk \xff\xfe\xfd"}\n',
    "huge-line": lambda line: b'{"type":"message","content":"' + b"x" * (24 * 1024 * 1024),
    "garbage-lines": lambda line: b"zzjunk not json\n\x00\x01\x02\nzzjunk still not\n",
}


async def test_torn_and_garbage_tails_are_moved_aside(
    tmp_path: Path, fake_openai: FakeOpenAI
) -> None:
    """Each tail shape on its own session: the daemon starts, moves exactly the bad bytes aside,
    keeps every valid line, indexes only the valid lines, and the sessions take new messages."""
    data = tmp_path / "data"
    env = daemon_env(fake_openai)
    d = await FaultDaemon.start(data, env=env)
    acked, keys = Acked(), {}
    try:
        async with Client.connect(d.url, TOKEN) as c:
            for shape in TAILS:
                key = (await c.call("sessions.create", {"title": shape}))["sessionKey"]
                keys[shape] = key
                for i in range(3):
                    await _send(c, key, f"{shape} kept {i}", acked)
            await asyncio.sleep(0.5)  # let the replies land
    finally:
        assert await d.astop() == 0
    before = check_transcripts(data, acked)
    sizes = {}
    for shape, make in TAILS.items():
        path = data / "sessions" / "default" / f"{keys[shape]}.jsonl"
        sizes[shape] = path.stat().st_size
        last = path.read_bytes().splitlines(keepends=True)[-1]
        with path.open("ab") as fh:
            fh.write(make(last))
    d = await FaultDaemon.start(data, env=env)
    try:
        after = check_transcripts(data, acked)
        assert after == before
        for shape in TAILS:
            path = data / "sessions" / "default" / f"{keys[shape]}.jsonl"
            assert path.stat().st_size == sizes[shape], shape
            assert len(list(path.parent.glob(f"{path.name}.corrupt-*"))) == 1, shape
        recovered = d.events("transcript.recovered")
        assert len(recovered) == len(TAILS)
        async with Client.connect(d.url, TOKEN) as c:
            await wait_synced(c)
            check_index(data)
            for shape, key in keys.items():
                await _send(c, key, f"{shape} after", acked)
            assert (await c.call("memory.search", {"query": "zzjunk",
                                                   "mode": "keyword"}))["results"] == []
            await asyncio.sleep(0.5)
            await wait_synced(c)
        check_transcripts(data, acked)
        check_index(data)
    finally:
        assert await d.astop() == 0


# --- a broken memory.db -----------------------------------------------------------------------

def _break_db(path: Path, how: str) -> None:
    if how == "deleted":
        path.unlink()
    elif how == "truncated":
        with path.open("r+b") as fh:
            fh.truncate(path.stat().st_size // 3)
    elif how == "random-bytes":
        path.write_bytes(random.Random(7).randbytes(path.stat().st_size))
    elif how == "zeroed-header":
        with path.open("r+b") as fh:
            fh.write(b"\0" * 100)


@pytest.mark.parametrize("how", ["deleted", "truncated", "random-bytes", "zeroed-header"])
async def test_broken_memory_db_is_rebuilt_and_says_so(
    tmp_path: Path, fake_openai: FakeOpenAI, how: str
) -> None:
    """A deleted, truncated or overwritten memory.db: the daemon starts, rebuilds the index from
    the transcripts, reports it in the log and in memory.status, and search finds old facts."""
    data = tmp_path / "data"
    env = daemon_env(fake_openai, embed=True)
    d = await FaultDaemon.start(data, env=env)
    acked = Acked()
    try:
        async with Client.connect(d.url, TOKEN) as c:
            for i in range(4):
                key = (await c.call("sessions.create"))["sessionKey"]
                await _send(c, key, f"my locker code is {i}{i}{i} and the lantern is blue", acked)
            await asyncio.sleep(0.3)
            before = await wait_synced(c, embedded=True)
    finally:
        assert await d.astop() == 0
    # A clean stop leaves one self-contained file (the WAL checkpointed and removed).
    assert not (data / "memory.db-wal").exists()
    _break_db(data / "memory.db", how)
    d = await FaultDaemon.start(data, env=env)
    try:
        async with Client.connect(d.url, TOKEN) as c:
            status = await wait_synced(c, embedded=True)
            assert status["rebuiltFromTranscripts"], status
            assert status["chunks"] == before["chunks"] and status["pending"] == 0
            hits = (await c.call("memory.search", {"query": "locker code lantern"}))["results"]
            assert len(hits) == 4
        assert d.events("memory.db.missing" if how == "deleted" else "memory.db.corrupt")
        check_index(data, embedded=True)
        check_transcripts(data, acked)
    finally:
        assert await d.astop() == 0


# --- SIGTERM during runs ----------------------------------------------------------------------

@pytest.mark.parametrize("outcome", ["finished", "aborted"])
async def test_sigterm_during_runs_finishes_or_records_aborted(
    tmp_path: Path, fake_openai: FakeOpenAI, outcome: str
) -> None:
    """SIGTERM with runs streaming: within the grace period they finish (or, if too long, are
    cancelled and written down as aborted with their partial text); exit code 0 either way."""
    grace = 3.0 if outcome == "finished" else 0.5
    # Short replies finish within the grace period; long ones cannot.
    deltas, delay = (20, 0.02) if outcome == "finished" else (3000, 0.02)
    fake_openai.configure(reply=" ".join(["word"] * deltas), delta_delay_s=delay)
    data = tmp_path / "data"
    env = daemon_env(fake_openai, RECALLD_SERVER_SHUTDOWN_GRACE_S=str(grace))
    d = await FaultDaemon.start(data, env=env)
    acked = Acked()
    try:
        async with Client.connect(d.url, TOKEN) as c:
            keys = [(await c.call("sessions.create"))["sessionKey"] for _ in range(4)]
            for key in keys:
                await _send(c, key, "tell me a long story", acked)
            await c.next_event("chat.delta")
            t0 = time.monotonic()
            code = await d.astop(signal.SIGTERM)
            elapsed = time.monotonic() - t0
    finally:
        await d.akill()
    assert code == 0
    # Far below the 60 s the long replies need: the grace period, not the runs, set the exit.
    assert elapsed < 30.0, elapsed
    lines = check_transcripts(data, acked)
    for key in keys:
        assistant = [m for m in lines[("default", key)][1:] if m.get("role") == "assistant"]
        assert len(assistant) == 1, key
        if outcome == "finished":
            assert (not assistant[0].get("aborted")
                    and assistant[0]["content"] == " ".join(["word"] * deltas))
        else:
            assert (assistant[0]["aborted"] is True
                    and len(assistant[0]["content"]) < len("word ") * deltas)
    if outcome == "aborted":
        assert d.events("chat.drain_timeout")
