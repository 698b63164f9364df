"""The JSON-RPC 2.0 core: bytes in, bytes (or nothing) out. No sockets, no ``websockets``.

One entry per frame: :meth:`RpcCore.accept` decodes it into a :class:`Call`, which says
whether it may run inline (a single call of a method that never waits on I/O) and whose
:meth:`Call.run` returns the :class:`Reply` — the encoded bytes and whether it is an error —
or ``None`` when nothing is owed (a notification, or a batch of only notifications). Nothing
here raises for bad input: every failure becomes a well-formed error response. Exceptions
that :func:`~gateway.errors.wire_error` does not know are bugs: -32603 with an ``errorId``
that the ``on_crash`` hook logs with the traceback.

``"jsonrpc"`` may be left out on input (people type frames into wscat); replies always carry it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from gateway.errors import (
    GatewayError,
    InternalError,
    InvalidRequest,
    MethodNotFound,
    ParseError,
    Unauthorized,
    new_error_id,
    wire_error,
)
from gateway.rpc.batch import ReplyBudget, run_batch
from gateway.rpc.quota import Quotas
from gateway.rpc.registry import Handler, Method, Registry, parse_params
from gateway.wire import ErrorObject

__all__ = ["Call", "CallContext", "Notification", "Reply", "RpcCore", "error_response"]

_NO_ID = object()
_MEMBERS = frozenset({"jsonrpc", "id", "method", "params"})


class Notification:
    """A server → client notification, encoded at most once however many callers get it."""

    __slots__ = ("_frame", "method", "params")

    def __init__(self, method: str, params: Mapping[str, Any]) -> None:
        self.method = method
        self.params = params
        self._frame: bytes | None = None

    def encode(self) -> bytes:
        if self._frame is None:
            self._frame = orjson.dumps({"jsonrpc": "2.0", "method": self.method, "params": self.params})
        return self._frame


class CallContext(Protocol):
    """What a handler may know about its caller and do to it; the transport's connection
    satisfies it."""

    @property
    def user(self) -> str | None: ...

    @property
    def authenticated(self) -> bool: ...

    @property
    def caller(self) -> str:
        """The authenticated user; the core refuses unauthenticated calls to every method
        that requires auth before a handler runs."""
        ...

    @property
    def address(self) -> str:
        """The client's IP address (the auth failure limiter counts per address)."""
        ...

    def authenticate(self, user: str) -> None: ...

    def notify(self, note: Notification) -> None:
        """Queue a notification for this caller behind its pending events."""
        ...


@dataclass(frozen=True, slots=True)
class Reply:
    data: bytes
    # True when the reply, or any entry of a batch reply, is an error (for the connection's
    # error counter; nobody has to search the bytes).
    is_error: bool


def error_response(req_id: Any, error: ErrorObject) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": req_id, "error": error}


