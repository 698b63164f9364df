"""/mcp's bounds on what one user's bodies cost: the SDK parses each body on the event loop,
outside the gateway's per-user thread rationing, so size, requests in flight and bytes a minute
are bounded per user in front of it (issue M2)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import httpx2
import orjson
import pytest

from gateway.app import App
from gateway.config import Config
from tests.conftest import running
from tests.faults.helpers import free_port
from tests.mcp.conftest import BOB_TOKEN, TOKEN

ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def _body(size: int) -> bytes:
    """An ``initialize`` call padded to ``size`` bytes with an ignored field."""
    call = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                       "clientInfo": {"name": "test", "version": "0"}, "pad": ""}}
    pad = size - len(orjson.dumps(call))
    call["params"]["pad"] = "x" * pad  # type: ignore[index]
    return orjson.dumps(call)


@pytest.fixture
async def bounded(config_factory: Callable[..., Config]) -> AsyncIterator[App]:
    """alice and bob on /mcp with 8 KiB bodies, 8 KiB a minute each, one request at a time."""
    cfg = config_factory(
        auth={"token": None,
              "users": [{"name": "alice", "token": TOKEN}, {"name": "bob", "token": BOB_TOKEN}]},
        mcp={"port": free_port(), "max_request_bytes": 8192, "request_bytes_per_minute": 8192,
             "max_requests_per_user": 1},
    )
    async with running(cfg) as app:
        yield app


async def _post(http: httpx2.AsyncClient, app: App, token: str, body: bytes) -> httpx2.Response:
    assert app.mcp is not None
    return await http.post(app.mcp.url, content=body,
                           headers={**ACCEPT, "Authorization": f"Bearer {token}"}, timeout=60)


async def test_a_body_over_the_bound_is_413(bounded: App) -> None:
    """A body larger than mcp.max_request_bytes answers 413; one within it is served."""
    async with httpx2.AsyncClient() as http:
        assert (await _post(http, bounded, TOKEN, _body(8000))).status_code == 200
        assert (await _post(http, bounded, TOKEN, _body(9000))).status_code == 413


async def test_bytes_over_a_users_rate_wait_then_429_and_others_are_served(bounded: App) -> None:
    """A body past its user's mcp.request_bytes_per_minute is refused 429 with Retry-After when
    room for it is more than PACE_LIMIT_S away, while another user's request is served."""
    async with httpx2.AsyncClient() as http:
        # bob's bucket holds 8 KiB, refilled at ~137 B/s: after 7,000 bytes, 7,000 more
        # are ~42 s away.
        assert (await _post(http, bounded, BOB_TOKEN, _body(7000))).status_code == 200
        refused = await _post(http, bounded, BOB_TOKEN, _body(7000))
        assert refused.status_code == 429
        assert "mcp.request_bytes_per_minute" in refused.text
        assert int(refused.headers["retry-after"]) >= 1
        assert (await _post(http, bounded, TOKEN, _body(7000))).status_code == 200


async def test_bytes_over_a_users_rate_soon_to_fit_are_paced_not_refused(bounded: App) -> None:
    """A body that will fit in its user's rate within PACE_LIMIT_S waits for it and is served
    (a refused client would retry at once, and a flood of cheap refusals costs the loop too)."""
    async with httpx2.AsyncClient() as http:
        assert (await _post(http, bounded, BOB_TOKEN, _body(4500))).status_code == 200
        # 3,692 bytes left: 4,500 more fit after ~6 s of refill.
        assert (await _post(http, bounded, BOB_TOKEN, _body(4500))).status_code == 200


async def test_a_users_requests_beyond_the_limit_wait_their_turn(bounded: App) -> None:
    """With mcp.max_requests_per_user = 1, a user's requests sent at once are all served, one
    at a time (none refused), and the per-user places are given back when they end."""
    assert bounded.mcp is not None
    async with httpx2.AsyncClient() as http:
        answers = await asyncio.gather(*(_post(http, bounded, TOKEN, _body(1000))
                                         for _ in range(6)))
    assert [a.status_code for a in answers] == [200] * 6
    assert len(bounded.mcp._places) == 0
