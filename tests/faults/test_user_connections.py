"""Item H2 of issue 33: one user's authenticated connections are capped
(server.max_connections_per_user), however they authenticate, so another user still gets in."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Callable

import orjson
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from gateway.client import Client
from gateway.config import Config
from tests.conftest import running

ALICE = "alice-token-0123456789abcdef-0123456789"
BOB = "bob-token-0123456789abcdef-0123456789xx"
USERS = {"token": None, "users": [{"name": "alice", "token": ALICE}, {"name": "bob", "token": BOB}]}


async def test_one_user_holding_connections_leaves_room_for_another(
    config_factory: Callable[..., Config]
) -> None:
    """Bob opening 40 authenticated connections at once against max_connections 20 gets
    max_connections_per_user (8) of them, the rest HTTP 503 naming the setting; alice's fresh
    connections all get in meanwhile, and bob gets one again once he closes one."""
    cfg = config_factory(auth=USERS, server={"max_connections": 20, "max_connections_per_user": 8})
    async with running(cfg) as app:
        held: list[ClientConnection] = []
        refusals = Counter[str]()

        async def bob() -> None:
            try:
                held.append(await connect(app.url,
                                          additional_headers={"Authorization": f"Bearer {BOB}"}))
            except InvalidStatus as exc:
                refusals[f"{exc.response.status_code} {exc.response.body.decode().strip()}"] += 1

        try:
            # 40: all fit the socket budget (52) while their handshakes run.
            await asyncio.gather(*(bob() for _ in range(40)))
            assert len(held) == 8, refusals
            assert refusals == {"503 too many connections for this user "
                                "(server.max_connections_per_user 8)": 32}
            ok = 0
            for _ in range(10):
                async with Client.connect(app.url, ALICE) as alice:
                    ok += (await alice.call("gateway.health"))["status"] == "ok"
            assert ok == 10
            await held.pop().close()
            async with asyncio.timeout(30):
                while True:  # the closed one's place is given back when its socket closes
                    with contextlib.suppress(InvalidStatus):
                        held.append(await connect(
                            app.url, additional_headers={"Authorization": f"Bearer {BOB}"}))
                        break
                    await asyncio.sleep(0.05)
        finally:
            await asyncio.gather(*(ws.close() for ws in held), return_exceptions=True)


async def test_authenticating_later_counts_against_the_cap_too(
    config_factory: Callable[..., Config]
) -> None:
    """Past the cap, the auth method answers -32004 naming the setting (the connection stays
    unauthenticated) and an auth frame is refused and closed 1008; alice is not affected."""
    cfg = config_factory(auth=USERS, server={"max_connections_per_user": 2})
    async with running(cfg) as app, Client.connect(app.url, BOB), Client.connect(app.url, BOB):
        async with connect(app.url) as ws:
            await ws.send(orjson.dumps({"id": 1, "method": "auth",
                                        "params": {"token": BOB}}).decode())
            reply = orjson.loads(await ws.recv())
            assert reply["error"]["code"] == -32004, reply
            assert "server.max_connections_per_user 2" in reply["error"]["message"]
            await ws.send(orjson.dumps({"id": 2, "method": "auth",
                                        "params": {"token": ALICE}}).decode())
            assert orjson.loads(await ws.recv())["result"]["user"] == "alice"
        async with connect(app.url) as ws:
            await ws.send(orjson.dumps({"type": "auth", "token": BOB}).decode())
            answer = orjson.loads(await ws.recv())
            assert answer["ok"] is False and "max_connections_per_user" in answer["error"], answer
            with pytest.raises(ConnectionClosed) as info:
                await ws.recv()
            assert info.value.rcvd is not None and info.value.rcvd.code == 1008
            assert info.value.rcvd.reason == "too many connections for this user"
