"""Wire shapes that cross modules inside the gateway, as TypedDicts.

Values stay dataclasses (``Session``, ``Message``, ``SearchHit``) until a handler returns;
these are the few dict shapes that one gateway module builds and another reads or forwards.
Keys are camelCase because they are the wire's.
"""

from __future__ import annotations

from typing import Any, Literal, TypedDict

__all__ = [
    "PROTOCOL_VERSION",
    "ChatDelta",
    "ChatEventBase",
    "ErrorObject",
    "MemoryHealth",
    "ServerInfo",
    "server_info",
]

PROTOCOL_VERSION = 1


class ServerInfo(TypedDict):
    name: Literal["recalld"]
    version: str
    protocol: int


def server_info(version: str) -> ServerInfo:
    """What the auth frame's answer and the ``auth`` method say about this server."""
    return {"name": "recalld", "version": version, "protocol": PROTOCOL_VERSION}


class ErrorObject(TypedDict, total=False):
    code: int
    message: str
    data: Any
    retryable: bool  # chat.error's error object adds it (docs/protocol.md)


class ChatEventBase(TypedDict):
    """What every ``chat.*`` event carries."""

    sessionKey: str
    runId: str
    seq: int


class ChatDelta(ChatEventBase):
    """``chat.delta``: the next piece of the reply's text."""

    delta: str


class MemoryHealth(TypedDict, total=False):
    """``gateway.health.memory``: cheap, no database query."""

    enabled: bool
    provider: str
    model: str | None  # the active embedder's model, None without one
    embedderReason: str  # why this embedder (or none) is active
    syncCount: int
