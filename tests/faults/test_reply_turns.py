"""What one connection that stops reading costs the daemon: a call behind unread replies that
leave no room in the reply budget is refused before it builds anything, and the replies waiting
for the reader enter the socket's buffer one at a time, so each is held once, as the bytes the
budget counts (issue 22, N2: one connection x 32 pipelined 8 MiB pages never read)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
from websockets.asyncio.client import connect

from gateway.client import Client
from gateway.config import Config
from gateway.rpc import Registry, ReplyBudget, RpcCore, UserBudgets, bounded
from tests.conftest import TOKEN, running
from tests.faults.test_abuse import small_buffer_socket
from tests.gateway.test_rpc_core import Ctx


@dataclass(frozen=True, slots=True)
class BlobParams:
    n: int = bounded(1, min=1, max=1_000_000)


def _blob_core(reserve: int) -> tuple[RpcCore, list[int]]:
    """A core with one method that may wait (so it reserves ``reserve``), counting its runs."""
    calls: list[int] = []

    async def blob(ctx: Any, p: BlobParams) -> dict[str, Any]:
        calls.append(p.n)
        await asyncio.sleep(0)
        return {"blob": "x" * p.n}

    reg = Registry()
    reg.declare("test.blob", BlobParams, "n bytes", blob)
    return RpcCore(reg, max_batch=50, reply_reserve=reserve), calls


def _frame(n: int, req_id: int | None = 1) -> bytes:
    call: dict[str, Any] = {"method": "test.blob", "params": {"n": n}}
    return orjson.dumps(call if req_id is None else {"id": req_id, **call})


async def test_a_call_behind_unread_replies_is_refused_before_it_is_built() -> None:
    """With 35 kB of replies unread in a 40 kB budget (10 kB reserved per call) and nothing
    running, a call answers -32004 naming the budget without its handler running, even one
    whose reply would have fitted; a notification still runs (it holds no reply); once the
    client has read, the same call runs; and a lone call on an empty budget still runs even
    when its reservation alone exceeds the budget."""
    core, calls = _blob_core(reserve=10_000)
    budget = ReplyBudget(limit=40_000)
    budget.hold(35_000)
    reply = await core.accept(_frame(10), Ctx()).run(budget)
    assert reply is not None and reply.is_error
    error = orjson.loads(reply.data)["error"]
    assert error["code"] == -32004 and "limits.max_reply_bytes" in error["message"], error
    assert error["data"]["retryAfterMs"] > 0
    assert calls == []
    assert budget.running == budget.reserved == 0
    assert await core.accept(_frame(10, req_id=None), Ctx()).run(budget) is None
    assert calls == [10]
    budget.release(35_000 + len(reply.data))  # the client read them
    served = await core.accept(_frame(10), Ctx()).run(budget)
    assert served is not None and not served.is_error and calls == [10, 10]

    lone_core, lone_calls = _blob_core(reserve=100_000)
    lone = await lone_core.accept(_frame(10), Ctx()).run(ReplyBudget(limit=40_000))
    assert lone is not None and not lone.is_error and lone_calls == [10]


async def test_a_call_behind_the_users_unread_replies_is_refused_naming_the_user_budget() -> None:
    """Another connection of the same user holds 60 kB unread of the user's 64 kB: a call on a
    fresh connection answers -32004 naming limits.max_user_reply_bytes, unbuilt."""
    core, calls = _blob_core(reserve=10_000)
    users = UserBudgets(64_000)
    other, mine = ReplyBudget(limit=40_000), ReplyBudget(limit=40_000)
    users.join("bob", other)
    users.join("bob", mine)
    other.hold(35_000)
    mine.hold(25_000)
    mine.release(25_000)  # this connection's own budget is empty again
    other.hold(25_000)
    reply = await core.accept(_frame(10), Ctx("bob")).run(mine)
    assert reply is not None
    error = orjson.loads(reply.data)["error"]
    assert error["code"] == -32004 and "limits.max_user_reply_bytes" in error["message"], error
    assert calls == []


async def test_replies_waiting_for_a_reader_enter_the_socket_buffer_one_at_a_time(
    config_factory: Callable[..., Config]
) -> None:
    """A client pipelines 32 sessions.history calls of ~60 kB pages and stops reading: the
    replies the budget holds for it (several pages) wait their turn, and the transport's write
    buffer never holds more than one of them, where each used to be copied in at once; when
    the client reads, every call is answered exactly once."""
    cfg = config_factory(limits={"max_reply_bytes": 256 * 1024}, server={"write_limit": 4096})
    async with running(cfg) as app, Client.connect(app.url, TOKEN) as c:
        key: str = (await c.call("sessions.create"))["sessionKey"]
        for i in range(10):
            await asyncio.to_thread(app.store.append_message, "default", key, role="user",
                                    content=f"{i:04d}" + "m" * 20_000)
        good = set(app.server.connections)
        ws = await connect(app.url, additional_headers={"Authorization": f"Bearer {TOKEN}"},
                           max_size=None, sock=small_buffer_socket(app.server.port))
        ws.transport.pause_reading()
        async with asyncio.timeout(10):
            while not app.server.connections - good:
                await asyncio.sleep(0.01)
        (conn,) = app.server.connections - good
        conn.ws.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET,
                                                              socket.SO_SNDBUF, 4096)
        for i in range(32):
            await ws.send(orjson.dumps({"id": i, "method": "sessions.history",
                                        "params": {"sessionKey": key, "limit": 10}}).decode())
        page = 3 * 20_100  # a page stops at a quarter of the budget: three messages
        async with asyncio.timeout(30):  # every call has built its reply or been refused
            while conn.budget.running or conn.budget.held < 3 * page:
                await asyncio.sleep(0.01)
        buffered = 0
        for _ in range(20):
            buffered = max(buffered, conn.ws.transport.get_write_buffer_size())
            await asyncio.sleep(0.01)
        assert conn.budget.held >= 3 * page
        assert buffered <= page + 8192, (buffered, conn.budget.held)
        ws.transport.resume_reading()
        replies: list[dict[str, Any]] = []
        async with asyncio.timeout(30):
            while len(replies) < 32:
                replies.append(orjson.loads(await ws.recv()))
        assert sorted(r["id"] for r in replies) == list(range(32))
        assert any("result" in r for r in replies)
        await ws.close()
