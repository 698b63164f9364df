"""Limits below the WebSocket messages: TCP connections, control frames, accept errors.

``websockets`` answers every ping with a pong by itself and writes it without flow control,
so a peer that sends pings and never reads makes the server's send buffer grow without bound,
before authentication as well as after. :func:`guarded_connection` builds the
``ServerConnection`` class the server uses: it closes a connection 1008 once its peer sends
more than ``limits.max_control_frames_per_s`` control frames in a second, and refuses TCP
connections past the descriptor budget before the handshake reads a byte, so a flood of half-open
sockets cannot use the descriptors the transcripts need. :func:`connection_budget` derives
that budget from the process's open-file limit; :class:`SocketBudget` holds it for both
listeners (the gateway's port and ``/mcp``'s), closes a socket that has not sent its request
headers within ``server.header_timeout_s``, and, when full, closes the oldest such socket to
make room for a new one. :class:`AcceptErrorLog` turns asyncio's traceback per failed
``accept()`` into one warning per interval. :class:`PendingPool` keeps connections that have
not authenticated yet in a smaller pool of their own, with a cap per address, so sockets that
never authenticate cannot hold the slots of users who do; :class:`UserConnections` caps the
authenticated connections of each user, so one user cannot hold the slots of the others.
"""

from __future__ import annotations

import asyncio
import resource
import time
from typing import Any

import structlog
from websockets.frames import CloseCode, Frame, Opcode
from websockets.http11 import Request
from websockets.protocol import Event

from gateway.transport.writes import HeldWrites

__all__ = ["AcceptErrorLog", "PendingPool", "SocketBudget", "UserConnections", "connection_budget",
           "guarded_connection"]

log = structlog.get_logger("recalld.server")


