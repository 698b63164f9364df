"""A daemon with two users, a fake model and the /mcp listener on, and the SDK's own clients."""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult

from gateway.app import App
from gateway.client import Client
from gateway.config import Config
from tests.conftest import TOKEN, running
from tests.fake_openai import FakeOpenAI
from tests.faults.helpers import free_port
from tests.gateway.test_memory_methods import say, search_until

__all__ = ["BOB_TOKEN", "TOKEN", "http_session", "said", "stdio_session", "tool"]

BOB_TOKEN = "bob-token-0123456789abcdef-0123456789"


@pytest.fixture
async def mcp_app(config_factory: Callable[..., Config],
                  fake_openai: FakeOpenAI) -> AsyncIterator[App]:
    """Users alice (TOKEN) and bob (BOB_TOKEN), the fake model, /mcp on a free port."""
    cfg = config_factory(
        auth={"token": None,
              "users": [{"name": "alice", "token": TOKEN}, {"name": "bob", "token": BOB_TOKEN}]},
        llm={"base_url": fake_openai.base_url, "api_key": "sk-test", "model": "fake-model",
             "max_retries": 0},
        memory={"debounce_ms": 20},
        mcp={"port": free_port()},
    )
    async with running(cfg) as app:
        yield app


async def said(app: App, text: str, token: str = TOKEN, **create: Any) -> str:
    """Say ``text`` in a new session of ``token``'s user (the fake model answers) and wait
    until memory.search finds it; the session's key."""
    async with Client.connect(app.url, token) as c:
        key: str = (await c.call("sessions.create", create))["sessionKey"]
        await say(c, key, text)
        if create.get("memory", True):
            await search_until(c, {"query": text})
    return key


@asynccontextmanager
async def http_session(app: App, token: str | None = TOKEN) -> AsyncIterator[ClientSession]:
    """An initialised MCP client session on the daemon's /mcp, over streamable HTTP."""
    assert app.mcp is not None
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with (httpx2.AsyncClient(headers=headers) as http,
                streamable_http_client(app.mcp.url, http_client=http) as (read, write, *_),
                ClientSession(read, write) as session):
        await session.initialize()
        yield session


@asynccontextmanager
async def stdio_session(data_dir: Path, *args: str) -> AsyncIterator[ClientSession]:
    """An initialised MCP client session on `python -m gateway mcp ARGS`, over stdio."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RECALLD_", "OPENAI_"))}
    params = StdioServerParameters(command=sys.executable,
                                   args=["-m", "gateway", "--data-dir", str(data_dir), "mcp",
                                         *args], env=env)
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


async def tool(session: ClientSession, name: str, **arguments: Any) -> dict[str, Any]:
    """A successful tool call's structured result."""
    result: CallToolResult = await session.call_tool(name, arguments)
    assert not result.is_error, result.content
    structured: dict[str, Any] | None = result.structured_content
    assert structured is not None
    return structured
