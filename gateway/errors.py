"""The gateway's exceptions, and the one place any exception becomes a JSON-RPC error.

Tree::

    GatewayError                 code    meaning
    ├── ParseError               -32700  frame is not JSON
    ├── InvalidRequest           -32600  not a request object, batch too large
    ├── MethodNotFound           -32601  unknown or not-yet-implemented method
    ├── InvalidParams            -32602  ``data`` = {field, reason}
    ├── InternalError            -32603  ``data`` = {errorId}; the traceback goes to the log
    ├── Unauthorized             -32001
    ├── NotFound                 -32002  unknown key, or another user's
    ├── Conflict                 -32003  busy / conflicting state
    ├── RateLimited              -32004  ``data`` = {retryAfterMs}
    ├── UpstreamError            -32010  ``data`` = {status, retryable}
    └── NotConfigured            -32011  a feature needs a setting that is missing

Errors raised by ``sessions`` and ``memory`` keep their own trees (those packages know
nothing of JSON-RPC); :func:`to_error_object` maps them here, so the mapping lives in one
place.
"""

from __future__ import annotations

import secrets
from typing import Any

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
    "Unauthorized",
    "UpstreamError",
    "new_error_id",
    "to_error_object",
]


class GatewayError(Exception):
    """Base class: an error with a JSON-RPC code, a message and optional structured data."""

    code: int = -32603

    def __init__(self, message: str, data: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.data = data

    def to_object(self) -> dict[str, Any]:
        obj: dict[str, Any] = {"code": self.code, "message": self.message}
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


def to_error_object(exc: BaseException, error_id: str | None = None) -> dict[str, Any]:
    """Map any exception to a JSON-RPC error object; the single place this happens.

    Unknown exceptions become -32603 carrying ``error_id`` (the caller logs the traceback
    with the same id); nothing of the traceback reaches the wire.
    """
    if isinstance(exc, GatewayError):
        return exc.to_object()
    mapped = _map_library_error(exc)
    if mapped is not None:
        return mapped.to_object()
    return InternalError(error_id or new_error_id()).to_object()


def _map_library_error(exc: BaseException) -> GatewayError | None:
    """Translate ``sessions`` / ``memory`` errors by their declared ``rpc_kind``.

    Library errors carry a plain attribute ``rpc_kind`` (``"not_found"``, ``"invalid"``,
    ``"conflict"``, ``"storage"``, ``"unavailable"``) so those packages stay free of
    JSON-RPC while the mapping stays here.
    """
    kind = getattr(exc, "rpc_kind", None)
    message = str(exc) or exc.__class__.__name__
    if kind == "not_found":
        return NotFound(message)
    if kind == "invalid":
        return InvalidParams(getattr(exc, "field", "params"), message)
    if kind == "conflict":
        return Conflict(message)
    if kind == "storage":
        # A disk problem is not a bug: say what happened, keep the daemon serving.
        return GatewayError(f"storage error: {message}", {"retryable": True})
    if kind == "unavailable":
        return NotConfigured(message)
    return None
