"""Closing the gateway leaves no socket open: not one that never sent a request, nor one that
asyncio accepted as the listener closed (its ``connection_made`` a loop turn after the close,
as a web page reconnecting while the daemon stops can be)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from gateway.config import Config
from gateway.transport.guard import SocketBudget
from tests.conftest import running


async def test_close_drops_a_silent_socket_without_waiting_out_its_timeouts(
        config_factory: Callable[..., Config]) -> None:
    """A TCP connection that has sent nothing is closed by the server's close at once, not
    after server.header_timeout_s or open_timeout_s (60 s each here)."""
    cfg = config_factory(server={"header_timeout_s": 60.0, "open_timeout_s": 60.0})
    async with running(cfg) as app:
        reader, writer = await asyncio.open_connection("127.0.0.1", app.server.port)
        try:
            async with asyncio.timeout(10):
                while app.server.sockets.count < 1:
                    await asyncio.sleep(0.01)
                await app.close()
                assert await reader.read() == b""  # the server closed it
            assert app.server.sockets.count == 0
        finally:
            writer.close()


class _Held(asyncio.Protocol):
    """The server side of one loopback connection: its transport and whether it was lost."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.lost = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost.done():
            self.lost.set_result(None)


async def test_shut_aborts_the_counted_sockets_and_every_one_admitted_after() -> None:
    """SocketBudget.shut() aborts each socket it counts, and a socket admitted after it (an
    accept that raced the close) is aborted on admission, so no descriptor outlives the loop."""
    held: list[_Held] = []

    def factory() -> _Held:
        held.append(_Held())
        return held[-1]

    listener = await asyncio.get_running_loop().create_server(factory, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    clients = [await asyncio.open_connection("127.0.0.1", port) for _ in range(2)]
    try:
        async with asyncio.timeout(10):
            while len(held) < 2 or any(h.transport is None for h in held):
                await asyncio.sleep(0.01)
        budget = SocketBudget(max_sockets=8, header_timeout_s=60.0)
        early, late = held
        assert early.transport is not None and late.transport is not None
        assert budget.admit(early, early.transport)

        assert budget.shut() == 1
        assert not budget.admit(late, late.transport)  # after the shut: refused and aborted
        async with asyncio.timeout(10):
            await asyncio.gather(early.lost, late.lost)
            for reader, _ in clients:
                assert await reader.read() == b""
        assert early.transport.is_closing() and late.transport.is_closing()
        budget.release(early)
        assert budget.count == 0
    finally:
        for _, writer in clients:
            writer.close()
        listener.close()
        await listener.wait_closed()
