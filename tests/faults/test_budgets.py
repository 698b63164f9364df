"""What one connection can make the daemon hold: list pages without prompt bodies, history
pages capped by bytes, a reply budget that a batch's entries share, batches that count per
entry, and control-frame floods closed 1008."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from gateway.app import App
from gateway.client import Client
from gateway.config import Config
from gateway.rpc import Registry, ReplyBudget, RpcCore, bounded
from gateway.transport.connection import Connection
from sessions import SessionsConfig, SessionStore
from tests.conftest import TOKEN, running
from tests.faults.helpers import FaultDaemon, daemon_env
from tests.faults.test_abuse import small_buffer_socket
from tests.gateway.test_rpc_core import Ctx

AUTH = {"Authorization": f"Bearer {TOKEN}"}


async def test_list_pages_carry_no_prompt_bodies(client: Client) -> None:
    """sessions.list leaves systemPrompt out whatever its size; sessions.get returns it whole."""
    prompt = "p" * 60_000
    keys = [(await client.call("sessions.create", {"systemPrompt": prompt}))["sessionKey"]
            for _ in range(3)]
    reply = await client.request("sessions.list", {"limit": 200})
    assert [s["sessionKey"] for s in reply["result"]["sessions"]] == keys[::-1]
    assert all("systemPrompt" not in s for s in reply["result"]["sessions"])
    assert len(orjson.dumps(reply)) < 2_000
    assert (await client.call("sessions.get", {"sessionKey": keys[0]}))["systemPrompt"] == prompt


async def _session_with_big_messages(app: App, c: Client, n: int, size: int) -> str:
    key: str = (await c.call("sessions.create"))["sessionKey"]
    for i in range(n):
        await asyncio.to_thread(app.store.append_message, "default", key, role="user",
                                content=f"{i:04d}" + "m" * size)
    return key


async def test_a_reply_larger_than_the_budget_is_a_clear_error(
    config_factory: Callable[..., Config]
) -> None:
    """History pages stop at a quarter of limits.max_reply_bytes (at least one message each), so
    they fit the budget; a reply that alone is larger (one message bigger than the budget)
    answers -32600 naming the limit, and the connection goes on serving."""
    async with running(config_factory(limits={"max_reply_bytes": 64 * 1024})) as app, \
            Client.connect(app.url, TOKEN) as c:
        key: str = (await c.call("sessions.create"))["sessionKey"]
        await asyncio.to_thread(app.store.append_message, "default", key, role="user",
                                content="huge" + "h" * 100_000)
        for i in range(3):
            await asyncio.to_thread(app.store.append_message, "default", key, role="user",
                                    content=f"{i:04d}" + "m" * 7_000)
        page = await c.call("sessions.history", {"sessionKey": key, "limit": 10})
        # 2 x 7 kB of a 16 KiB cap
        assert [m["content"][:4] for m in page["messages"]] == ["0001", "0002"]
        page = await c.call("sessions.history", {"sessionKey": key, "limit": 10,
                                                 "before": page["next"]})
        assert [m["content"][:4] for m in page["messages"]] == ["0000"]
        big = await c.request("sessions.history", {"sessionKey": key, "limit": 10,
                                                   "before": page["next"]})
        assert (big["error"]["code"] == -32600
                and "limits.max_reply_bytes" in big["error"]["message"]), big
        assert (await c.call("gateway.health"))["status"] == "ok"


def _shrink_server_buffers(app: App, but: set[Connection]) -> None:
    """Server-side send buffers of 4 kB for every connection not in ``but`` (loopback
    autotuning would otherwise absorb megabytes before the process holds anything)."""
    for conn in app.server.connections - but:
        conn.ws.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET,
                                                              socket.SO_SNDBUF, 4096)


def _held(app: App, but: set[Connection]) -> int:
    return sum(c.ws.transport.get_write_buffer_size() + c.outbox.pending_bytes
               for c in app.server.connections - but)


async def _read_all(ws: ClientConnection, n: int) -> list[dict[str, Any]]:
    ws.transport.resume_reading()
    out: list[dict[str, Any]] = []
    async with asyncio.timeout(30):
        while len(out) < n:
            msg = orjson.loads(await ws.recv())
            out += msg if isinstance(msg, list) else [msg]
    return out


async def test_a_client_that_never_reads_holds_at_most_the_reply_budget(
    config_factory: Callable[..., Config]
) -> None:
    """32 requests in flight whose ~200 kB replies are never read: what the server holds for
    that connection stays within limits.max_reply_bytes plus one reply; the replies past it are
    -32004 naming the budget, and every request is answered exactly once."""
    budget = 256 * 1024
    cfg = config_factory(limits={"max_reply_bytes": budget}, server={"write_limit": 4096})
    async with running(cfg) as app, Client.connect(app.url, TOKEN) as c:
        key = await _session_with_big_messages(app, c, 10, 20_000)
        good = set(app.server.connections)
        ws = await connect(app.url, additional_headers=AUTH, max_size=None,
                           sock=small_buffer_socket(app.server.port))
        ws.transport.pause_reading()
        _shrink_server_buffers(app, good)
        for i in range(32):
            await ws.send(orjson.dumps({"id": i, "method": "sessions.history",
                                        "params": {"sessionKey": key, "limit": 10}}).decode())
        peak = 0
        for _ in range(100):
            peak = max(peak, _held(app, good))
            await asyncio.sleep(0.01)
        assert peak <= budget + 210_000, peak
        assert (await c.call("gateway.health"))["status"] == "ok"
        replies = await _read_all(ws, 32)
        assert sorted(r["id"] for r in replies) == list(range(32))
        refused = [r for r in replies if "error" in r]
        assert refused and all(r["error"]["code"] == -32004
                               and "max_reply_bytes" in r["error"]["message"]
                               and r["error"]["data"]["retryAfterMs"] > 0 for r in refused)
        assert any("result" in r for r in replies)
        await ws.close()


async def test_a_users_connections_together_hold_at_most_the_user_reply_budget(
    config_factory: Callable[..., Config]
) -> None:
    """Three connections of one user each pipeline 32 requests whose ~60 kB replies are never
    read: together they hold at most limits.max_user_reply_bytes plus a reply each (one
    connection's budget apiece would be three times that); the replies past it are -32004
    naming the setting, and every request is answered exactly once (issue 22, N2)."""
    budget = 256 * 1024
    cfg = config_factory(limits={"max_reply_bytes": budget, "max_user_reply_bytes": budget},
                         server={"write_limit": 4096})
    async with running(cfg) as app, Client.connect(app.url, TOKEN) as c:
        key = await _session_with_big_messages(app, c, 10, 20_000)
        good = set(app.server.connections)
        flooders = [await connect(app.url, additional_headers=AUTH, max_size=None,
                                  sock=small_buffer_socket(app.server.port)) for _ in range(3)]
        for ws in flooders:
            ws.transport.pause_reading()
        _shrink_server_buffers(app, good)
        for i in range(32):
            for ws in flooders:
                await ws.send(orjson.dumps({"id": i, "method": "sessions.history",
                                            "params": {"sessionKey": key, "limit": 10}}).decode())
        peak = 0
        for _ in range(100):
            peak = max(peak, _held(app, good))
            await asyncio.sleep(0.01)
        assert peak <= budget + 3 * 70_000, peak
        assert (await c.call("gateway.health"))["status"] == "ok"
        replies = [r for ws in flooders for r in await _read_all(ws, 32)]
        assert sorted(r["id"] for r in replies) == sorted(list(range(32)) * 3)
        refused = [r for r in replies if "error" in r]
        assert any(r["error"]["code"] == -32004 and "max_user_reply_bytes" in r["error"]["message"]
                   and r["error"]["data"]["retryAfterMs"] > 0 for r in refused), refused[:3]
        assert any("result" in r for r in replies)
        for ws in flooders:
            await ws.close()
        async with asyncio.timeout(10):  # the user's shared budget goes with their last connection
            while len(app.server.user_budgets) > 1:
                await asyncio.sleep(0.01)


async def test_a_batch_holds_one_in_flight_slot_per_entry(
    config_factory: Callable[..., Config]
) -> None:
    """A batch whose reply is stuck on a client that does not read holds one limits.max_inflight
    slot per entry, so the next request on that connection is refused -32004 at once."""
    cfg = config_factory(limits={"max_inflight": 4}, server={"write_limit": 4096})
    async with running(cfg) as app, Client.connect(app.url, TOKEN) as c:
        key = await _session_with_big_messages(app, c, 10, 20_000)
        good = set(app.server.connections)
        ws = await connect(app.url, additional_headers=AUTH, max_size=None,
                           sock=small_buffer_socket(app.server.port))
        ws.transport.pause_reading()
        _shrink_server_buffers(app, good)
        entry = {"method": "sessions.history", "params": {"sessionKey": key, "limit": 10}}
        await ws.send(orjson.dumps([{"id": f"b{i}", **entry} for i in range(4)]).decode())
        await asyncio.sleep(0.5)  # the batch's reply is now stuck in the socket
        await ws.send(orjson.dumps({"id": "next", **entry}).decode())
        replies = {r["id"]: r for r in await _read_all(ws, 5)}
        assert replies["next"]["error"]["code"] == -32004, replies["next"]
        assert all("result" in replies[f"b{i}"] for i in range(4))
        await ws.close()


@pytest.mark.parametrize("authenticated", [False, True])
async def test_a_ping_flood_is_closed_1008_and_stays_bounded(app: App, authenticated: bool) -> None:
    """A peer that sends 20,000 pings of 125 bytes and reads nothing (before or after
    authentication) is closed 1008 once past limits.max_control_frames_per_s; the pongs the
    server holds for it stay small meanwhile, and others are served."""
    before = set(app.server.connections)
    ws = await connect(app.url, additional_headers=AUTH if authenticated else None,
                       sock=small_buffer_socket(app.server.port), ping_interval=None)
    ws.transport.pause_reading()
    async with asyncio.timeout(5):
        while not app.server.connections - before:
            await asyncio.sleep(0.01)
    _shrink_server_buffers(app, before)
    (conn,) = app.server.connections - before
    peak = 0
    with contextlib.suppress(ConnectionError, ConnectionClosed):
        for i in range(20_000):
            ws.protocol.send_ping(i.to_bytes(4, "big") + b"p" * 121)
            ws.send_data()
            if i % 200 == 0:
                await asyncio.sleep(0.001)
                peak = max(peak, conn.ws.transport.get_write_buffer_size())
            if ws.transport.is_closing():
                break
    async with asyncio.timeout(10):
        while conn in app.server.connections:
            peak = max(peak, conn.ws.transport.get_write_buffer_size())
            await asyncio.sleep(0.01)
    assert peak < 256 * 1024, peak
    ws.transport.resume_reading()
    with contextlib.suppress(ConnectionClosed):
        async with asyncio.timeout(10):
            while True:
                await ws.recv()
    assert ws.close_code in (1008, 1006), ws.close_code
    async with Client.connect(app.url, TOKEN) as c:
        assert (await c.call("gateway.health"))["status"] == "ok"


def _peak_rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))


async def test_a_batch_of_big_history_pages_shares_one_reply_budget(tmp_path: Path) -> None:
    """One frame of 20 sessions.history (limit 200) over 20 messages of 250 kB, with a 1 MiB
    limits.max_reply_bytes: each page stops at its byte cap, the entries share the budget, the
    ones past it answer -32004 without being built, and the daemon's peak memory grows by far
    less than the ~100 MB the whole batch would hold."""
    data = tmp_path / "data"
    with SessionStore(data, SessionsConfig(fsync="never")) as store:
        key = store.create("default").session_key
        for i in range(20):
            store.append_message("default", key, role="user", content=f"{i:04d}" + "x" * 250_000)
    d = await FaultDaemon.start(data, env=daemon_env(
        RECALLD_LIMITS_MAX_REPLY_BYTES=str(1024 * 1024), RECALLD_MEMORY_ENABLED="false"))
    try:
        async with Client.connect(d.url, TOKEN) as c:
            assert (await c.call("gateway.health"))["status"] == "ok"
            before = _peak_rss_kib(d.proc.pid)
            await c.ws.send(orjson.dumps([{"jsonrpc": "2.0", "id": i, "method": "sessions.history",
                                           "params": {"sessionKey": key, "limit": 200}}
                                          for i in range(20)]),
                            text=True)
            async with asyncio.timeout(60):  # the client hands a batch reply over entry by entry
                reply = [await c.events.get() for _ in range(20)]
            grown_mb = (_peak_rss_kib(d.proc.pid) - before) / 1024
            print(f"daemon peak RSS grew by {grown_mb:.1f} MiB")
            assert [r.get("id") for r in reply] == list(range(20)), str(reply)[:300]
            served = [r for r in reply if "result" in r]
            refused = [r for r in reply if "error" in r]
            assert served and refused
            assert all(len(r["result"]["messages"]) == 1 and r["result"]["next"] for r in served)
            assert all(r["error"]["code"] == -32004 and r["error"]["data"]["retryAfterMs"] > 0
                       and "limits.max_reply_bytes" in r["error"]["message"] for r in refused)
            assert len(orjson.dumps(reply)) <= 1024 * 1024
            assert grown_mb < 25, grown_mb
            # The cursor pages on: the next page is the message before the one served.
            page = await c.call("sessions.history", {"sessionKey": key, "limit": 200,
                                                     "before": served[0]["result"]["next"]})
            assert [m["content"][:4] for m in page["messages"]] == ["0018"]
    finally:
        await d.akill()


@dataclass(frozen=True, slots=True)
class BlobParams:
    n: int = bounded(1, min=1, max=1_000_000)


async def test_the_core_runs_a_batch_within_the_budget_it_is_given() -> None:
    """Without any socket, a batch of ten 8 kB replies under a 40 kB budget (10 kB reserved per
    running entry): entries still run concurrently, each reply counts as soon as it is made,
    and once the next could not fit the rest answer -32004 without their handler running."""
    running = peak = calls = 0

    async def blob(ctx: Any, p: BlobParams) -> dict[str, Any]:
        nonlocal running, peak, calls
        calls += 1
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.01)
        running -= 1
        return {"blob": "x" * p.n}

    reg = Registry()
    reg.declare("test.blob", BlobParams, "n bytes", blob)
    core = RpcCore(reg, max_batch=50, reply_reserve=10_000)
    frame = orjson.dumps([{"jsonrpc": "2.0", "id": i, "method": "test.blob", "params": {"n": 8_000}}
                          for i in range(10)])
    reply = await core.accept(frame, Ctx()).run(ReplyBudget(limit=40_000))
    assert reply is not None and reply.is_error and len(reply.data) <= 40_000
    answers = orjson.loads(reply.data)
    assert [a["id"] for a in answers] == list(range(10))
    served = [a for a in answers if "result" in a]
    refused = [a for a in answers if "error" in a]
    assert answers[:len(served)] == served and len(served) == calls == 4
    assert all(a["error"]["code"] == -32004 and a["error"]["message"].startswith("not run")
               and a["error"]["data"]["retryAfterMs"] > 0 for a in refused)
    assert 2 <= peak <= 4
    unbounded = await core.accept(frame, Ctx()).run()  # no budget: every entry runs
    assert unbounded is not None and not unbounded.is_error and calls == 14


async def test_pipelined_single_calls_share_the_reply_budget() -> None:
    """Without any socket, twenty single calls of 8 kB replies started together on one
    connection whose 40 kB budget is never read (10 kB reserved per running call): at most four
    build at once, the others queue, each is answered once, the replies held stay within the
    budget and those past it answer -32004 naming it."""
    running = peak = 0

    async def blob(ctx: Any, p: BlobParams) -> dict[str, Any]:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.01)
        running -= 1
        return {"blob": "x" * p.n}

    reg = Registry()
    reg.declare("test.blob", BlobParams, "n bytes", blob)
    core = RpcCore(reg, max_batch=50, reply_reserve=10_000)
    budget = ReplyBudget(limit=40_000)
    ctx = Ctx()
    replies = await asyncio.gather(*(
        core.accept(orjson.dumps({"id": i, "method": "test.blob", "params": {"n": 8_000}}),
                    ctx).run(budget)
        for i in range(20)))
    answers = [orjson.loads(r.data) for r in replies if r is not None]
    assert [a["id"] for a in answers] == list(range(20))
    served = [a for a in answers if "result" in a]
    refused = [a for a in answers if "error" in a]
    assert 2 <= peak <= 4 and len(served) == 4
    assert sum(len(orjson.dumps(a)) for a in served) <= 40_000
    assert all(a["error"]["code"] == -32004 and "limits.max_reply_bytes" in a["error"]["message"]
               for a in refused)
    assert budget.running == budget.reserved == 0


async def test_pipelined_big_history_pages_never_read_stay_within_the_budget(
    tmp_path: Path
) -> None:
    """32 sessions.history calls of a 2 MiB page each, pipelined on one connection that never
    reads (limits.max_reply_bytes 8 MiB): the calls past the budget queue instead of building
    their pages side by side, those whose reply would not fit answer -32004 naming the budget,
    every call is answered once, and the daemon's peak memory grows by far less than the
    ~200 MB the 32 pages built at once would take (finding N2)."""
    data = tmp_path / "data"
    with SessionStore(data, SessionsConfig(fsync="never")) as store:
        key = store.create("default").session_key
        for i in range(16):
            store.append_message("default", key, role="user", content=f"{i:04d}" + "x" * 250_000)
    d = await FaultDaemon.start(data, env=daemon_env(
        RECALLD_LIMITS_MAX_REPLY_BYTES=str(8 * 1024 * 1024), RECALLD_MEMORY_ENABLED="false"))
    try:
        async with Client.connect(d.url, TOKEN) as c:
            assert (await c.call("gateway.health"))["status"] == "ok"
            before = _peak_rss_kib(d.proc.pid)
            ws = await connect(d.url, additional_headers=AUTH, max_size=None,
                               sock=small_buffer_socket(d.port))
            ws.transport.pause_reading()
            for i in range(32):
                await ws.send(orjson.dumps({"id": i, "method": "sessions.history",
                                            "params": {"sessionKey": key, "limit": 200}}).decode())
            # Until the daemon is done with what it can do while nothing is read: its peak
            # stops growing (the assertions below hold however long this takes).
            last, stable = -1, 0
            async with asyncio.timeout(60):
                while stable < 10:
                    await asyncio.sleep(0.1)
                    now = _peak_rss_kib(d.proc.pid)
                    stable = stable + 1 if now == last else 0
                    last = now
            grown_mb = (_peak_rss_kib(d.proc.pid) - before) / 1024
            print(f"daemon peak RSS grew by {grown_mb:.1f} MiB while nothing was read")
            replies = await _read_all(ws, 32)
            await ws.close()
            assert sorted(r["id"] for r in replies) == list(range(32))
            refused = [r for r in replies if "error" in r]
            assert refused and all(r["error"]["code"] == -32004
                                   and "max_reply_bytes" in r["error"]["message"]
                                   for r in refused)
            assert any("result" in r for r in replies)
            assert grown_mb < 80, grown_mb
            assert (await c.call("gateway.health"))["status"] == "ok"
    finally:
        await d.akill()
