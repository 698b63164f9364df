"""What a handler sees of its caller (:class:`CallContext`), what it may push to it
(:class:`Notification`), and what a frame is answered with (:class:`Reply`). A leaf of
:mod:`gateway.rpc`: the registry, the batch runner and the core import it, so none of them
imports another's caller."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple, Protocol

import orjson

__all__ = ["CallContext", "Notification", "Reply"]


class Reply(NamedTuple):
    """A frame's answer. A named tuple rather than a frozen dataclass, immutable all the same:
    one is made per frame, and a frozen dataclass's ``__init__`` (``object.__setattr__`` per
    field) cost as much as encoding a ``gateway.health`` reply."""

    data: bytes
    # True when the reply, or any entry of a batch reply, is an error (for the connection's
    # error counter; nobody has to search the bytes).
    is_error: bool


class Notification:
    """A server → client notification, encoded at most once however many callers get it."""

    __slots__ = ("_frame", "method", "params")

    def __init__(self, method: str, params: Mapping[str, Any]) -> None:
        self.method = method
        self.params = params
        self._frame: bytes | None = None

    def encode(self) -> bytes:
        if self._frame is None:
            self._frame = orjson.dumps({"jsonrpc": "2.0", "method": self.method,
                                        "params": self.params})
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

    @property
    def client(self) -> str | None:
        """The client token's name the connection signed in with (None: the user's own token)."""
        ...

    @property
    def read_only(self) -> bool:
        """True when that client token may only read: methods that write are refused."""
        ...

    def authenticate(self, user: str, client: str | None = None,
                     read_only: bool = False) -> None: ...

    def notify(self, note: Notification) -> None:
        """Queue a notification for this caller behind its pending events."""
        ...
