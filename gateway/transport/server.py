"""The one module that owns the ``websockets`` server: handshake checks, read loops, shutdown.

Each connection task is wrapped once: a crash is logged once with an error id, and the
connection is always deregistered in ``finally``. Requests run as tasks so a slow method
never blocks the reading of the next frame; a call of a method that never waits on I/O is
answered in the read loop, and the replies to a burst of such calls leave in one socket write
(gateway.transport.writes). Replies go out from the request's task
(:meth:`Connection.reply`); events through the connection's outbox and one writer task.
"""

from __future__ import annotations

import asyncio
import http
import ssl
import time
import weakref
from collections.abc import Callable
from typing import Any

import orjson
import structlog
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from gateway.auth import Authenticator, bucket_of
from gateway.errors import InvalidRequest, RateLimited, new_error_id
from gateway.origins import host_allowed, origin_allowed
from gateway.rpc import Call, CallContext, Reply, RpcCore, UserBudgets
from gateway.transport.connection import CLOSE_POLICY, Connection, peer_address
from gateway.transport.guard import (
    AcceptErrorLog,
    PendingPool,
    SocketBudget,
    UserConnections,
    connection_budget,
    guarded_connection,
)
from gateway.transport.settings import ServerSettings
from gateway.transport.writes import HeldWrites
from gateway.web import StaticSite, is_websocket_upgrade
from gateway.wire import server_info

__all__ = ["GatewayServer"]

log = structlog.get_logger("recalld.server")

# TCP connections allowed beyond max_connections, so that an upgrade past the limit is still
# answered 503 rather than reset; they count against the descriptor budget too, which the /mcp
# listener's sockets share (SocketBudget).
_HANDSHAKE_SLACK = 32
_ACCEPT_LOG_INTERVAL_S = 10.0


