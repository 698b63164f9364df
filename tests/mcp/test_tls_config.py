"""`[mcp] port` as a setting, and /mcp with the gateway's [tls]."""

from __future__ import annotations

import ssl
from collections.abc import Callable
from pathlib import Path

import httpx2
import pytest
import trustme
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from gateway.config import Config, ConfigError, load
from tests.conftest import TOKEN, running
from tests.faults.helpers import free_port
from tests.mcp.conftest import tool


def test_mcp_port_comes_from_RECALLD_MCP_PORT_and_must_not_be_the_gateways(tmp_path: Path) -> None:
    """RECALLD_MCP_PORT sets [mcp] port (0 by default, off); the gateway's own port is refused."""
    assert load(None, env={}, data_dir=tmp_path).mcp.port == 0
    assert load(None, env={"RECALLD_MCP_PORT": "18790"}, data_dir=tmp_path).mcp.port == 18790
    with pytest.raises(ConfigError, match=r"\[mcp\] port 18789 is \[server\] port too"):
        load(None, env={"RECALLD_MCP_PORT": "18789"}, data_dir=tmp_path)


async def test_mcp_over_https_with_the_gateways_certificate(config_factory: Callable[..., Config],
                                                            tmp_path: Path) -> None:
    """With [tls] set, /mcp is https with the gateway's certificate (a CA-signed one here), and its
    tools reach the wss:// gateway: the listener trusts the daemon's own certificate."""
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.private_key_and_cert_chain_pem.write_to_path(str(cert_path))
    cert.private_key_pem.write_to_path(str(key_path))
    cfg = config_factory(tls={"cert": str(cert_path), "key": str(key_path)},
                         mcp={"port": free_port()})
    async with running(cfg) as app:
        assert app.mcp is not None and app.mcp.url.startswith("https://")
        trust = ssl.create_default_context()
        ca.configure_trust(trust)
        async with (httpx2.AsyncClient(verify=trust,
                                       headers={"Authorization": f"Bearer {TOKEN}"}) as http,
                    streamable_http_client(app.mcp.url, http_client=http) as (read, write, *_),
                    ClientSession(read, write) as session):
            await session.initialize()
            added = await tool(session, "remember", text="I live in Lisbon")
            assert added["action"] == "added"