@dataclass(slots=True)
class RpcCore:
    registry: Registry
    max_batch: int = 50
    # Called with (exception, error_id, method) for every unexpected exception.
    on_crash: Callable[[BaseException, str, str], None] = field(default=lambda e, i, m: None)
    # Named in the -32001 reply, so a client learns how long it has to authenticate.
    auth_timeout_s: float = 10.0
    # Per-user rate and concurrency limits by method ([quotas]); None: none.
    quotas: Quotas | None = None
    # Reply bytes a batch entry is assumed to build while it runs (the history page cap): a
    # batch starts an entry only while its budget has room for it (gateway.rpc.batch).
    batch_reserve: int = 0

    def accept(self, payload: str | bytes, ctx: CallContext) -> Call:
        """Decode one frame; the returned call runs it."""
        try:
            message = orjson.loads(payload)
        except orjson.JSONDecodeError as exc:
            return Call(self, ctx, None, error=ParseError(f"parse error: {exc}"))
        return Call(self, ctx, message)

    async def handle(self, payload: str | bytes, ctx: CallContext) -> Reply | None:
        """Answer one frame at once: ``accept`` then ``run``."""
        return await self.accept(payload, ctx).run()

    def refuse(self, message: Any, error: GatewayError) -> Reply:
        """The reply refusing a frame before it runs (binary frame, too many in flight)."""
        req_id = message.get("id") if isinstance(message, dict) else None
        return Reply(orjson.dumps(error_response(req_id, error.to_object())), True)

    async def _frame(self, message: Any, ctx: CallContext, budget: ReplyBudget | None) -> Reply | None:
        """The reply to a decoded frame that is not a single call (None when nothing is owed)."""
        if isinstance(message, list):
            if not message:
                return self._encoded(error_response(None, InvalidRequest("invalid request: empty batch").to_object()))
            if len(message) > self.max_batch:
                err = InvalidRequest(
                    f"invalid request: batch of {len(message)} exceeds the limit of {self.max_batch}"
                )
                return self._encoded(error_response(None, err.to_object()))
            data, is_error = await run_batch(message, lambda m: self._one(m, ctx), self._encode,
                                             budget, self.batch_reserve)
            return None if data is None else Reply(data, is_error)
        reply = await self._one(message, ctx)
        return None if reply is None else self._encoded(reply)

    def _encode(self, reply: dict[str, Any]) -> tuple[bytes, bool]:
        """The reply's bytes and whether it is an error."""
        try:
            return orjson.dumps(reply), "error" in reply
        except TypeError as exc:
            return self._unencodable(exc, reply), True

    def _encoded(self, reply: dict[str, Any]) -> Reply:
        try:  # _encode without the tuple: this runs once per frame
            return Reply(orjson.dumps(reply), "error" in reply)
        except TypeError as exc:
            return Reply(self._unencodable(exc, reply), True)

    def _unencodable(self, exc: TypeError, reply: dict[str, Any]) -> bytes:
        """The -32603 that replaces a reply holding something orjson cannot encode (a
        handler's bug)."""
        error_id = new_error_id()
        self.on_crash(exc, error_id, "<encode>")
        return orjson.dumps(error_response(reply.get("id"), InternalError(error_id).to_object()))

    async def _one(self, message: Any, ctx: CallContext) -> dict[str, Any] | None:
        """A batch entry's reply, not yet encoded (the batch encodes it within its budget)."""
        if not isinstance(message, dict):
            return error_response(None, InvalidRequest("invalid request: expected an object").to_object())
        req_id = message.get("id", _NO_ID)
        try:
            self._validate(message, req_id)
            result = await self._invoke(self.registry.find(message["method"]), message, ctx)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            return self._failure(exc, message, req_id)
        if req_id is _NO_ID:
            return None
        return {"jsonrpc": "2.0", "id": req_id, "result": result}

    async def _single(self, message: dict[str, Any], ctx: CallContext, method: Method | None) -> Reply | None:
        """A single call's encoded reply: :meth:`_one` for a frame that is one object, with
        the method looked up when the frame was decoded, and no coroutine between this one
        and the handler's (nearly every frame comes here; each layer costs on every one)."""
        req_id = message.get("id", _NO_ID)
        try:
            self._validate(message, req_id)
            result = await self._invoke(method, message, ctx)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            error = self._failure(exc, message, req_id)
            return None if error is None else self._encoded(error)
        if req_id is _NO_ID:
            return None
        return self._encoded({"jsonrpc": "2.0", "id": req_id, "result": result})

    def _failure(self, exc: Exception, message: dict[str, Any], req_id: Any) -> dict[str, Any] | None:
        """The error reply for a call that raised ``exc`` (None for a notification, unless
        the frame itself was invalid)."""
        error = wire_error(exc)
        if error is None:
            error_id = new_error_id()
            self.on_crash(exc, error_id, str(message.get("method")))
            error = InternalError(error_id)
        if req_id is _NO_ID and not isinstance(error, InvalidRequest):
            return None
        return error_response(req_id if _valid_id(req_id) else None, error.to_object())

    def _validate(self, message: dict[str, Any], req_id: Any) -> str:
        if "jsonrpc" in message and message["jsonrpc"] != "2.0":
            raise InvalidRequest('invalid request: "jsonrpc" must be "2.0"')
        if req_id is not _NO_ID and type(req_id) is not int and not _valid_id(req_id):
            raise InvalidRequest('invalid request: "id" must be a string, a number or null')
        method = message.get("method")
        if not isinstance(method, str) or not method:
            raise InvalidRequest('invalid request: "method" must be a non-empty string')
        params = message.get("params")
        if params is not None and not isinstance(params, dict | list):
            raise InvalidRequest('invalid request: "params" must be an object')
        if not _MEMBERS.issuperset(message):  # no set is built for a well-formed frame
            extra = set(message) - _MEMBERS
            raise InvalidRequest(f"invalid request: unexpected members {sorted(extra)}")
        return method

    def _invoke(self, method: Method | None, message: dict[str, Any], ctx: CallContext) -> Awaitable[Any]:
        """The handler's coroutine for a validated call, its params checked: not itself a
        coroutine, so the caller awaits the handler directly. Raises what the caller maps."""
        name: str = message["method"]
        if method is None:
            raise MethodNotFound(f"method not found: {name}")
        if method.requires_auth and not ctx.authenticated:
            raise Unauthorized(
                f"unauthorized: authenticate first, within {self.auth_timeout_s:g} s of connecting "
                '(auth.timeout_s): send the frame {"type":"auth","token":"<token>"} or call '
                '{"jsonrpc":"2.0","id":1,"method":"auth","params":{"token":"<token>"}}'
            )
        if method.handler is None:
            raise MethodNotFound(f"method not implemented yet: {name}")
        params = parse_params(method, message.get("params"))
        if self.quotas is None or not ctx.authenticated or not self.quotas.limits(name):
            return method.handler(ctx, params)
        return self._admitted(method.handler, ctx, params, name)

    async def _admitted(self, handler: Handler, ctx: CallContext, params: Any, name: str) -> Any:
        assert self.quotas is not None
        with self.quotas.admit(ctx.caller, name):
            return await handler(ctx, params)