class GatewayServer:
    """Owns the listening socket and every connection; ``close()`` is safe to call twice.

    Takes the limits it enforces as one :class:`ServerSettings`, its fields named as their
    settings are (``[server]``, ``[auth]``, ``[limits]``), the way uvicorn's ``Server(config)``
    takes its ``Config``.
    """

    def __init__(
        self,
        core: RpcCore,
        auth: Authenticator,
        settings: ServerSettings,
        *,
        version: str,
        ssl_context: ssl.SSLContext | None,
        on_disconnect: Callable[[CallContext], None] = lambda conn: None,
        unready: Callable[[], str | None] = lambda: None,
    ) -> None:
        self.core = core
        self.unready = unready  # why GET /readyz answers 503 now (gateway.readiness), or None
        self.auth = auth
        self.version = version
        self.settings = settings
        self.host = settings.host
        self._ssl = ssl_context
        self._allowed_hosts = frozenset(h.lower() for h in settings.allowed_hosts)
        self._allowed_origins = frozenset(o.rstrip("/").lower() for o in settings.allowed_origins)
        self.max_size = settings.max_size
        self.close_timeout_s = settings.close_timeout_s
        self.auth_timeout_s = settings.auth_timeout_s
        self.preauth_max_size = settings.preauth_max_size
        # Connections not authenticated yet hold places here, not only among max_connections.
        self.pending = PendingPool(settings.max_pending, settings.max_pending_per_address)
        self.max_inflight = settings.max_inflight
        self.max_reply_bytes = settings.max_reply_bytes
        # A user's connections together hold at most this (never less than one connection may).
        self.user_budgets = UserBudgets(max(settings.max_user_reply_bytes,
                                            settings.max_reply_bytes))
        self.max_outbox_bytes = settings.max_outbox_bytes
        self.max_control_frames_per_s = settings.max_control_frames_per_s
        self.started = time.monotonic()
        self.connections: set[Connection] = set()
        self._server: Server | None = None
        # Called once per closed connection (the hub forgets its subscriptions).
        self._on_disconnect = on_disconnect
        # The user an Authorization header authenticated, from the handshake to the handler.
        self._header_users: weakref.WeakKeyDictionary[ServerConnection, str] = \
            weakref.WeakKeyDictionary()
        # The client token (name, read-only) of an upgrade that signed in with one.
        self._header_clients: weakref.WeakKeyDictionary[ServerConnection, tuple[str, bool]] = \
            weakref.WeakKeyDictionary()
        self._closed = False
        self.port = 0
        self.scheme = "ws"
        # The web client's files (gateway/web), answered for plain GETs on this same port.
        self.site = StaticSite.from_package()
        # As configured, lowered to fit the fd limit (logged by start()).
        self.max_connections = connection_budget(settings.max_connections,
                                                 settings.reserved_fds + _HANDSHAKE_SLACK)
        # Every TCP socket of this port and of the /mcp listener (gateway.mcp.http) counts here.
        self.sockets = SocketBudget(self.max_connections + _HANDSHAKE_SLACK,
                                    settings.header_timeout_s)
        self.users = UserConnections(min(settings.max_connections_per_user, self.max_connections))
        self._accept_log = AcceptErrorLog(_ACCEPT_LOG_INTERVAL_S)

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        settings = self.settings
        configured = settings.max_connections
        if self.max_connections < configured:
            log.warning("server.max_connections_lowered", configured=configured,
                        effective=self.max_connections, reserved_fds=settings.reserved_fds)
        self._accept_log.install(asyncio.get_running_loop())
        self._server = await serve(
            self._handle,
            self.host,
            settings.port,
            ssl=self._ssl,
            process_request=self._process_request,
            compression=None,
            max_size=self.max_size,
            max_queue=settings.max_queue,
            write_limit=settings.write_limit,
            open_timeout=settings.open_timeout_s,
            ping_interval=settings.ping_interval_s or None,
            ping_timeout=settings.ping_timeout_s or None,
            close_timeout=self.close_timeout_s,
            server_header=None,
            create_connection=guarded_connection(
                max_control_per_s=self.max_control_frames_per_s,
                sockets=self.sockets,
                pending=self.pending,
                users=self.users,
            ),
        )
        self.port = next(iter(self._server.sockets)).getsockname()[1]
        self.scheme = "wss" if self._ssl else "ws"
        log.info("gateway.listening", url=f"{self.scheme}://{self.host}:{self.port}/",
                 port=self.port)

    @property
    def url(self) -> str:
        host = self.host
        if ":" in host:
            host = f"[{host}]"
        return f"{self.scheme}://{host}:{self.port}/"

    @property
    def connection_count(self) -> int:
        return len(self.connections)

    async def close(self) -> None:
        """Stop accepting and close connections 1001; the app drains the services after."""
        if self._closed:
            return
        self._closed = True
        if self._server is not None:
            self._server.close(close_connections=True)
            # No request from them to answer; websockets would wait out their handshake.
            self.sockets.drop_waiting()
            await self._server.wait_closed()
        # What websockets' close did not wait for: a socket accepted as it ran (asyncio 3.11
        # does not close accepted connections), aborted now, and any admitted later at once.
        aborted = self.sockets.shut()
        await asyncio.sleep(0)  # their connection_lost closes the descriptors
        self._accept_log.uninstall(asyncio.get_running_loop())
        log.info("gateway.closed", aborted_sockets=aborted)

    @property
    def refused_sockets(self) -> int:
        """TCP connections closed unread because the descriptor budget was full (both ports)."""
        return self.sockets.refused

    # -- handshake -----------------------------------------------------------------------

    def _process_request(self, ws: ServerConnection, request: Request) -> Response | None:
        headers = request.headers
        path = request.path.split("?", 1)[0]
        hosts = headers.get_all("Host")
        if len(hosts) != 1:
            return _respond(ws, http.HTTPStatus.BAD_REQUEST,
                            "exactly one Host header is required\n")
        if not self._host_allowed(hosts[0]):
            return _respond(ws, http.HTTPStatus.MISDIRECTED_REQUEST, "Host not allowed\n")
        if path == "/healthz":
            return _respond(ws, http.HTTPStatus.OK, "ok\n")
        if path == "/readyz":  # no details without auth: the reason is in gateway.health
            if self.unready() is None:
                return _respond(ws, http.HTTPStatus.OK, "ready\n")
            return _respond(ws, http.HTTPStatus.SERVICE_UNAVAILABLE, "not ready\n")
        if not is_websocket_upgrade(request):
            return self.site.respond(request)  # the web client's page and files; 404 otherwise
        if path != "/":
            return _respond(ws, http.HTTPStatus.NOT_FOUND, "not found\n")
        origins = headers.get_all("Origin")
        if origins and (len(origins) > 1 or not self._origin_allowed(origins[0], hosts[0])):
            return _respond(ws, http.HTTPStatus.FORBIDDEN, "Origin not allowed\n")
        if len(self.connections) >= self.max_connections:
            return _respond(ws, http.HTTPStatus.SERVICE_UNAVAILABLE, "too many connections\n")
        authzs = headers.get_all("Authorization")
        authz = authzs[0] if len(authzs) == 1 else ("" if authzs else None)
        if authz is not None:
            scheme, _, token = authz.partition(" ")
            verdict = self.auth.check(token.strip() if scheme.lower() == "bearer" else None,
                                      peer_address(ws))
            if not verdict.ok:
                if verdict.retry_after_s:
                    resp = _respond(ws, http.HTTPStatus.TOO_MANY_REQUESTS,
                                    "too many failed attempts\n")
                    resp.headers["Retry-After"] = str(int(verdict.retry_after_s) + 1)
                    return resp
                resp = _respond(ws, http.HTTPStatus.UNAUTHORIZED, "invalid token\n")
                resp.headers["WWW-Authenticate"] = 'Bearer realm="recalld"'
                return resp
            user: str | None = verdict.user or "default"
            if verdict.client is not None:
                self._header_clients[ws] = (verdict.client, verdict.read_only)
        else:
            user = "default" if self.auth.mode == "none" else None
        if user is not None:
            refusal = self.users.refusal(user)
            if refusal is not None:
                resp = _respond(ws, http.HTTPStatus.SERVICE_UNAVAILABLE, refusal + "\n")
                resp.headers["Retry-After"] = "1"
                return resp
            self.users.enter(ws, user)
            self._header_users[ws] = user
        else:
            bucket = bucket_of(peer_address(ws))
            refusal = self.pending.refusal(bucket)
            if refusal is not None:
                resp = _respond(ws, http.HTTPStatus.SERVICE_UNAVAILABLE, refusal + "\n")
                resp.headers["Retry-After"] = str(max(1, int(self.auth_timeout_s)))
                return resp
            self.pending.enter(ws, bucket)
        return None

    def _host_allowed(self, host_header: str) -> bool:
        return host_allowed(host_header, self.host, self._allowed_hosts)

    def _origin_allowed(self, origin: str, host_header: str) -> bool:
        return origin_allowed(origin, host_header, port=self.port,
                              page_scheme="https" if self.scheme == "wss" else "http",
                              allowed_origins=self._allowed_origins)

    # -- connections ---------------------------------------------------------------------

    async def _handle(self, ws: ServerConnection) -> None:
        client, read_only = self._header_clients.pop(ws, (None, False))
        conn = Connection(ws, self._header_users.pop(ws, None), client=client, read_only=read_only,
                          max_outbox_bytes=self.max_outbox_bytes,
                          max_reply_bytes=self.max_reply_bytes,
                          close_timeout_s=self.close_timeout_s, user_budgets=self.user_budgets,
                          user_connections=self.users)
        self.connections.add(conn)
        structlog.contextvars.bind_contextvars(conn=conn.id, user=conn.user)
        log.info("connection.open", address=conn.address, authenticated=conn.authenticated)
        writer = asyncio.create_task(self._write_loop(conn))
        tasks: set[asyncio.Task[None]] = set()
        close_reason = "closed"
        try:
            await self._read_loop(conn, tasks)
        except ConnectionClosed as exc:
            close_reason = f"{exc.rcvd.code if exc.rcvd else 'no close frame'}"
        except Exception:
            log.exception("connection.crash", error_id=new_error_id())
            close_reason = "crash"
            await ws.close(1011, "internal error")
        finally:
            for t in tasks:
                t.cancel()
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)
            writer.cancel()
            await asyncio.gather(writer, return_exceptions=True)
            self._on_disconnect(conn)
            conn.leave_budgets()
            self.connections.discard(conn)
            log.info(
                "connection.close",
                reason=close_reason,
                requests=conn.requests,
                errors=conn.errors,
                coalesced=conn.outbox.coalesced,
                duration_s=round(time.monotonic() - conn.opened, 3),
            )
            structlog.contextvars.clear_contextvars()

    async def _write_loop(self, conn: Connection) -> None:
        try:
            while True:
                frame = await conn.outbox.get()
                await conn.ws.send(frame, text=True)
        except ConnectionClosed:
            pass

    async def _read_loop(self, conn: Connection, tasks: set[asyncio.Task[None]]) -> None:
        """The connection's one read loop. Until the connection is authenticated (by its
        Authorization header, an auth frame or the ``auth`` method: each sets ``conn.user``)
        frames are smaller and run one at a time, and ``auth.timeout_s`` bounds the wait."""
        ws = conn.ws
        # The server's connections hold the replies of a burst for one write (HeldWrites).
        held = ws if isinstance(ws, HeldWrites) else None
        budget = conn.budget
        pending_auth = not conn.authenticated
        deadline = asyncio.get_running_loop().time() + self.auth_timeout_s if pending_auth else None
        if pending_auth:
            ws.protocol.max_message_size = self.preauth_max_size
        try:
            async with asyncio.timeout_at(deadline) as auth_deadline:
                async for data in ws:
                    conn.requests += 1
                    if isinstance(data, bytes):
                        await self._send(conn, self.core.refuse(None, _BINARY, budget))
                        continue
                    call = self.core.accept(data, conn)
                    if pending_auth:
                        # Honoured at any time before authentication, not only as the first
                        # frame: a client may well have tried a request first and been told to.
                        if _is_auth_frame(call.message):
                            if not await self._auth_frame(conn, call.message):
                                return
                        else:
                            await self._send(conn, await call.run(budget))
                        if conn.authenticated:
                            pending_auth = False
                            self.pending.leave(ws)
                            auth_deadline.reschedule(None)
                            ws.protocol.max_message_size = self.max_size
                        continue
                    if call.inline:
                        reply = await call.run(budget)
                        if reply is None:
                            continue
                        if reply.is_error:
                            conn.errors += 1
                        if held is not None and held.send_reply(reply.data):
                            budget.release(len(reply.data))
                        else:
                            await conn.reply(reply.data)  # waits for a slow reader,
                                                          # or the connection closed
                        continue
                    self._start_call(conn, call, tasks)
        except TimeoutError:
            if not auth_deadline.expired():
                raise
            log.info("auth.timeout")
            await ws.close(CLOSE_POLICY, "authentication timeout")

    def _start_call(self, conn: Connection, call: Call, tasks: set[asyncio.Task[None]]) -> None:
        # A batch runs its entries at once, so it holds a slot per entry (up to the whole
        # limit: a batch larger than the limit may run on an otherwise idle connection).
        max_inflight = self.max_inflight
        weight = (min(len(call.message), max_inflight)
                  if isinstance(call.message, list) and call.message else 1)
        if conn.inflight + weight > max_inflight:
            busy = RateLimited(f"too many requests in flight (limit {max_inflight})", 50)
            conn.errors += 1
            # Queued behind events, not sent from here: the read loop must not block on
            # a client that is not reading.
            conn.send_frame(self.core.refuse(call.message, busy).data)
            return
        conn.inflight += weight
        task = asyncio.create_task(self._run_call(conn, call, weight))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    async def _auth_frame(self, conn: Connection, msg: dict[str, Any]) -> bool:
        """Answer a frame ``{"type":"auth","token":…}``; False when it failed (closed)."""
        token = msg.get("token")
        verdict = self.auth.check(token if isinstance(token, str) else None, conn.address)
        if verdict.ok:
            try:
                conn.authenticate(verdict.user or "default", verdict.client, verdict.read_only)
            except RateLimited as exc:  # server.max_connections_per_user
                await self._send_own(conn,
                                     orjson.dumps({"type": "auth", "ok": False, "error": str(exc)}))
                await conn.ws.close(CLOSE_POLICY, "too many connections for this user")
                return False
            await self._send_own(conn, orjson.dumps({"type": "auth", "ok": True, "user": conn.user,
                                                     "server": server_info(self.version)}))
            return True
        error = ("too many failed attempts; retry later" if verdict.retry_after_s
                 else "invalid token")
        log.info("auth.failed", via="frame", locked=bool(verdict.retry_after_s))
        await self._send_own(conn, orjson.dumps({"type": "auth", "ok": False, "error": error}))
        await conn.ws.close(CLOSE_POLICY, "authentication failed")
        return False

    async def _run_call(self, conn: Connection, call: Call, weight: int) -> None:
        try:
            await self._send(conn, await call.run(conn.budget))
        finally:
            conn.inflight -= weight

    async def _send(self, conn: Connection, reply: Reply | None) -> None:
        """Send a reply the core built and held in the connection's budget."""
        if reply is not None:
            if reply.is_error:
                conn.errors += 1
            await conn.reply(reply.data)

    async def _send_own(self, conn: Connection, frame: bytes) -> None:
        """Send a frame of the transport's own (an auth frame's answer) like a reply."""
        conn.budget.hold(len(frame))
        await conn.reply(frame)


_BINARY = InvalidRequest("invalid request: binary frames are not supported; send UTF-8 text")


def _is_auth_frame(message: Any) -> bool:
    return isinstance(message, dict) and message.get("type") == "auth"


def _respond(ws: ServerConnection, status: http.HTTPStatus, text: str) -> Response:
    resp = ws.respond(status, text)
    resp.headers["Cache-Control"] = "no-store"
    return resp

