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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.errors import (
    Forbidden,
    GatewayError,
    InternalError,
    InvalidRequest,
    MethodNotFound,
    ParseError,
    Unauthorized,
    new_error_id,
    wire_error,
)
from gateway.rpc.batch import run_batch
from gateway.rpc.budget import ReplyBudget
from gateway.rpc.context import CallContext, Notification, Reply
from gateway.rpc.fairness import CALLER, UserSlots
from gateway.rpc.quota import Quotas
from gateway.rpc.registry import Handler, Method, Registry, parse_params
from gateway.wire import ErrorObject

__all__ = ["Call", "CallContext", "Notification", "Reply", "RpcCore", "error_response"]

_NO_ID = object()
_MEMBERS = frozenset({"jsonrpc", "id", "method", "params"})


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
    # Reply bytes a call that may wait on I/O is assumed to build while it runs (the history
    # page cap): it starts only while the reply budget has room for it (gateway.rpc.budget).
    reply_reserve: int = 0
    # Calls of one user running at once across connections (limits.max_user_running); the rest
    # wait their turn (gateway.rpc.fairness). None: no cap.
    user_slots: UserSlots | None = None

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

    def refuse(self, message: Any, error: GatewayError, budget: ReplyBudget | None = None) -> Reply:
        """The reply refusing a frame before it runs (binary frame, too many in flight), held
        in ``budget`` when one is given."""
        req_id = message.get("id") if isinstance(message, dict) else None
        data = orjson.dumps(error_response(req_id, error.to_object()))
        if budget is not None:
            budget.hold(len(data))
        return Reply(data, True)

    async def batch(self, entries: list[Any], ctx: CallContext,
                    budget: ReplyBudget | None) -> Reply | None:
        """The reply to a batch frame (None when nothing is owed), its entries run within
        ``budget`` (gateway.rpc.batch)."""
        if not entries:
            return self._encode(
                error_response(None, InvalidRequest("invalid request: empty batch").to_object()),
                budget)
        if len(entries) > self.max_batch:
            err = InvalidRequest(
                f"invalid request: batch of {len(entries)} exceeds the limit of {self.max_batch}")
            return self._encode(error_response(None, err.to_object()), budget)
        find = self.registry.find
        return await run_batch(
            entries,
            lambda m: self.answer(m, ctx, find(m.get("method")) if isinstance(m, dict) else None),
            budget, self.reply_reserve)

    def answer(self, message: Any, ctx: CallContext, method: Method | None,
               budget: ReplyBudget | None = None) -> Awaitable[Reply | None]:
        """The encoded reply to one call (None for a notification; await it): a frame that is
        one object, or a batch entry. ``method`` is the one its name finds, looked up by the
        caller. With ``budget``, a call that may build a big reply first waits for room for
        :attr:`reply_reserve` bytes (refused unbuilt when unread replies leave none), and the
        reply is held in it, or refused if it does not fit.

        Not a coroutine itself: nearly every frame is a call of an inline method (or of none),
        which never waits, so it takes no reservation, no user slot and no caller mark, and
        awaits :meth:`_reply` directly, with no coroutine between this one and the handler's.
        Only a call that may wait goes through :meth:`_waiting`."""
        if not isinstance(message, dict):
            return _ready(self._encode(
                error_response(None,
                               InvalidRequest("invalid request: expected an object").to_object()),
                budget))
        req_id = message.get("id", _NO_ID)
        if method is None or method.inline:
            return self._reply(message, req_id, ctx, method, budget)
        return self._waiting(message, req_id, ctx, method, budget)

    async def _waiting(self, message: dict[str, Any], req_id: Any, ctx: CallContext, method: Method,
                       budget: ReplyBudget | None) -> Reply | None:
        """:meth:`_reply` for a call of a method that may wait (a worker thread, the disk,
        upstream): within its reservation, its user's slot and its caller mark."""
        reserving = budget if budget is not None and self.reply_reserve else None
        if reserving is not None:
            if req_id is _NO_ID:  # a notification holds no reply: it is never refused for room
                await reserving.start(self.reply_reserve)
            elif not await reserving.start_call(self.reply_reserve):
                refused = reserving.refusal_unstarted(self.reply_reserve)
                return self._encode(error_response(req_id if _valid_id(req_id) else None,
                                                   refused.to_object()), budget)
        # Calls take one of the user's slots only after their reservation, as batch entries
        # do: a call holding a slot never waits for budget room, so the two waits cannot
        # close a cycle.
        slots = self.user_slots if ctx.authenticated else None
        # The jobs this call puts in the worker threads count as its user's (FairThreads).
        caller = CALLER.set(ctx.caller) if ctx.authenticated else None
        try:
            if slots is not None:
                await slots.enter(ctx.caller)
            try:
                return await self._reply(message, req_id, ctx, method, budget)
            finally:
                if slots is not None:
                    slots.leave(ctx.caller)
        finally:
            if caller is not None:
                CALLER.reset(caller)
            if reserving is not None:  # after the reply is held: no other call slips in between
                reserving.finish(self.reply_reserve)

    async def _reply(self, message: dict[str, Any], req_id: Any, ctx: CallContext,
                     method: Method | None, budget: ReplyBudget | None) -> Reply | None:
        """Validate, run and encode one call (held in ``budget``); every failure an error reply."""
        try:
            self._validate(message, req_id)
            result = await self._invoke(method, message, ctx)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            error = self._failure(exc, message, req_id)
            return None if error is None else self._encode(error, budget)
        if req_id is _NO_ID:
            return None
        return self._encode({"jsonrpc": "2.0", "id": req_id, "result": result}, budget)

    def _encode(self, reply: dict[str, Any], budget: ReplyBudget | None) -> Reply:
        """The reply's bytes, held in ``budget``: the budget error in its place when it does
        not fit, -32603 when it holds something orjson cannot encode (a handler's bug)."""
        try:
            data, is_error = orjson.dumps(reply), "error" in reply
        except TypeError as exc:
            error_id = new_error_id()
            self.on_crash(exc, error_id, "<encode>")
            data, is_error = orjson.dumps(
                error_response(reply.get("id"), InternalError(error_id).to_object())), True
        if budget is None or budget.hold_if_fits(len(data)):
            return Reply(data, is_error)
        # Refused after it was built (its size is known only then), but never held: what a
        # connection (and its user's) keeps waiting for its reader stays under the budget.
        error = budget.refusal(len(data))
        data = orjson.dumps(error_response(reply.get("id"), error.to_object()))
        budget.hold(len(data))
        return Reply(data, True)

    def _failure(self, exc: Exception, message: dict[str, Any],
                 req_id: Any) -> dict[str, Any] | None:
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

    def _invoke(self, method: Method | None, message: dict[str, Any],
                ctx: CallContext) -> Awaitable[Any]:
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
        if method.writes and ctx.read_only:
            raise Forbidden(f"forbidden: {name} changes data, and this connection signed in with "
                            f"the read-only token of client {ctx.client!r}; use a token made "
                            "without --read-only")
        if method.handler is None:
            raise MethodNotFound(f"method not implemented yet: {name}")
        params = parse_params(method, message.get("params"))
        quotas = self.quotas
        # Most methods have no quota: that is asked first, before the caller.
        if quotas is None or not quotas.limits(name) or not ctx.authenticated:
            return method.handler(ctx, params)
        return self._admitted(method.handler, ctx, params, name)

    async def _admitted(self, handler: Handler, ctx: CallContext, params: Any, name: str) -> Any:
        assert self.quotas is not None
        with self.quotas.admit(ctx.caller, name):
            return await handler(ctx, params)


