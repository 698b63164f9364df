"""The gateway's exceptions, and the one map from every exception to a JSON-RPC error.

Tree::

    GatewayError                 code    meaning
    ├── ParseError               -32700  frame is not JSON
    ├── InvalidRequest           -32600  not a request object, batch too large
    ├── MethodNotFound           -32601  unknown or not-yet-implemented method
    ├── InvalidParams            -32602  ``data`` = {field, reason}
    ├── InternalError            -32603  ``data`` = {errorId}; the traceback goes to the log
    ├── StorageFailed            -32603  ``data`` = {retryable, retryAfterMs?}; "storage error: …",
    │                                    no errorId
    ├── Unauthorized             -32001
    ├── NotFound                 -32002  unknown key, or another user's
    ├── Conflict                 -32003  busy / conflicting state
    ├── RateLimited              -32004  ``data`` = {retryAfterMs}
    ├── Forbidden                -32005  the connection's token may not do this (read-only)
    ├── UpstreamError            -32010  ``data`` = {status, retryable}
    └── NotConfigured            -32011  a feature needs a setting that is missing

``sessions`` and ``memory`` keep their own trees and know nothing of JSON-RPC.
:func:`wire_error` is the boundary: one table per package, by exception class, in this module
only (tests/gateway/test_errors.py pins every row). A disk failure is a storage error, not a
bug: it keeps -32603 (docs/protocol.md) but carries no errorId and is not logged as a crash.
An embedder failure is an upstream failure and keeps its HTTP status and retry flag. Anything
not in a table is a bug: -32603 with an ``errorId``, and its text never reaches the wire.

PostgreSQL (``storage.backend = "postgres"``) fails the same way: a database that is down,
restarting, failing over or past ``statement_timeout``/``lock_timeout`` is the storage error
with ``retryAfterMs``, whether psycopg's error reached the gateway bare (a pool timeout) or
inside a sessions or memory error. Only the server's own one-line message reaches the wire
(never libpq's connection text, which names the host); a psycopg error that is not
operational (bad SQL) is a bug like any other.
"""

from __future__ import annotations

import secrets
import sys
from typing import Any

from gateway.wire import ErrorObject
from memory import (
    EmbedderError,
    FactNotFound,
    InvalidFact,
    InvalidSearch,
    MemoryIndexError,
    MemoryUnavailable,
)
from sessions import InvalidSessionInput, SessionNotFound, StorageError, UnsafePath

__all__ = [
    "Conflict",
    "Forbidden",
    "GatewayError",
    "InternalError",
    "InvalidParams",
    "InvalidRequest",
    "MethodNotFound",
    "NotConfigured",
    "NotFound",
    "ParseError",
    "RateLimited",
    "StorageFailed",
    "Unauthorized",
    "UpstreamError",
    "new_error_id",
    "pg_reason",
    "to_error_object",
    "wire_error",
]


class GatewayError(Exception):
    """Base class: an error with a JSON-RPC code, a message and optional structured data."""

    code: int = -32603
    # Whether the same request may succeed later (chat.error reports it).
    retryable: bool = False

    def __init__(self, message: str, data: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.data = data

    def to_object(self) -> ErrorObject:
        obj: ErrorObject = {"code": self.code, "message": self.message}
        if self.data is not None:
            obj["data"] = self.data
        return obj


class ParseError(GatewayError):
    code = -32700


class InvalidRequest(GatewayError):
    code = -32600


class MethodNotFound(GatewayError):
    code = -32601


class InvalidParams(GatewayError):
    code = -32602

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"invalid params: {field}: {reason}", {"field": field, "reason": reason})
        self.field = field
        self.reason = reason


class InternalError(GatewayError):
    code = -32603

    def __init__(self, error_id: str, message: str = "internal error") -> None:
        super().__init__(message, {"errorId": error_id})
        self.error_id = error_id


class StorageFailed(GatewayError):
    """The disk or the index database failed; the request can be retried once it recovers."""

    code = -32603
    retryable = True

    def __init__(self, message: str, *, retryable: bool = True,
                 retry_after_ms: int | None = None) -> None:
        # Some layers already say "storage error: …"; the wire says it once.
        reason = message.removeprefix(_PREFIX) or "unknown"
        data: dict[str, Any] = {"retryable": retryable}
        if retry_after_ms is not None:
            data["retryAfterMs"] = retry_after_ms
        super().__init__(_PREFIX + reason, data)
        self.retryable = retryable
        self.retry_after_ms = retry_after_ms


_PREFIX = "storage error: "
# What a client waits before retrying a call that PostgreSQL failed: the pools try a new
# connection about once a second (storage.reconnect_timeout_s), so a retry sooner finds none.
PG_RETRY_AFTER_MS = 1000


class Unauthorized(GatewayError):
    code = -32001


class NotFound(GatewayError):
    code = -32002


class Conflict(GatewayError):
    code = -32003


class RateLimited(GatewayError):
    code = -32004

    def __init__(self, message: str, retry_after_ms: int) -> None:
        super().__init__(message, {"retryAfterMs": retry_after_ms})
        self.retry_after_ms = retry_after_ms


class Forbidden(GatewayError):
    """Signed in, but this connection's token may not call the method (a read-only client
    token and a method that writes): no retry helps with the same token."""

    code = -32005


class UpstreamError(GatewayError):
    code = -32010

    def __init__(self, message: str, status: int | None, retryable: bool) -> None:
        super().__init__(message, {"status": status, "retryable": retryable})
        self.status = status
        self.retryable = retryable


