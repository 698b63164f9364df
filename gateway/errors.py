"""The gateway's exceptions, and the one map from every exception to a JSON-RPC error.

Tree::

    GatewayError                 code    meaning
    ├── ParseError               -32700  frame is not JSON
    ├── InvalidRequest           -32600  not a request object, batch too large
    ├── MethodNotFound           -32601  unknown or not-yet-implemented method
    ├── InvalidParams            -32602  ``data`` = {field, reason}
    ├── InternalError            -32603  ``data`` = {errorId}; the traceback goes to the log
    ├── StorageFailed            -32603  ``data`` = {retryable}; "storage error: …", no errorId
    ├── Unauthorized             -32001
    ├── NotFound                 -32002  unknown key, or another user's
    ├── Conflict                 -32003  busy / conflicting state
    ├── RateLimited              -32004  ``data`` = {retryAfterMs}
    ├── UpstreamError            -32010  ``data`` = {status, retryable}
    └── NotConfigured            -32011  a feature needs a setting that is missing

``sessions`` and ``memory`` keep their own trees and know nothing of JSON-RPC.
:func:`wire_error` is the boundary: one table per package, by exception class, in this module
only (tests/gateway/test_errors.py pins every row). A disk failure is a storage error, not a
bug: it keeps -32603 (docs/protocol.md) but carries no errorId and is not logged as a crash.
An embedder failure is an upstream failure and keeps its HTTP status and retry flag. Anything
not in a table is a bug: -32603 with an ``errorId``, and its text never reaches the wire.
"""

from __future__ import annotations

import secrets
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

    def __init__(self, message: str, *, retryable: bool = True) -> None:
        super().__init__(f"storage error: {message}", {"retryable": retryable})
        self.retryable = retryable


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
    return _from_sessions(exc) or _from_memory(exc)


def _from_sessions(exc: BaseException) -> GatewayError | None:
    # Messages of sessions' errors are written for the wire (no paths, no other users' data).
    if isinstance(exc, SessionNotFound):
        return NotFound(exc.message)
    if isinstance(exc, InvalidSessionInput):  # LineTooLarge included
        return InvalidParams(exc.field, exc.reason)
    if isinstance(exc, UnsafePath):
        return StorageFailed(exc.message, retryable=False)  # a planted link stays until removed
    if isinstance(exc, StorageError):
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
    return StorageFailed(message)


def to_error_object(exc: BaseException, error_id: str | None = None) -> ErrorObject:
    """The JSON-RPC error object for any exception (see :func:`wire_error`)."""
    mapped = wire_error(exc)
    if mapped is not None:
        return mapped.to_object()
    return InternalError(error_id or new_error_id()).to_object()