class Call:
    """One decoded frame, ready to run; made by :meth:`RpcCore.accept`."""

    __slots__ = ("_core", "_ctx", "_error", "_method", "inline", "message")

    def __init__(self, core: RpcCore, ctx: CallContext, message: Any, *, error: GatewayError | None = None) -> None:
        self._core = core
        self._ctx = ctx
        self._error = error
        self.message = message
        # Looked up once here, for both the inline decision and the dispatch.
        self._method = core.registry.find(message.get("method")) if isinstance(message, dict) else None
        # A parse error is answered at once; a single call of an inline method finishes
        # without suspending, so the server runs it in its read loop instead of paying for a task.
        self.inline = error is not None or (self._method is not None and self._method.inline)

    def run(self, budget: ReplyBudget | None = None) -> Awaitable[Reply | None]:
        """Run the frame (await the result). ``budget``: what the reply may take; a batch runs
        its entries within it (see :mod:`gateway.rpc.batch`), a single reply is measured by
        the transport. Not a coroutine itself: a single call awaits :meth:`RpcCore._single`
        directly, one coroutine less per frame."""
        if self._error is not None:
            return _ready(Reply(orjson.dumps(error_response(None, self._error.to_object())), True))
        if isinstance(self.message, dict):  # a single call: nearly every frame
            return self._core._single(self.message, self._ctx, self._method)
        return self._core._frame(self.message, self._ctx, budget)


async def _ready(reply: Reply) -> Reply:
    return reply


def _valid_id(value: Any) -> bool:
    return value is None or isinstance(value, str) or (
        isinstance(value, int | float) and not isinstance(value, bool)
    )
