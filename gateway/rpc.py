"""The JSON-RPC 2.0 core: bytes in, bytes (or nothing) out. No sockets, no ``websockets``.

:meth:`RpcCore.handle` takes one frame's payload and a caller context, and returns the encoded
reply, or ``None`` when nothing is owed (a notification, or a batch of only notifications).
It never raises for bad input: every failure becomes a well-formed error response. Unexpected
exceptions become -32603 with an ``errorId`` that the ``on_crash`` hook logs with the
traceback.

``"jsonrpc"`` may be left out on input (people type frames into wscat); replies always carry it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from gateway.errors import (
    GatewayError,
    InvalidRequest,
    MethodNotFound,
    ParseError,
    Unauthorized,
    new_error_id,
    to_error_object,
)
from gateway.registry import Registry, parse_params

__all__ = ["CallContext", "RpcCore", "encode", "error_response"]

_NO_ID = object()


class CallContext(Protocol):
    """What a handler may know about its caller; the server's connection satisfies it."""

    @property
    def user(self) -> str | None: ...

    @property
    def authenticated(self) -> bool: ...


def encode(obj: Any) -> bytes:
    return orjson.dumps(obj)


def error_response(req_id: Any, error: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": req_id, "error": error}


@dataclass(slots=True)
class RpcCore:
    registry: Registry
    max_batch: int = 50
    # Called with (exception, error_id, method) for every unexpected exception.
    on_crash: Callable[[BaseException, str, str], None] = field(default=lambda e, i, m: None)

    async def handle(self, payload: str | bytes, ctx: Any) -> bytes | None:
        """Answer one frame: a single request, a notification, or a batch."""
        try:
            message = self.decode(payload)
        except ParseError as exc:
            return encode(error_response(None, exc.to_object()))
        return await self.answer(message, ctx)

    @staticmethod
    def decode(payload: str | bytes) -> Any:
        """The frame's JSON value; :class:`ParseError` if it is not JSON."""
        try:
            return orjson.loads(payload)
        except orjson.JSONDecodeError as exc:
            raise ParseError(f"parse error: {exc}") from None

    def runs_inline(self, message: Any) -> bool:
        """Whether ``message`` is one call of a method that never waits on I/O.

        Such calls finish without suspending, so the server answers them in its read loop
        instead of paying for a task each.
        """
        return isinstance(message, dict) and self.registry.is_inline(message.get("method"))

    async def answer(self, message: Any, ctx: Any) -> bytes | None:
        """Encoded reply to an already-decoded frame, or None when nothing is owed."""
        reply = await self.handle_message(message, ctx)
        if reply is None:
            return None
        try:
            return encode(reply)
        except TypeError as exc:  # a handler returned something orjson cannot encode
            error_id = new_error_id()
            self.on_crash(exc, error_id, "<encode>")
            return encode(error_response(None, to_error_object(exc, error_id)))

    async def handle_message(self, message: Any, ctx: Any) -> Any:
        """Like :meth:`handle` for an already-decoded JSON value; returns a JSON value."""
        if isinstance(message, list):
            if not message:
                return error_response(None, InvalidRequest("invalid request: empty batch").to_object())
            if len(message) > self.max_batch:
                err = InvalidRequest(
                    f"invalid request: batch of {len(message)} exceeds the limit of {self.max_batch}"
                )
                return error_response(None, err.to_object())
            replies = await asyncio.gather(*(self._one(m, ctx) for m in message))
            answered = [r for r in replies if r is not None]
            return answered or None
        return await self._one(message, ctx)

    async def _one(self, message: Any, ctx: Any) -> dict[str, Any] | None:
        if not isinstance(message, dict):
            return error_response(None, InvalidRequest("invalid request: expected an object").to_object())
        req_id = message.get("id", _NO_ID)
        is_notification = req_id is _NO_ID
        reply_id = None if is_notification else req_id
        try:
            method = self._validate(message, req_id)
            result = await self._dispatch(method, message.get("params"), ctx)
        except asyncio.CancelledError:
            raise
        except GatewayError as exc:
            if is_notification and not isinstance(exc, InvalidRequest):
                return None
            return error_response(reply_id if _valid_id(req_id) else None, exc.to_object())
        except Exception as exc:
            error_id = new_error_id()
            error = to_error_object(exc, error_id)
            if error["code"] == -32603:
                self.on_crash(exc, error_id, str(message.get("method")))
            return None if is_notification else error_response(reply_id, error)
        if is_notification:
            return None
        return {"jsonrpc": "2.0", "id": req_id, "result": result}

    def _validate(self, message: dict[str, Any], req_id: Any) -> str:
        if "jsonrpc" in message and message["jsonrpc"] != "2.0":
            raise InvalidRequest('invalid request: "jsonrpc" must be "2.0"')
        if req_id is not _NO_ID and not _valid_id(req_id):
            raise InvalidRequest('invalid request: "id" must be a string, a number or null')
        method = message.get("method")
        if not isinstance(method, str) or not method:
            raise InvalidRequest('invalid request: "method" must be a non-empty string')
        params = message.get("params")
        if params is not None and not isinstance(params, dict | list):
            raise InvalidRequest('invalid request: "params" must be an object')
        extra = set(message) - {"jsonrpc", "id", "method", "params"}
        if extra:
            raise InvalidRequest(f"invalid request: unexpected members {sorted(extra)}")
        return method

    async def _dispatch(self, name: str, raw_params: Any, ctx: Any) -> Any:
        method = self.registry.get(name)
        if method.requires_auth and not ctx.authenticated:
            raise Unauthorized("unauthorized: authenticate first with the auth method or an auth frame")
        if method.handler is None:
            raise MethodNotFound(f"method not implemented yet: {name}")
        params = parse_params(method.params, raw_params)
        return await method.handler(ctx, params)


def _valid_id(value: Any) -> bool:
    return value is None or isinstance(value, str) or (
        isinstance(value, int | float) and not isinstance(value, bool)
    )
