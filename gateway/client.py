"""A small asyncio client for the gateway, used by the CLI, the tests and the benchmarks.

``async with Client.connect(url, token) as c: await c.call("gateway.health")``. Replies are
matched to calls by id; server notifications (``chat.*`` events) land in ``c.events``.
"""

from __future__ import annotations

import asyncio
import itertools
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import orjson
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

__all__ = ["Client", "RpcError"]


class RpcError(Exception):
    def __init__(self, error: dict[str, Any]) -> None:
        super().__init__(f"{error.get('code')}: {error.get('message')}")
        self.code: int = error.get("code", 0)
        self.message: str = error.get("message", "")
        self.data: Any = error.get("data")


class Client:
    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self._ids = itertools.count(1)
        self._pending: dict[Any, asyncio.Future[Any]] = {}
        self.events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._reader = asyncio.create_task(self._read())

    @classmethod
    @asynccontextmanager
    async def connect(
        cls,
        url: str,
        token: str | None = None,
        *,
        ssl_context: ssl.SSLContext | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[Client]:
        headers = {"Authorization": f"Bearer {token}"} if token else None
        if ssl_context is not None:
            # Only when given: websockets refuses an explicit ssl=None for a wss:// URL, and
            # without the argument it uses the system CA store.
            kwargs["ssl"] = ssl_context
        async with connect(
            url,
            additional_headers=headers,
            compression=None,
            max_size=None,
            open_timeout=10,
            **kwargs,
        ) as ws:
            client = cls(ws)
            try:
                yield client
            finally:
                client._reader.cancel()
                await asyncio.gather(client._reader, return_exceptions=True)

    async def _read(self) -> None:
        try:
            async for raw in self.ws:
                msg = orjson.loads(raw)
                items = msg if isinstance(msg, list) else [msg]
                for item in items:
                    if isinstance(item, dict) and "id" in item and item["id"] in self._pending:
                        self._pending.pop(item["id"]).set_result(item)
                    else:
                        await self.events.put(item)
        except ConnectionClosed:
            pass
        finally:
            for fut in self._pending.values():
                if not fut.done():
                    fut.set_exception(ConnectionError("connection closed"))

    async def request(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """Send a request and return the whole reply object (result or error)."""
        req_id = next(self._ids)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[req_id] = fut
        frame: dict[str, Any] = {"jsonrpc": "2.0", "id": req_id, "method": method}
        if params is not None:
            frame["params"] = params
        await self.ws.send(orjson.dumps(frame), text=True)
        return await fut  # type: ignore[no-any-return]

    async def call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        """Send a request and return its result, raising :class:`RpcError` on an error reply."""
        reply = await self.request(method, params)
        if "error" in reply:
            raise RpcError(reply["error"])
        return reply["result"]

    async def next_event(self, method: str | None = None, timeout: float = 10.0) -> dict[str, Any]:
        """The next notification (optionally of one method), skipping others."""
        async with asyncio.timeout(timeout):
            while True:
                event = await self.events.get()
                if method is None or event.get("method") == method:
                    return event
