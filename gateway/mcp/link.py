"""How a tool reaches the running daemon: one WebSocket connection per tool call, with a token.

Every tool goes through :class:`DaemonLink`, so what an agent may see and do is decided by the
daemon (its tokens, scoping, quotas and reply budget), never here, and nothing in this package
opens a database. A connection per call costs one loopback handshake and survives a daemon
restart (a new port in ``daemon.json``, a rotated token) with nothing to reconnect.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from websockets.exceptions import InvalidStatus, WebSocketException

from gateway.client import Client, RpcError

__all__ = ["DaemonLink", "DaemonRefused", "DaemonUnreachable", "McpError", "Route", "SdkMissing",
           "call_on"]


class McpError(Exception):
    """Root of this package's errors::

        McpError
         ├─ DaemonUnreachable   no daemon at the URL, the connection dropped, or the token refused
         ├─ DaemonRefused       the daemon answered a JSON-RPC error (code, message, data)
         └─ SdkMissing          the optional `mcp` package is not installed (an OSError:
                                start fails)
    """


class DaemonUnreachable(McpError):
    pass


class DaemonRefused(McpError):
    def __init__(self, error: RpcError) -> None:
        super().__init__(_describe(error))
        self.code = error.code
        self.data: Any = error.data


class SdkMissing(McpError, OSError):
    def __init__(self) -> None:
        super().__init__("the MCP server needs the `mcp` package, 2.x: pip install 'recalld[mcp]'")


@dataclass(frozen=True, slots=True)
class Route:
    """Where one call goes: the daemon's URL, the token to present, the TLS trust for wss://."""

    url: str
    token: str | None
    ssl: ssl.SSLContext | None = None


class DaemonLink:
    """Opens a connection to the daemon along the route ``resolve`` gives at the time of the call
    (``recalld mcp`` re-reads its target; the HTTP listener reads the request's token)."""

    def __init__(self, resolve: Callable[[], Route]) -> None:
        self._resolve = resolve

    @asynccontextmanager
    async def open(self) -> AsyncIterator[Client]:
        route = self._resolve()
        try:
            async with Client.connect(route.url, route.token, ssl_context=route.ssl) as client:
                yield client
        except InvalidStatus as exc:
            status = exc.response.status_code
            if status == 401:
                raise DaemonUnreachable(f"recalld at {route.url} refused the token (401): check "
                                        "--token-file / RECALLD_TOKEN") from None
            raise DaemonUnreachable(f"recalld at {route.url} answered HTTP {status}") from None
        except (OSError, TimeoutError, WebSocketException) as exc:
            raise DaemonUnreachable(f"cannot reach recalld at {route.url} ({exc}); is `recalld "
                                    "serve` running?") from None

    async def call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        """One request on its own connection; the daemon's error reply raises
        :class:`DaemonRefused`."""
        async with self.open() as client:
            return await _call(client, method, params)


async def _call(client: Client, method: str, params: dict[str, Any] | None) -> Any:
    try:
        return await client.call(method, params)
    except RpcError as exc:
        raise DaemonRefused(exc) from None
    except ConnectionError as exc:
        raise DaemonUnreachable(f"the connection to recalld closed: {exc}") from None


async def call_on(client: Client, method: str, params: dict[str, Any] | None = None) -> Any:
    """A request on a connection :meth:`DaemonLink.open` gave, with the same error mapping."""
    return await _call(client, method, params)


def _describe(error: RpcError) -> str:
    # Worded for the model reading a failed tool result: what happened and what to do.
    data = error.data if isinstance(error.data, dict) else {}
    if error.code == -32004:
        wait = data.get("retryAfterMs")
        return f"recalld is busy or a quota was reached: {error.message}" + (
            f"; retry in {wait} ms" if wait is not None else "")
    if error.code == -32002:
        return f"not found: {error.message}"
    if error.code == -32602:
        field = data.get("field")
        return (f"invalid argument{f' {field}' if field else ''}: "
                f"{data.get('reason') or error.message}")
    return f"recalld error {error.code}: {error.message}"
