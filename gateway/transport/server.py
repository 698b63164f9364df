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
import ipaddress
import ssl
import time
from collections.abc import Callable
from typing import Any

import orjson
import structlog
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from gateway.auth import Authenticator
from gateway.config import Config
from gateway.errors import InvalidRequest, RateLimited, new_error_id
from gateway.rpc import Call, CallContext, Reply, ReplyBudget, RpcCore, over_budget
from gateway.transport.connection import CLOSE_POLICY, Connection, peer_address
from gateway.transport.guard import AcceptErrorLog, connection_budget, guarded_connection
from gateway.transport.writes import HeldWrites
from gateway.web import StaticSite, is_websocket_upgrade
from gateway.wire import server_info

__all__ = ["GatewayServer"]

log = structlog.get_logger("recalld.server")

# TCP connections allowed beyond max_connections, so that an upgrade past the limit is still
# answered 503 rather than reset; they count against the descriptor budget too.
_HANDSHAKE_SLACK = 32
_ACCEPT_LOG_INTERVAL_S = 10.0


class GatewayServer:
    """Owns the listening socket and every connection; ``close()`` is safe to call twice."""

    def __init__(
        self,
        config: Config,
        core: RpcCore,
        auth: Authenticator,
        *,
        version: str,
        on_disconnect: Callable[[CallContext], None] = lambda conn: None,
    ) -> None:
        self.config = config
        self.core = core
        self.auth = auth
        self.version = version
        self.started = time.monotonic()
        self.connections: set[Connection] = set()
        self._server: Server | None = None
        # Called once per closed connection (the hub forgets its subscriptions).
        self._on_disconnect = on_disconnect
        self._closed = False
        self.port = 0
        self.scheme = "ws"
        # The web client's files (gateway/web), answered for plain GETs on this same port.
        self.site = StaticSite.from_package()
        self.max_connections = config.server.max_connections
        self.refused_sockets = 0
        self._accept_log = AcceptErrorLog(_ACCEPT_LOG_INTERVAL_S)

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        s = self.config.server
        ssl_ctx = None
        if self.config.tls.cert and self.config.tls.key:
            ssl_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ssl_ctx.load_cert_chain(self.config.tls.cert, self.config.tls.key)
        self.max_connections = connection_budget(s.max_connections, s.reserved_fds + _HANDSHAKE_SLACK)
        if self.max_connections < s.max_connections:
            log.warning("server.max_connections_lowered", configured=s.max_connections,
                        effective=self.max_connections, reserved_fds=s.reserved_fds)
        self._accept_log.install(asyncio.get_running_loop())
        self._server = await serve(
            self._handle,
            s.host,
            s.port,
            ssl=ssl_ctx,
            process_request=self._process_request,
            compression=None,
            max_size=s.max_size,
            max_queue=s.max_queue,
            write_limit=s.write_limit,
            open_timeout=s.open_timeout_s,
            ping_interval=s.ping_interval_s or None,
            ping_timeout=s.ping_timeout_s or None,
            close_timeout=s.close_timeout_s,
            server_header=None,
            create_connection=guarded_connection(
                max_control_per_s=self.config.limits.max_control_frames_per_s,
                max_sockets=self.max_connections + _HANDSHAKE_SLACK,
                on_refused=self._count_refused,
            ),
        )
        self.port = next(iter(self._server.sockets)).getsockname()[1]
        self.scheme = "wss" if ssl_ctx else "ws"
        log.info("gateway.listening", url=f"{self.scheme}://{s.host}:{self.port}/", port=self.port)

    @property
    def url(self) -> str:
        host = self.config.server.host
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
            await self._server.wait_closed()
        self._accept_log.uninstall(asyncio.get_running_loop())
        log.info("gateway.closed")

    def _count_refused(self) -> None:
        self.refused_sockets += 1

    # -- handshake -----------------------------------------------------------------------

    def _process_request(self, ws: ServerConnection, request: Request) -> Response | None:
        headers = request.headers
        path = request.path.split("?", 1)[0]
        hosts = headers.get_all("Host")
        if len(hosts) != 1:
            return _respond(ws, http.HTTPStatus.BAD_REQUEST, "exactly one Host header is required\n")
        if not self._host_allowed(hosts[0]):
            return _respond(ws, http.HTTPStatus.MISDIRECTED_REQUEST, "Host not allowed\n")
        if path == "/healthz":
            return _respond(ws, http.HTTPStatus.OK, "ok\n")
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
            verdict = self.auth.check(token.strip() if scheme.lower() == "bearer" else None, peer_address(ws))
            if not verdict.ok:
                if verdict.retry_after_s:
                    resp = _respond(ws, http.HTTPStatus.TOO_MANY_REQUESTS, "too many failed attempts\n")
                    resp.headers["Retry-After"] = str(int(verdict.retry_after_s) + 1)
                    return resp
                resp = _respond(ws, http.HTTPStatus.UNAUTHORIZED, "invalid token\n")
                resp.headers["WWW-Authenticate"] = 'Bearer realm="recalld"'
                return resp
            ws.recalld_user = verdict.user  # type: ignore[attr-defined]
        elif self.auth.mode == "none":
            ws.recalld_user = "default"  # type: ignore[attr-defined]
        return None

    def _host_allowed(self, host_header: str) -> bool:
        host = host_header.strip().lower()
        if host.startswith("["):
            host = host[1 : host.find("]")] if "]" in host else host
        elif host.count(":") == 1:
            host = host.rsplit(":", 1)[0]
        if not host:
            return False
        bound = self.config.server.host.lower()
        if host in ("localhost", bound) or host in (h.lower() for h in self.config.server.allowed_hosts):
            return True
        try:
            # An IP literal cannot be a DNS-rebinding name: only names are refused.
            ipaddress.ip_address(host)
            return True
        except ValueError:
            return False

    def _origin_allowed(self, origin: str, host_header: str) -> bool:
        allowed = {o.rstrip("/").lower() for o in self.config.server.allowed_origins}
        for scheme in ("http", "https"):
            for name in ("localhost", "127.0.0.1", "[::1]"):
                allowed.add(f"{scheme}://{name}:{self.port}")
        # The page this server served, from whatever address it was opened at (a LAN IP, an
        # allowed host name): its Origin is exactly our scheme plus the Host header, which has
        # already passed the Host check, so a rebinding name or a foreign site never matches.
        page_scheme = "https" if self.scheme == "wss" else "http"
        allowed.add(f"{page_scheme}://{host_header.strip().lower()}")
        return origin.rstrip("/").lower() in allowed

    # -- connections ---------------------------------------------------------------------

    async def _handle(self, ws: ServerConnection) -> None:
        conn = Connection(ws, getattr(ws, "recalld_user", None),
                          max_outbox_bytes=self.config.limits.max_outbox_bytes,
                          close_timeout_s=self.config.server.close_timeout_s)
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
        ws = conn.ws
        auth_cfg = self.config.auth
        if not conn.authenticated:
            ws.protocol.max_message_size = auth_cfg.preauth_max_size
            deadline = asyncio.get_running_loop().time() + auth_cfg.timeout_s
            while not conn.authenticated:
                try:
                    async with asyncio.timeout_at(deadline):
                        data = await ws.recv()
                except TimeoutError:
                    log.info("auth.timeout")
                    await ws.close(CLOSE_POLICY, "authentication timeout")
                    return
                conn.requests += 1
                if isinstance(data, bytes):
                    await self._send(conn, None, self.core.refuse(None, _BINARY))
                    continue
                call = self.core.accept(data, conn)
                # Honoured at any time before authentication, not only as the first frame:
                # a client may well have tried a request first and been told to authenticate.
                if _is_auth_frame(call.message):
                    if not await self._auth_frame(conn, call.message):
                        return
                    break
                await self._send(conn, call.message, await call.run(self._budget(conn)))
        ws.protocol.max_message_size = self.config.server.max_size
        max_inflight = self.config.limits.max_inflight
        # The server's connections hold the replies of a burst for one write (HeldWrites).
        held = ws if isinstance(ws, HeldWrites) else None
        async for data in ws:
            conn.requests += 1
            if isinstance(data, bytes):
                await self._send(conn, None, self.core.refuse(None, _BINARY))
                continue
            call = self.core.accept(data, conn)
            if call.inline:
                reply = await call.run()  # a single call: the transport measures its reply
                if reply is None:
                    continue
                frame = self._within_budget(conn, call.message, reply)
                if held is None or not held.send_reply(frame):
                    await conn.reply(frame)  # waits for a slow reader, or the connection closed
                continue
            # A batch runs its entries at once, so it holds a slot per entry (up to the whole
            # limit: a batch larger than the limit may run on an otherwise idle connection).
            weight = min(len(call.message), max_inflight) if isinstance(call.message, list) and call.message else 1
            if conn.inflight + weight > max_inflight:
                busy = RateLimited(f"too many requests in flight (limit {max_inflight})", 50)
                conn.errors += 1
                # Queued behind events, not sent from here: the read loop must not block on
                # a client that is not reading.
                conn.send_frame(self.core.refuse(call.message, busy).data)
                continue
            conn.inflight += weight
            task = asyncio.create_task(self._run_call(conn, call, weight))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

    async def _auth_frame(self, conn: Connection, msg: dict[str, Any]) -> bool:
        """Answer a first frame ``{"type":"auth","token":…}``; False when it failed (closed)."""
        token = msg.get("token")
        verdict = self.auth.check(token if isinstance(token, str) else None, conn.address)
        if verdict.ok:
            conn.authenticate(verdict.user or "default")
            await conn.reply(orjson.dumps({"type": "auth", "ok": True, "user": conn.user,
                                           "server": server_info(self.version)}))
            return True
        error = "too many failed attempts; retry later" if verdict.retry_after_s else "invalid token"
        log.info("auth.failed", via="frame", locked=bool(verdict.retry_after_s))
        await conn.reply(orjson.dumps({"type": "auth", "ok": False, "error": error}))
        await conn.ws.close(CLOSE_POLICY, "authentication failed")
        return False

    async def _run_call(self, conn: Connection, call: Call, weight: int) -> None:
        try:
            # Only a batch runs within a budget; a single reply is measured when it is sent.
            budget = self._budget(conn) if isinstance(call.message, list) else None
            await self._send(conn, call.message, await call.run(budget))
        finally:
            conn.inflight -= weight

    async def _send(self, conn: Connection, message: Any, reply: Reply | None) -> None:
        if reply is not None:
            await conn.reply(self._within_budget(conn, message, reply))

    def _budget(self, conn: Connection) -> ReplyBudget:
        """What a reply may take now: a batch runs its entries within it (gateway.rpc.batch)."""
        return ReplyBudget(self.config.limits.max_reply_bytes, conn.reply_bytes)

    def _within_budget(self, conn: Connection, message: Any, reply: Reply) -> bytes:
        """The frame to send for ``reply``: itself, or the refusal when it would take the
        connection past ``limits.max_reply_bytes``. Not a coroutine: the read loop calls it for
        every inline call, and a coroutine frame per reply is a measurable part of a cheap call."""
        limit = self.config.limits.max_reply_bytes
        size = len(reply.data)
        if size > limit - conn.reply_bytes:
            # Refused after it was built (its size is known only then), but never held: what a
            # connection keeps waiting for its reader stays under the budget.
            reply = self.core.refuse(message, over_budget(size, conn.reply_bytes, limit))
        if reply.is_error:
            conn.errors += 1
        return reply.data


_BINARY = InvalidRequest("invalid request: binary frames are not supported; send UTF-8 text")


def _is_auth_frame(message: Any) -> bool:
    return isinstance(message, dict) and message.get("type") == "auth"


def _respond(ws: ServerConnection, status: http.HTTPStatus, text: str) -> Response:
    resp = ws.respond(status, text)
    resp.headers["Cache-Control"] = "no-store"
    return resp