class NotConfigured(GatewayError):
    code = -32011


def new_error_id() -> str:
    """A short id that ties a -32603 reply to its log line."""
    return secrets.token_hex(6)


def wire_error(exc: BaseException) -> GatewayError | None:
    """The wire error for ``exc``, or ``None`` when it is a bug (the caller answers -32603
    with an errorId and logs the traceback under that id)."""
    if isinstance(exc, GatewayError):
        return exc
    return _from_sessions(exc) or _from_memory(exc) or _from_postgres(exc)


def _from_sessions(exc: BaseException) -> GatewayError | None:
    # Messages of sessions' errors are written for the wire (no paths, no other users' data).
    if isinstance(exc, SessionNotFound):
        return NotFound(exc.message)
    if isinstance(exc, InvalidSessionInput):  # LineTooLarge included
        return InvalidParams(exc.field, exc.reason)
    if isinstance(exc, UnsafePath):
        return StorageFailed(exc.message, retryable=False)  # a planted link stays until removed
    if isinstance(exc, StorageError):
        cause = exc.__cause__
        if cause is not None and _is_pg(cause):
            # The store names the action ("… while appending a message"); this, what failed.
            return StorageFailed(f"{exc.message}: {pg_reason(cause)}",
                                 retry_after_ms=_pg_retry_after(exc))
        return StorageFailed(exc.message)
    return None  # SessionError itself is never raised on purpose: a bug


def _from_memory(exc: BaseException) -> GatewayError | None:
    if not isinstance(exc, MemoryIndexError):
        return None
    message = str(exc) or type(exc).__name__  # memory's messages are short and wire-safe
    if isinstance(exc, InvalidSearch):
        return InvalidParams(exc.field, exc.reason)
    if isinstance(exc, InvalidFact):
        return InvalidParams(exc.field, exc.reason)
    if isinstance(exc, FactNotFound):
        return NotFound(message)
    if isinstance(exc, EmbedderError):
        return UpstreamError(message, exc.status, exc.retryable)
    if isinstance(exc, MemoryUnavailable):
        return NotConfigured(message)
    # MemoryStorageError, and the root itself, which memory documents as an index failure.
    cause = exc.__cause__
    if cause is not None and message.endswith(type(cause).__name__) and _is_pg(cause):
        # memory's PostgreSQL steps name only the driver's class: say what happened instead.
        message = message.removesuffix(type(cause).__name__) + pg_reason(cause)
    return StorageFailed(message, retry_after_ms=_pg_retry_after(exc))


def _is_pg(exc: BaseException) -> bool:
    psycopg = sys.modules.get("psycopg")
    return psycopg is not None and isinstance(exc, psycopg.Error)


def _from_postgres(exc: BaseException) -> GatewayError | None:
    """A psycopg error that reached the gateway bare: operational ones (the server down or
    restarting, a pool timeout, a statement or lock timeout) are the storage error."""
    # psycopg is the postgres extra: never imported here, so the default install needs none.
    # An exception of it can only exist once something else imported it.
    psycopg = sys.modules.get("psycopg")
    if psycopg is None or not isinstance(exc, psycopg.Error):
        return None
    if isinstance(exc, psycopg.errors.InsufficientPrivilege):
        # The database role lacks a grant: no retry helps until an operator fixes it.
        return StorageFailed(f"the database refused: {pg_reason(exc)}", retryable=False)
    if not isinstance(exc, psycopg.OperationalError):
        return None  # bad SQL, a type the driver cannot adapt: a bug
    return StorageFailed(f"the database failed: {pg_reason(exc)}", retry_after_ms=PG_RETRY_AFTER_MS)


def pg_reason(exc: BaseException) -> str:
    """The wire-safe reason of a psycopg error: the server's message ("canceling statement due
    to lock timeout"), a pool's own ("couldn't get a connection after 5.00 sec"), or, for a
    client-side failure, libpq's last words without the host it names ("connection failed:
    Connection refused")."""
    diag = getattr(exc, "diag", None)
    primary = getattr(diag, "message_primary", None) if getattr(exc, "sqlstate", None) else None
    if primary:
        return str(primary)
    if type(exc).__module__.startswith("psycopg_pool"):  # PoolTimeout, PoolClosed, TooManyRequests
        return str(exc) or type(exc).__name__
    # 'connection failed: connection to server at "db", port 5432 failed: Connection refused'
    lines = str(exc).strip().splitlines()
    last = lines[0].rsplit("failed: ", 1)[-1].strip() if lines else ""
    return (f"connection failed: {last}" if last and '"' not in last
            else "the connection to the database failed")


def _pg_retry_after(exc: BaseException) -> int | None:
    """``retryAfterMs`` for an error caused by an operational PostgreSQL failure, else None."""
    psycopg = sys.modules.get("psycopg")
    cause = exc.__cause__
    while psycopg is not None and cause is not None:
        if isinstance(cause, psycopg.OperationalError):
            return PG_RETRY_AFTER_MS
        cause = cause.__cause__
    return None


def to_error_object(exc: BaseException, error_id: str | None = None) -> ErrorObject:
    """The JSON-RPC error object for any exception (see :func:`wire_error`)."""
    mapped = wire_error(exc)
    if mapped is not None:
        return mapped.to_object()
    return InternalError(error_id or new_error_id()).to_object()
