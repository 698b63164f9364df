"""Limits below the WebSocket messages: TCP connections, control frames, accept errors.

``websockets`` answers every ping with a pong by itself and writes it without flow control,
so a peer that sends pings and never reads makes the server's send buffer grow without bound,
before authentication as well as after. :func:`guarded_connection` builds the
``ServerConnection`` class the server uses: it closes a connection 1008 once its peer sends
more than ``limits.max_control_frames_per_s`` control frames in a second, and refuses TCP
connections past the descriptor budget before the handshake reads a byte, so a flood of half-open
sockets cannot use the descriptors the transcripts need. :func:`connection_budget` derives
that budget from the process's open-file limit. :class:`AcceptErrorLog` turns asyncio's
traceback per failed ``accept()`` into one warning per interval. :class:`PendingPool` keeps
connections that have not authenticated yet in a smaller pool of their own, with a cap per
address, so sockets that never authenticate cannot hold the slots of users who do.
"""

from __future__ import annotations

import asyncio
import resource
import time
from collections.abc import Callable
from typing import Any

import structlog
from websockets.frames import CloseCode, Frame, Opcode
from websockets.protocol import Event

from gateway.transport.writes import HeldWrites

__all__ = ["AcceptErrorLog", "PendingPool", "connection_budget", "guarded_connection"]

log = structlog.get_logger("recalld.server")


def connection_budget(configured: int, reserved_fds: int) -> int:
    """``server.max_connections``, lowered to fit the open-file limit less ``reserved_fds``
    (transcripts, the databases, the model's connections need descriptors too)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return configured
    return max(1, min(configured, soft - reserved_fds))


class PendingPool:
    """Connections upgraded but not yet authenticated (``auth.max_pending`` in all,
    ``auth.max_pending_per_address`` per address bucket, loopback being one): a place is taken
    at the handshake and given back when the connection authenticates or its socket closes,
    whichever comes first (:meth:`leave` is safe to call twice)."""

    __slots__ = ("_held", "by_bucket", "max_pending", "max_per_address")

    def __init__(self, max_pending: int, max_per_address: int) -> None:
        self.max_pending = max_pending
        self.max_per_address = max_per_address
        self.by_bucket: dict[str, int] = {}
        self._held: dict[object, str] = {}

    @property
    def count(self) -> int:
        return len(self._held)

    def refusal(self, bucket: str) -> str | None:
        """Why a new unauthenticated connection from ``bucket`` is refused, or None."""
        if len(self._held) >= self.max_pending:
            return f"too many connections waiting to authenticate (auth.max_pending {self.max_pending})"
        if self.by_bucket.get(bucket, 0) >= self.max_per_address:
            return ("too many connections waiting to authenticate from this address "
                    f"(auth.max_pending_per_address {self.max_per_address})")
        return None

    def enter(self, conn: object, bucket: str) -> None:
        self._held[conn] = bucket
        self.by_bucket[bucket] = self.by_bucket.get(bucket, 0) + 1

    def leave(self, conn: object) -> None:
        bucket = self._held.pop(conn, None)
        if bucket is None:
            return
        left = self.by_bucket[bucket] - 1
        if left:
            self.by_bucket[bucket] = left
        else:
            del self.by_bucket[bucket]


def guarded_connection(*, max_control_per_s: int, max_sockets: int, pending: PendingPool,
                       on_refused: Callable[[], None]) -> type[HeldWrites]:
    """A ``ServerConnection`` class enforcing these limits (one class per server: the count
    of open sockets is shared by its connections), with :class:`HeldWrites`' burst writes."""

    class GuardedConnection(HeldWrites):
        open_sockets = 0

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._counted = False
            self._window = 0.0
            self._controls = 0
            self._flooded = False

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)
            cls = type(self)
            if cls.open_sockets >= max_sockets:
                # Refused before the handshake: no HTTP parsing, and the descriptor is freed now.
                on_refused()
                self.transport.abort()
                return
            cls.open_sockets += 1
            self._counted = True

        def connection_lost(self, exc: Exception | None) -> None:
            # At the latest here, so a handshake that fails after taking a place leaks none.
            pending.leave(self)
            if self._counted:
                type(self).open_sockets -= 1
                self._counted = False
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self._controls > max_control_per_s and not self._flooded:
                self._flooded = True
                log.warning("connection.control_flood", frames=self._controls, limit=max_control_per_s)
                # The close frame goes out if the peer reads; if it does not, the socket is
                # dropped after close_timeout like any close that does not complete.
                self.protocol.fail(CloseCode.POLICY_VIOLATION, "too many control frames")
                self.send_data()
                timeout = self.close_timeout or 1.0
                self.loop.call_later(timeout, self._abort_if_open)

        def process_event(self, event: Event) -> None:
            if isinstance(event, Frame) and event.opcode in (Opcode.PING, Opcode.PONG):
                now = time.monotonic()
                if now - self._window >= 1.0:
                    self._window, self._controls = now, 0
                self._controls += 1
            super().process_event(event)

        def _abort_if_open(self) -> None:
            if not self.transport.is_closing():
                self.transport.abort()

    return GuardedConnection


class AcceptErrorLog:
    """A loop exception handler that reports failed ``accept()`` calls (EMFILE, ENFILE,
    ENOBUFS) once per ``interval_s`` with a count, and passes everything else on."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.suppressed = 0
        self._last = float("-inf")
        self._previous: Any = None

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        self._previous = loop.get_exception_handler()
        loop.set_exception_handler(self)

    def uninstall(self, loop: asyncio.AbstractEventLoop) -> None:
        if loop.get_exception_handler() is self:
            loop.set_exception_handler(self._previous)

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if not str(context.get("message", "")).startswith("socket.accept()"):
            if self._previous is not None:
                self._previous(loop, context)
            else:
                loop.default_exception_handler(context)
            return
        now = time.monotonic()
        if now - self._last < self.interval_s:
            self.suppressed += 1
            return
        exc = context.get("exception")
        log.warning("server.accept_failed", error=str(exc) if exc else context.get("message"),
                    suppressed=self.suppressed, interval_s=self.interval_s)
        self._last, self.suppressed = now, 0
