"""recalld's memory for other agents: an MCP server over the running daemon (docs/mcp.md).

Two transports, one tool set (``tools.py``): ``recalld mcp`` on stdio (``stdio.py``) and
streamable HTTP at ``/mcp`` on ``[mcp] port`` (``http.py``, started by the daemon). Every tool
calls the daemon over its WebSocket with the caller's token (``link.py``), so auth, scoping,
quotas and the reply budget are the daemon's and nothing here opens a database.

The ``mcp`` SDK is an optional extra: this module imports none of it, so a missing SDK is
reported by :func:`require_sdk` as :class:`SdkMissing` instead of an ImportError.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

from gateway.config import Config
from gateway.mcp.link import (
    DaemonLink,
    DaemonRefused,
    DaemonUnreachable,
    McpError,
    Route,
    SdkMissing,
)

if TYPE_CHECKING:
    from gateway.mcp.http import McpHttpServer, TokenCheck
    from gateway.transport.guard import SocketBudget

__all__ = ["DaemonLink", "DaemonRefused", "DaemonUnreachable", "McpError", "Route", "SdkMissing",
           "require_sdk", "start_http"]


def require_sdk() -> None:
    """Raise :class:`SdkMissing` unless the ``mcp`` package (``recalld[mcp]``) is installed."""
    try:
        found = importlib.util.find_spec("mcp.server.mcpserver")  # 2.x: 1.x has no MCPServer
    except ModuleNotFoundError:
        found = None
    if found is None:
        raise SdkMissing


async def start_http(config: Config, tokens: TokenCheck, *, daemon_url: str, version: str,
                     sockets: SocketBudget) -> McpHttpServer:
    """The started ``/mcp`` listener of ``config`` (the daemon's, with its token check, its own
    URL and its socket budget); :class:`SdkMissing` (an OSError: the start fails with its
    message) without the SDK."""
    require_sdk()
    from gateway.mcp.http import McpHttpServer

    server = McpHttpServer(config, tokens, daemon_url=daemon_url, version=version, sockets=sockets)
    await server.start()
    return server