def connection_budget(configured: int, reserved_fds: int) -> int:
    """``server.max_connections``, lowered to fit the open-file limit less ``reserved_fds``
    (transcripts, the databases, the model's connections need descriptors too)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return configured
    return max(1, min(configured, soft - reserved_fds))


class SocketBudget:
    """The TCP sockets of both listeners, against one budget of ``max_sockets``.

    A socket is counted from its ``connection_made`` (:meth:`admit`) to its ``connection_lost``
    (:meth:`release`, safe twice) and waits for its request headers meanwhile: not complete
    within ``header_timeout_s``, it is closed. When the budget is full, a new socket takes the
    place of the oldest one still waiting for headers (a slowloris's sockets are older than a
    client's new one, whose headers follow at once); with none waiting, the new one is closed
    before a byte is read. Either way the descriptor is freed at once: a flood of half-sent
    requests never reaches the open-file limit the transcripts and databases need.

    The server's close calls :meth:`drop_waiting` (silent sockets go; later ones are refused)
    and, once websockets has closed its connections, :meth:`shut` (every socket still counted is
    aborted): asyncio 3.11's ``Server.close()`` leaves accepted connections open, and a client
    that reconnects as the server stops (the web page does) can be accepted a loop turn after
    it, with nobody left to close its socket.
    """

    __slots__ = ("_last_log", "_open", "_waiting", "evicted", "header_timeout_s", "max_sockets",
                 "refused", "shut_down", "timed_out")

    def __init__(self, max_sockets: int, header_timeout_s: float) -> None:
        self.max_sockets = max_sockets
        self.header_timeout_s = header_timeout_s
        # Every socket counted, with its transport (for shut()).
        self._open: dict[object, asyncio.Transport] = {}
        # Sockets waiting for request headers, oldest first, each with the timer that closes it.
        self._waiting: dict[object, tuple[asyncio.Transport, asyncio.TimerHandle]] = {}
        self.refused = 0
        self.evicted = 0
        self.timed_out = 0
        self.shut_down = False
        self._last_log = float("-inf")

    @property
    def count(self) -> int:
        return len(self._open)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def admit(self, owner: object, transport: asyncio.Transport) -> bool:
        """Count a socket just accepted, waiting for its headers; False (and closed) if
        none fits or the server has shut."""
        if self.shut_down:
            transport.abort()
            return False
        if len(self._open) >= self.max_sockets and not self._evict_oldest():
            self.refused += 1
            self._log_full()
            transport.abort()
            return False
        self._open[owner] = transport
        self.await_headers(owner, transport)
        return True

    def await_headers(self, owner: object, transport: asyncio.Transport) -> None:
        """(Again) wait for a request's headers: a kept-alive HTTP connection between requests."""
        if owner not in self._open:
            return
        self.headers_done(owner)
        timer = asyncio.get_running_loop().call_later(self.header_timeout_s, self._expire, owner)
        self._waiting[owner] = (transport, timer)

    def headers_done(self, owner: object) -> None:
        entry = self._waiting.pop(owner, None)
        if entry is not None:
            entry[1].cancel()

    def release(self, owner: object) -> None:
        self.headers_done(owner)
        self._open.pop(owner, None)

    def drop_waiting(self) -> int:
        """Refuse every socket admitted from now on and abort those that have not sent their
        request headers (nothing of theirs is being answered); the number aborted. The server's
        close starts with this, so a silent socket does not hold the shutdown for
        ``header_timeout_s``, nor one accepted before websockets' close task has run."""
        self.shut_down = True
        left = list(self._waiting)
        for owner in left:
            transport, timer = self._waiting.pop(owner)
            timer.cancel()
            transport.abort()
        return len(left)

    def shut(self) -> int:
        """Abort every socket still counted and refuse any admitted from now on; the number
        aborted. Their ``connection_lost`` (and the descriptor's close) follow a loop turn
        later."""
        self.shut_down = True
        left = list(self._open.values())
        for transport in left:  # a transport closing gracefully is forced (abort is idempotent)
            transport.abort()
        return len(left)

    def _expire(self, owner: object) -> None:
        entry = self._waiting.pop(owner, None)
        if entry is not None:
            self.timed_out += 1
            entry[0].abort()

    def _evict_oldest(self) -> bool:
        if not self._waiting:
            return False
        owner = next(iter(self._waiting))
        transport, timer = self._waiting.pop(owner)
        timer.cancel()
        # Its place is the newcomer's from now: its connection_lost comes a loop turn later.
        self._open.pop(owner, None)
        self.evicted += 1
        self._log_full()
        transport.abort()
        return True

    def _log_full(self) -> None:
        now = time.monotonic()
        if now - self._last_log >= _FULL_LOG_INTERVAL_S:
            self._last_log = now
            log.warning("server.sockets_full", max_sockets=self.max_sockets,
                        waiting_for_headers=len(self._waiting), evicted=self.evicted,
                        refused=self.refused, header_timeouts=self.timed_out)


_FULL_LOG_INTERVAL_S = 10.0


class UserConnections:
    """Authenticated connections per user, at most ``max_per_user`` each: a place is taken when
    a connection authenticates and given back when its socket closes (:meth:`leave` is safe to
    call twice)."""

    __slots__ = ("_held", "by_user", "max_per_user")

    def __init__(self, max_per_user: int) -> None:
        self.max_per_user = max_per_user
        self.by_user: dict[str, int] = {}
        self._held: dict[object, str] = {}

    def refusal(self, user: str) -> str | None:
        """Why another connection of ``user`` is refused, or None."""
        if self.by_user.get(user, 0) >= self.max_per_user:
            return ("too many connections for this user (server.max_connections_per_user "
                    f"{self.max_per_user})")
        return None

    def enter(self, conn: object, user: str) -> None:
        if conn in self._held:
            return
        self._held[conn] = user
        self.by_user[user] = self.by_user.get(user, 0) + 1

    def leave(self, conn: object) -> None:
        user = self._held.pop(conn, None)
        if user is None:
            return
        left = self.by_user[user] - 1
        if left:
            self.by_user[user] = left
        else:
            del self.by_user[user]


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
            return ("too many connections waiting to authenticate (auth.max_pending "
                    f"{self.max_pending})")
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


def guarded_connection(*, max_control_per_s: int, sockets: SocketBudget, pending: PendingPool,
                       users: UserConnections) -> type[HeldWrites]:
    """A ``ServerConnection`` class enforcing these limits, its sockets counted in ``sockets``
    (shared with the ``/mcp`` listener), with :class:`HeldWrites`' burst writes."""

    class GuardedConnection(HeldWrites):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._window = 0.0
            self._controls = 0
            self._flooded = False

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)
            # Refused (aborted) before the handshake when nothing fits: no HTTP parsing, and
            # the descriptor is freed now.
            sockets.admit(self, self.transport)

        def connection_lost(self, exc: Exception | None) -> None:
            # At the latest here, so a handshake that fails after taking a place leaks none.
            sockets.release(self)
            pending.leave(self)
            users.leave(self)
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self._controls > max_control_per_s and not self._flooded:
                self._flooded = True
                log.warning("connection.control_flood", frames=self._controls,
                            limit=max_control_per_s)
                # The close frame goes out if the peer reads; if it does not, the socket is
                # dropped after close_timeout like any close that does not complete.
                self.protocol.fail(CloseCode.POLICY_VIOLATION, "too many control frames")
                self.send_data()
                timeout = self.close_timeout or 1.0
                self.loop.call_later(timeout, self._abort_if_open)

        def process_event(self, event: Event) -> None:
            if isinstance(event, Request):
                # The rest of the handshake is bounded by open_timeout_s; the socket is no
                # longer the first one closed when the budget is full.
                sockets.headers_done(self)
            elif isinstance(event, Frame) and event.opcode in (Opcode.PING, Opcode.PONG):
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
