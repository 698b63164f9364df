"""Pipelined requests on one connection: the replies the read loop answers inline share socket
writes (gateway.transport.writes), and every request is still answered, in order."""

from __future__ import annotations

import asyncio
import inspect
import socket
from collections.abc import Callable, Sized
from typing import Any

import orjson
from websockets.asyncio.client import connect
from websockets.asyncio.server import ServerConnection

from gateway.app import App
from gateway.config import Config
from gateway.transport.writes import HOLD_BYTES, HeldWrites
from tests.conftest import TOKEN, running
from tests.faults.test_abuse import small_buffer_socket

AUTH = {"Authorization": f"Bearer {TOKEN}"}


def _server_ws(app: App) -> HeldWrites:
    (conn,) = app.server.connections
    assert isinstance(conn.ws, HeldWrites)
    return conn.ws


def _count_writes(ws: HeldWrites) -> list[int]:
    """Wraps the server side's transport.write; the list grows by the size of each write."""
    sizes: list[int] = []
    write = ws.transport.write

    def counting(data: Any) -> None:
        sizes.append(len(data))
        write(data)

    ws.transport.write = counting  # type: ignore[method-assign]
    return sizes


async def _replies(ws: Any, n: int) -> list[dict[str, Any]]:
    async with asyncio.timeout(30):
        return [orjson.loads(await ws.recv()) for _ in range(n)]


async def test_a_burst_of_inline_calls_is_answered_in_order_in_fewer_writes(app: App) -> None:
    """200 gateway.health requests sent at once get 200 replies in request order, and the
    server writes them in fewer socket writes than replies."""
    async with connect(app.url, additional_headers=AUTH) as ws:
        await ws.send(orjson.dumps({"jsonrpc": "2.0", "id": -1, "method": "gateway.health"}),
                      text=True)
        await _replies(ws, 1)  # the server's connection is registered by now
        server_ws = _server_ws(app)
        assert server_ws.can_hold_bursts  # websockets' queue of received frames was found
        writes = _count_writes(server_ws)
        for i in range(200):  # no await yields here: the frames reach the server together
            await ws.send(orjson.dumps({"jsonrpc": "2.0", "id": i, "method": "gateway.health"}),
                          text=True)
        replies = await _replies(ws, 200)
    assert [r["id"] for r in replies] == list(range(200))
    assert all(r["result"]["status"] == "ok" for r in replies)
    assert 1 <= len(writes) < 200


async def test_a_burst_mixing_inline_calls_tasks_notifications_and_errors(app: App) -> None:
    """In a burst of inline calls, task-run calls, notifications and bad frames, every request
    owed a reply gets exactly one, and the inline replies keep their order."""
    frames: list[bytes] = []
    owed: list[Any] = []
    for i in range(60):
        kind = i % 4
        if kind == 0:
            frames.append(orjson.dumps({"jsonrpc": "2.0", "id": i, "method": "gateway.health"}))
        elif kind == 1:
            frames.append(orjson.dumps({"jsonrpc": "2.0", "id": i, "method": "sessions.list",
                                        "params": {}}))
        elif kind == 2:
            # owed nothing
            frames.append(orjson.dumps({"jsonrpc": "2.0", "method": "gateway.health"}))
            continue
        else:
            # parse error
            frames.append(b'{"jsonrpc": "2.0", "id": ' + str(i).encode() + b', "method": ')
            owed.append(None)
            continue
        owed.append(i)
    async with connect(app.url, additional_headers=AUTH) as ws:
        for frame in frames:
            await ws.send(frame, text=True)
        replies = await _replies(ws, len(owed))
        # Nothing else was owed: the next reply is the answer to this probe.
        await ws.send(orjson.dumps({"jsonrpc": "2.0", "id": "probe", "method": "gateway.health"}),
                      text=True)
        assert (await _replies(ws, 1))[0]["id"] == "probe"
    assert sorted(map(str, (r["id"] for r in replies))) == sorted(map(str, owed))
    inline = [r["id"] for r in replies if isinstance(r["id"], int) and r["id"] % 4 == 0]
    assert inline == sorted(inline) and len(inline) == 15
    assert all("result" in r for r in replies if r["id"] is not None)
    assert sum(r["error"]["code"] == -32700 for r in replies if r["id"] is None) == 15


async def test_a_client_that_never_reads_stops_the_inline_replies_at_the_socket(
    config_factory: Callable[..., Config]
) -> None:
    """3,000 gateway.health requests from a client that reads nothing: the replies written
    without send() still stop at a full socket (what the server holds for the connection stays
    within write_limit plus one burst), and once the client reads, each is answered in order."""
    cfg = config_factory(server={"write_limit": 4096})
    async with running(cfg) as app:
        ws = await connect(app.url, additional_headers=AUTH, max_size=None,
                           sock=small_buffer_socket(app.server.port))
        await ws.send(orjson.dumps({"jsonrpc": "2.0", "id": -1, "method": "gateway.health"}),
                      text=True)
        await _replies(ws, 1)
        server_ws = _server_ws(app)
        server_ws.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET,
                                                                socket.SO_SNDBUF, 4096)
        ws.transport.pause_reading()

        async def flood() -> None:
            for i in range(3000):
                await ws.send(orjson.dumps({"jsonrpc": "2.0", "id": i, "method": "gateway.health"}),
                              text=True)

        sender = asyncio.create_task(flood())
        peak = 0
        for _ in range(100):
            peak = max(peak, server_ws.transport.get_write_buffer_size() + server_ws._held_bytes)
            await asyncio.sleep(0.01)
        assert peak <= 4096 + HOLD_BYTES + 1024, peak
        ws.transport.resume_reading()
        replies = await _replies(ws, 3000)
        await sender
        await ws.close()
    assert [r["id"] for r in replies] == list(range(3000))


async def test_the_websockets_internals_held_writes_relies_on_are_there(app: App) -> None:
    """HeldWrites overrides websockets' internal ServerConnection.send_data and reads
    recv_messages.frames, paused and send_in_progress (websockets is pinned to the range this
    passes on, pyproject.toml): each exists with the shape it expects, and a frame websockets'
    own send() writes goes through the override (held while a hold is on, written at its end)."""
    assert list(inspect.signature(ServerConnection.send_data).parameters) == ["self"]
    async with connect(app.url, additional_headers=AUTH) as ws:
        await ws.send(orjson.dumps({"jsonrpc": "2.0", "id": -1, "method": "gateway.health"}),
                      text=True)
        await _replies(ws, 1)
        server_ws = _server_ws(app)
        assert server_ws.can_hold_bursts
        frames = server_ws.recv_messages.frames
        assert isinstance(frames, Sized) and len(frames) == 0  # nothing received and unread
        assert server_ws.paused is False and server_ws.send_in_progress is None
        writes = _count_writes(server_ws)
        server_ws.hold_writes = True
        await server_ws.send('{"jsonrpc":"2.0","method":"test.held"}')
        assert writes == [] and server_ws._held  # websockets' send() went through send_data
        server_ws.end_hold()
        assert len(writes) == 1 and not server_ws._held
        async with asyncio.timeout(10):
            assert orjson.loads(await ws.recv()) == {"jsonrpc": "2.0", "method": "test.held"}
