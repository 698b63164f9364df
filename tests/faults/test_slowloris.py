"""Items H1 and M1 of issue 33: requests whose headers never end, on the gateway's port and on
/mcp, are closed, count in one descriptor budget fitted to the open-file limit, and make room
for fresh connections; a stateless /mcp holds no SSE stream open."""

from __future__ import annotations

import asyncio
import contextlib
import resource
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from gateway.client import Client
from gateway.config import Config
from tests.conftest import TOKEN, running
from tests.faults.helpers import FaultDaemon, daemon_env, free_port

# With reserved_fds 128 the gateway's budget is 200 - 128 - 32 = 40 connections, 72 sockets.
NOFILE = 200
RESERVED = "128"


def _head(path: str, port: int, method: str = "GET", token: str | None = None) -> bytes:
    """A request's headers without the blank line that ends them."""
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    return f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{auth}".encode()


async def _squat(port: int, head: bytes, held: Counter[str]) -> None:
    """Send ``head`` and never finish it; once the daemon closes the socket, open another."""
    while True:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            held["refused"] += 1
            await asyncio.sleep(0.2)
            continue
        held["opened"] += 1
        try:
            writer.write(head)
            await reader.read()  # b"" once the daemon closes it
        except OSError:
            pass
        finally:
            writer.close()  # cancelled too: a writer left open warns when collected
        held["closed"] += 1
        await asyncio.sleep(0.2)


@contextlib.asynccontextmanager
async def _squatters(n: int, port: int, head: bytes) -> AsyncIterator[Counter[str]]:
    held = Counter[str]()
    tasks = [asyncio.create_task(_squat(port, head, held)) for _ in range(n)]
    try:
        async with asyncio.timeout(60):
            while held["opened"] + held["refused"] < n:  # every squatter has tried once
                await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)
        yield held
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _fresh_connections(url: str, n: int) -> Counter[str]:
    outcomes = Counter[str]()
    for _ in range(n):
        try:
            async with asyncio.timeout(30), Client.connect(url, TOKEN) as c:
                await c.call("gateway.health")
                outcomes["ok"] += 1
        except Exception as exc:
            outcomes[type(exc).__name__] += 1
    return outcomes


async def _closed_by_server(port: int, head: bytes, before: bytes = b"") -> bool:
    """Whether the daemon closes a connection that sends ``before`` (whole requests, answered)
    and then only ``head``, within a generous 30 s."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        if before:
            writer.write(before)
            answer = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
            length = next(int(line.split(b":")[1]) for line in answer.lower().split(b"\r\n")
                          if line.startswith(b"content-length:"))
            await asyncio.wait_for(reader.readexactly(length), 30)
        writer.write(head)
        async with asyncio.timeout(30):
            while await reader.read(65536):
                pass
        return True
    except TimeoutError:
        return False
    except OSError:
        return True  # reset
    finally:
        writer.close()


async def test_half_sent_mcp_requests_leave_the_gateway_its_descriptors(tmp_path: Path) -> None:
    """Under a 200 open-file limit, 200 unauthenticated POST /mcp requests whose headers never
    end (each reopened once closed) never make the daemon run out of descriptors: a connected
    client keeps creating sessions and fresh gateway connections get in."""
    mcp_port = free_port()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, hard))
    try:
        d = await FaultDaemon.start(tmp_path / "data", env=daemon_env(
            RECALLD_SERVER_RESERVED_FDS=RESERVED, RECALLD_MCP_PORT=str(mcp_port)))
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    try:
        async with asyncio.timeout(30):
            while not d.events("mcp.listening"):
                await asyncio.sleep(0.05)
        async with Client.connect(d.url, TOKEN) as good:
            async with _squatters(200, mcp_port, _head("/mcp", mcp_port, "POST")) as held:
                creates = Counter("ok" if "result" in r else r["error"]["message"][:60]
                                  for r in [await good.request("sessions.create")
                                            for _ in range(5)])
                fresh = await _fresh_connections(d.url, 10)
            print(f"squatters {dict(held)}; creates {dict(creates)}; "
                  f"fresh gateway connections {dict(fresh)}")
            assert creates == {"ok": 5}, creates
            assert fresh["ok"] >= 9, fresh
            assert (await good.call("gateway.health"))["status"] == "ok"
    finally:
        await d.akill()


async def test_half_sent_requests_on_the_gateway_port_leave_room_for_the_owner(
        config_factory: Callable[..., Config]) -> None:
    """150 requests for the page whose headers never end (each reopened once closed) against a
    budget of 72 sockets: the owner's fresh connections still get in, each taking the place of
    the oldest socket still sending headers."""
    async with running(config_factory(server={"max_connections": 40})) as app:
        port = app.server.port
        async with _squatters(150, port, _head("/", port)) as held:
            fresh = await _fresh_connections(app.url, 10)
        print(f"squatters {dict(held)}; fresh connections {dict(fresh)}; "
              f"budget {app.server.sockets.max_sockets}")
        assert fresh["ok"] >= 9, fresh


async def test_a_request_whose_headers_never_end_is_closed(
    config_factory: Callable[..., Config]
) -> None:
    """server.header_timeout_s closes a socket whose request headers are not complete, on the
    gateway's port and on /mcp, also when a kept-alive /mcp connection starts a second request."""
    mcp_port = free_port()
    async with running(config_factory(server={"header_timeout_s": 0.5},
                                      mcp={"port": mcp_port})) as app:
        port = app.server.port
        assert await _closed_by_server(port, _head("/healthz", port))
        assert await _closed_by_server(mcp_port, _head("/mcp", mcp_port, "POST"))
        whole = _head("/elsewhere", mcp_port) + b"\r\n"  # 404, and the connection stays open
        assert await _closed_by_server(mcp_port, _head("/mcp", mcp_port, "POST"), before=whole)
        assert app.server.sockets.timed_out >= 3


async def test_get_mcp_holds_no_stream_open(config_factory: Callable[..., Config]) -> None:
    """GET /mcp with a right token answers 405 (Allow: POST) at once: a stateless server has no
    server-initiated messages to stream, so no socket is held for one."""
    mcp_port = free_port()
    async with running(config_factory(mcp={"port": mcp_port})):
        reader, writer = await asyncio.open_connection("127.0.0.1", mcp_port)
        try:
            writer.write(_head("/mcp", mcp_port, token=TOKEN)
                         + b"Accept: text/event-stream\r\n\r\n")
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
        finally:
            writer.close()
        assert head.startswith(b"HTTP/1.1 405"), head
        assert b"allow: post" in head.lower(), head
