"""One client connection: its identity, counters, outbox and how it is closed.

It is the :class:`~gateway.rpc.CallContext` handlers see: who the caller is, where it comes
from, and a way to push notifications to it. Replies and events take different paths (see
:meth:`Connection.reply`); events queue in the :class:`~gateway.transport.outbox.Outbox` and
one writer task per connection drains it.
"""

from __future__ import annotations

import asyncio
import itertools
import time

import structlog
from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from gateway.errors import Conflict, RateLimited
from gateway.rpc import Notification, ReplyBudget, UserBudgets
from gateway.transport.guard import UserConnections
from gateway.transport.outbox import Outbox

__all__ = ["CLOSE_POLICY", "Connection", "peer_address"]

log = structlog.get_logger("recalld.server")

CLOSE_POLICY = 1008
_conn_ids = itertools.count(1)


def peer_address(ws: ServerConnection) -> str:
    peer = ws.remote_address
    return str(peer[0]) if isinstance(peer, tuple) else str(peer)


class Connection:
    """One client; handlers see it as their :class:`~gateway.rpc.CallContext`."""

    def __init__(self, ws: ServerConnection, user: str | None, *, max_outbox_bytes: int,
                 max_reply_bytes: int, close_timeout_s: float,
                 user_budgets: UserBudgets | None = None,
                 user_connections: UserConnections | None = None, client: str | None = None,
                 read_only: bool = False) -> None:
        self.id = next(_conn_ids)
        self.ws = ws
        self.user = user
        # Which client token signed in (None: the user's own token), and whether it may only
        # read: the RPC core refuses methods that write, saved facts record the name.
        self.client = client
        self.read_only = read_only
        self.address = peer_address(ws)
        self.outbox = Outbox(max_outbox_bytes)
        self.close_timeout_s = close_timeout_s
        self.inflight = 0
        # Replies enter the socket's buffer one at a time (see reply()).
        self._reply_turn = asyncio.Lock()
        # Replies built and not yet written, and the calls building them (limits.max_reply_bytes).
        self.budget = ReplyBudget(max_reply_bytes)
        # The budget the user's connections share (limits.max_user_reply_bytes), joined once a
        # user is known.
        self._user_budgets = user_budgets
        if user is not None and user_budgets is not None:
            user_budgets.join(user, self.budget)
        # Each user's connections (server.max_connections_per_user); one authenticated in the
        # handshake took its place there already. Given back when the socket closes (guard).
        self._user_connections = user_connections
        self.requests = 0
        self.errors = 0
        self.opened = time.monotonic()
        self._closing: asyncio.Task[None] | None = None

    @property
    def authenticated(self) -> bool:
        return self.user is not None

    @property
    def caller(self) -> str:
        if self.user is None:
            # The RPC core refuses unauthenticated calls to methods that need a user, so a
            # handler reaching here is a wiring bug, not a client mistake.
            raise RuntimeError("caller read on an unauthenticated connection")
        return self.user

    def authenticate(self, user: str, client: str | None = None, read_only: bool = False) -> None:
        if self.user is not None and user != self.user:
            # The connection's subscriptions and run attachments belong to the first user;
            # switching would hand that user's events to the second.
            raise Conflict(f"this connection is authenticated as {self.user!r}; "
                           "open a new connection to act as another user")
        if self.user is None and self._user_connections is not None:
            refusal = self._user_connections.refusal(user)
            if refusal is not None:
                # The connection stays unauthenticated (auth.timeout_s still runs): closing one
                # of the user's other connections makes room.
                raise RateLimited(refusal + "; close another connection of this user first", 1000)
            self._user_connections.enter(self.ws, user)
        if self.user is None and self._user_budgets is not None:
            self._user_budgets.join(user, self.budget)
        self.user = user
        # The latest sign-in names the client: a second `auth` of the same user with another
        # of its tokens gets that token's rights, no more (its holder could open a new
        # connection with it anyway).
        self.client, self.read_only = client, read_only
        structlog.contextvars.bind_contextvars(user=user)
        log.info("auth.ok", client=client, read_only=read_only)

    def leave_budgets(self) -> None:
        """The connection closed: it no longer counts in its user's reply budget."""
        if self.user is not None and self._user_budgets is not None:
            self._user_budgets.leave(self.user, self.budget)

    def notify(self, note: Notification) -> None:
        # Deltas stay unencoded while they wait so that consecutive ones of a run can merge.
        if note.method == "chat.delta":
            ok = self.outbox.put_delta(note.params)
        else:
            ok = self.outbox.put(note.encode())
        if not ok:
            self.on_overflow()

    def send_frame(self, frame: bytes) -> None:
        """Queue a frame behind any pending events (the writer task sends it)."""
        if not self.outbox.put(frame):
            self.on_overflow()

    def on_overflow(self) -> None:
        if self._closing is None:
            log.warning("connection.slow_consumer", conn=self.id, pending=self.outbox.pending_bytes)
            self._closing = asyncio.get_running_loop().create_task(self._close_slow())

    async def _close_slow(self) -> None:
        # A peer that reads nothing cannot take the close frame either: websockets' close()
        # would wait in drain() forever, holding the connection and its buffers. So the
        # handshake gets server.close_timeout_s, then the TCP connection is dropped.
        try:
            async with asyncio.timeout(self.close_timeout_s):
                await self.ws.close(CLOSE_POLICY, "slow consumer")
        except TimeoutError:
            self.ws.transport.abort()

    async def reply(self, frame: bytes) -> None:
        """Send an RPC reply held in :attr:`budget` now, from the request's own task, and
        release it once the socket took it.

        Replies skip the outbox: a client that stops reading then blocks its own requests
        here, each holding an in-flight slot, so ``limits.max_inflight`` bounds them, and a
        fast client saves a task switch per request.

        They take turns: a reply is handed to the socket once the one before it has drained,
        so a client that stops reading leaves at most one reply copied into the transport's
        buffer, and the others wait here as the one copy the reply budget counts.
        """
        try:
            async with self._reply_turn:
                await self.ws.send(frame, text=True)
        except ConnectionClosed:
            pass
        finally:
            self.budget.release(len(frame))
