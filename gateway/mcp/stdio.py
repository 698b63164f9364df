"""``recalld mcp``: the tool set on stdin/stdout, for clients that spawn a command."""

from __future__ import annotations

from gateway.mcp.link import DaemonLink
from gateway.mcp.tools import build_server

__all__ = ["serve_stdio"]


async def serve_stdio(link: DaemonLink, *, version: str) -> None:
    """Serve until the client closes stdin. stdout carries only the protocol: logs go to stderr."""
    await build_server(link, version=version).run_stdio_async()
