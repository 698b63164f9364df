"""/mcp over streamable HTTP on `[mcp] port`, driven by the MCP SDK's own HTTP client."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from pathlib import Path

import httpx2

from gateway.app import App
from gateway.config import Config
from tests.conftest import running
from tests.daemon import Daemon
from tests.faults.helpers import free_port
from tests.mcp.conftest import BOB_TOKEN, TOKEN, http_session, said, tool

INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
              "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                         "clientInfo": {"name": "test", "version": "0"}}}
ACCEPT = {"Accept": "application/json, text/event-stream"}


async def _post(app: App, headers: dict[str, str]) -> httpx2.Response:
    assert app.mcp is not None
    async with httpx2.AsyncClient() as http:
        return await http.post(app.mcp.url, json=INITIALIZE, headers={**ACCEPT, **headers})


async def test_http_without_a_right_token_answers_401(mcp_app: App) -> None:
    """/mcp with no token, or a wrong one, answers 401 with a Bearer challenge; the
    right one 200."""
    for headers in ({}, {"Authorization": "Bearer not-the-token-0123456789"},
                    {"Authorization": TOKEN}):
        refused = await _post(mcp_app, headers)
        assert refused.status_code == 401, headers
        assert refused.headers["www-authenticate"] == 'Bearer realm="recalld"'
    assert (await _post(mcp_app, {"Authorization": f"Bearer {TOKEN}"})).status_code == 200


async def test_http_keeps_the_gateways_host_and_origin_rules(mcp_app: App) -> None:
    """A foreign DNS name in Host answers 421 (DNS rebinding) and a foreign browser Origin 403,
    before the token is looked at; localhost and an IP literal are fine."""
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    assert (await _post(mcp_app, {**bearer, "Host": "attacker.example"})).status_code == 421
    assert (await _post(mcp_app,
                        {**bearer, "Origin": "https://attacker.example"})).status_code == 403
    assert mcp_app.mcp is not None
    assert (await _post(mcp_app,
                        {**bearer, "Host": f"localhost:{mcp_app.mcp.port}"})).status_code == 200


async def test_http_each_token_sees_only_its_own_users_memory(mcp_app: App) -> None:
    """Two agents at once on one /mcp: alice's token finds what alice said and her facts; bob's
    token lists the same tools but finds none of alice's words, sessions or facts."""
    key = await said(mcp_app, "My favourite programming language is Rust.", title="Languages")
    async with http_session(mcp_app, TOKEN) as alice, http_session(mcp_app, BOB_TOKEN) as bob:
        await tool(alice, "remember", text="I live in Lisbon")
        alice_tools, bob_tools = await asyncio.gather(alice.list_tools(), bob.list_tools())
        assert {t.name for t in alice_tools.tools} == {t.name for t in bob_tools.tools}
        query = {"query": "favourite programming language"}
        mine, theirs = await asyncio.gather(tool(alice, "search_memory", **query),
                                            tool(bob, "search_memory", **query))
        assert [e["session_key"] for e in mine["excerpts"]] == [key]
        assert theirs["excerpts"] == []
        assert (await tool(bob, "recent_sessions"))["sessions"] == []
        assert (await tool(bob, "list_facts"))["facts"] == []
        assert ([f["text"] for f in (await tool(alice, "list_facts"))["facts"]]
                == ["I live in Lisbon"])
        refused = await bob.call_tool("read_session", {"session_key": key})
        assert refused.is_error


async def test_http_remember_then_list_facts(mcp_app: App) -> None:
    """remember over HTTP stores the fact for the token's user, and list_facts returns it."""
    async with http_session(mcp_app) as session:
        added = await tool(session, "remember", text="My daughter Luna is 3 years old")
        listed = await tool(session, "list_facts")
        assert [f["id"] for f in listed["facts"]] == [added["fact"]["id"]]


async def test_the_listener_is_off_unless_a_port_is_set(
        config_factory: Callable[..., Config]) -> None:
    """[mcp] port defaults to 0, which starts no listener."""
    async with running(config_factory()) as app:
        assert app.mcp is None


async def test_recalld_serve_with_RECALLD_MCP_PORT_serves_mcp_and_stops_on_sigint(
        tmp_path: Path) -> None:
    """`recalld serve` with RECALLD_MCP_PORT set listens on /mcp (401 without a token), and
    SIGINT still stops the whole daemon cleanly: the listener leaves the signals to it."""
    port = free_port()
    daemon = Daemon(tmp_path / "data",
                    env={"RECALLD_MCP_PORT": str(port), "RECALLD_LOG_FORMAT": "json"})
    try:
        listening = daemon._wait_for("mcp.listening")
        assert listening["url"] == f"http://127.0.0.1:{port}/mcp"
        async with httpx2.AsyncClient() as http:
            refused = await http.post(listening["url"], json=INITIALIZE, headers=ACCEPT)
        assert refused.status_code == 401
        code, rest = daemon.stop(signal.SIGINT)
        assert code == 0, rest
        assert '"mcp.closed"' in rest and '"app.closed"' in rest
    finally:
        daemon.kill()
