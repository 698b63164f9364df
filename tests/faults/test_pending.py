"""Connections that have not authenticated wait in a smaller pool of their own (auth.max_pending,
auth.max_pending_per_address), so sockets that never authenticate cannot keep out a user who
has the token (issue 22, N1)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import orjson
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidStatus

from gateway.client import Client
from gateway.config import Config
from tests.conftest import TOKEN, running


async def _hold_unauthenticated(
    url: str, n: int
) -> tuple[list[ClientConnection], list[InvalidStatus]]:
    opened: list[ClientConnection] = []
    refused: list[InvalidStatus] = []

    async def one() -> None:
        try:
            opened.append(await connect(url, ping_interval=None))
        except InvalidStatus as exc:
            refused.append(exc)

    await asyncio.gather(*(one() for _ in range(n)))
    return opened, refused


async def test_unauthenticated_sockets_cannot_keep_out_a_token_holder(
    config_factory: Callable[..., Config]
) -> None:
    """With more unauthenticated upgrades than server.max_connections, those past auth.max_pending
    get 503 naming the setting, and fresh connections with the token all get in and work."""
    cfg = config_factory(server={"max_connections": 16},
                         auth={"max_pending": 8, "max_pending_per_address": 100})
    async with running(cfg) as app:
        opened, refused = await _hold_unauthenticated(app.url, 30)
        try:
            assert len(opened) == 8
            assert {e.response.status_code for e in refused} == {503}
            assert b"auth.max_pending" in refused[0].response.body
            for i in range(5):
                async with Client.connect(app.url, TOKEN) as c:
                    assert (await c.call("sessions.create", {"title": f"in {i}"}))["sessionKey"]
        finally:
            await asyncio.gather(*(ws.close() for ws in opened), return_exceptions=True)


async def test_authenticating_gives_the_place_back(config_factory: Callable[..., Config]) -> None:
    """A pending connection that authenticates with an auth frame leaves the pool, and one that
    closes does too, so a new unauthenticated connection may take either place."""
    cfg = config_factory(auth={"max_pending": 2, "max_pending_per_address": 2})
    async with running(cfg) as app:
        opened, refused = await _hold_unauthenticated(app.url, 3)
        try:
            assert len(opened) == 2 and len(refused) == 1
            assert b"auth.max_pending" in refused[0].response.body
            await opened[0].send(orjson.dumps({"type": "auth", "token": TOKEN}).decode())
            assert orjson.loads(await opened[0].recv())["ok"] is True
            third, _ = await _hold_unauthenticated(app.url, 1)
            assert len(third) == 1
            opened += third
            with pytest.raises(InvalidStatus):
                await connect(app.url, ping_interval=None)
            await opened[1].close()
            for _ in range(100):  # the server sees the close a moment after the client
                with contextlib.suppress(InvalidStatus):
                    opened.append(await connect(app.url, ping_interval=None))
                    break
                await asyncio.sleep(0.02)
            else:
                raise AssertionError("the closed connection's place was never given back")
            assert app.server.pending.count == 2
        finally:
            await asyncio.gather(*(ws.close() for ws in opened), return_exceptions=True)


async def test_one_address_has_its_own_cap(config_factory: Callable[..., Config]) -> None:
    """auth.max_pending_per_address refuses a further unauthenticated upgrade from the same
    address (all of loopback is one) with 503 naming the setting, below auth.max_pending."""
    cfg = config_factory(auth={"max_pending": 50, "max_pending_per_address": 3})
    async with running(cfg) as app:
        opened, refused = await _hold_unauthenticated(app.url, 6)
        try:
            assert len(opened) == 3 and len(refused) == 3
            assert all(b"auth.max_pending_per_address" in e.response.body for e in refused)
            assert refused[0].response.headers["Retry-After"]
        finally:
            await asyncio.gather(*(ws.close() for ws in opened), return_exceptions=True)