class Call:
    """One decoded frame, ready to run; made by :meth:`RpcCore.accept`."""

    __slots__ = ("_core", "_ctx", "_error", "_method", "inline", "message")

    def __init__(self, core: RpcCore, ctx: CallContext, message: Any, *,
                 error: GatewayError | None = None) -> None:
        self._core = core
        self._ctx = ctx
        self._error = error
        self.message = message
        # Looked up once here, for both the inline decision and the dispatch.
        self._method = (core.registry.find(message.get("method")) if isinstance(message, dict)
                        else None)
        # A parse error is answered at once; a single call of an inline method finishes
        # without suspending, so the server runs it in its read loop instead of paying for a task.
        self.inline = error is not None or (self._method is not None and self._method.inline)

    def run(self, budget: ReplyBudget | None = None) -> Awaitable[Reply | None]:
        """Run the frame (await the result). ``budget``: the connection's reply budget, which
        single calls and batch entries alike reserve room in and hold their replies in
        (:mod:`gateway.rpc.budget`); None: no limit. Not a coroutine itself: a single call
        awaits :meth:`RpcCore.answer` directly, one coroutine less per frame."""
        if self._error is not None:
            return _ready(self._core.refuse(None, self._error, budget))
        if isinstance(self.message, list):
            return self._core.batch(self.message, self._ctx, budget)
        return self._core.answer(self.message, self._ctx, self._method, budget)


async def _ready(reply: Reply) -> Reply:
    return reply


def _valid_id(value: Any) -> bool:
    return value is None or isinstance(value, str) or (
        isinstance(value, int | float) and not isinstance(value, bool)
    )
