"""Authentication on a live connection: the auth frame is honoured at any time before
authentication, the -32001 reply shows how, and a connection never changes user."""

from __future__ import annotations

from collections.abc import Callable

import orjson
from websockets.asyncio.client import connect

from gateway.app import App
from gateway.client import Client
from gateway.config import Config
from tests.conftest import TOKEN, running
from tests.faults.test_abuse import recv_reply

USERS = [{"name": "alice", "token": "alice-token-0123456789"},
         {"name": "bob", "token": "bob-token-0123456789xx"}]


async def test_auth_frame_after_other_frames_is_honoured(app: App) -> None:
    """Before authentication, a request answers -32001 showing the exact auth frame and the
    time limit; an auth frame sent after it still authenticates the connection."""
    async with connect(app.url) as ws:
        await ws.send('{"id":1,"method":"sessions.list"}')
        error = (await recv_reply(ws))["error"]
        assert error["code"] == -32001
        assert '{"type":"auth","token":"<token>"}' in error["message"]
        assert f"{app.config.auth.timeout_s:g} s" in error["message"]
        await ws.send('{"id":2,"method":"gateway.health"}')
        assert (await recv_reply(ws))["error"]["code"] == -32001
        await ws.send(orjson.dumps({"type": "auth", "token": TOKEN}).decode())
        assert orjson.loads(await ws.recv())["ok"] is True
        await ws.send('{"id":3,"method":"sessions.list"}')
        assert (await recv_reply(ws))["result"] == {"sessions": []}


async def test_reauthenticating_as_another_user_is_refused(
    config_factory: Callable[..., Config]
) -> None:
    """An authenticated connection that calls auth with another user's token gets -32003 and
    stays the first user: it keeps seeing only that user's sessions, and the other user's
    sessions stay invisible to it; the same user's token is accepted again."""
    async with running(config_factory(auth={"users": USERS, "token": None})) as app, \
            Client.connect(app.url, USERS[0]["token"]) as alice, \
            Client.connect(app.url, USERS[1]["token"]) as bob:
        mine = (await alice.call("sessions.create"))["sessionKey"]
        theirs = (await bob.call("sessions.create"))["sessionKey"]
        switch = await alice.request("auth", {"token": USERS[1]["token"]})
        assert switch["error"]["code"] == -32003 and "alice" in switch["error"]["message"], switch
        assert [s["sessionKey"] for s in (await alice.call("sessions.list"))["sessions"]] == [mine]
        assert (await alice.request("sessions.subscribe",
                                    {"sessionKey": theirs}))["error"]["code"] == -32002
        assert (await alice.call("auth", {"token": USERS[0]["token"]}))["user"] == "alice"
