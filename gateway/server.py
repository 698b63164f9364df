"""The one module that touches ``websockets``: handshake checks, connections, shutdown.

Each connection task is wrapped once (STYLE 2): a crash is logged once with an error id, and
the connection is always deregistered in ``finally``. Requests run as tasks so a slow method
never blocks the reading of the next frame; replies and events leave through the
connection's :class:`~gateway.outbox.Outbox` and one writer task.
"""

from __future__ import annotations

import asyncio
import http
import ipaddress
import itertools
import ssl
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import structlog
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from gateway.auth import Authenticator
from gateway.config import Config
from gateway.errors import GatewayError, InvalidRequest, RateLimited, new_error_id
from gateway.hub import Hub
from gateway.outbox import Outbox
from gateway.rpc import RpcCore, error_response

__all__ = ["Connection", "GatewayServer"]

log = structlog.get_logger("recalld.server")

CLOSE_POLICY = 1008
_conn_ids = itertools.count(1)


class Connection:
    """One client: its identity, counters and outbox. Handlers see it as their context."""

    def __init__(self, server: GatewayServer, ws: ServerConnection, user: str | None) -> None:
        self.id = next(_conn_ids)
        self.server = server
        self.ws = ws
        self.user = user
        self.address = _address(ws)
        self.outbox = Outbox(server.config.limits.max_outbox_bytes)
        self.inflight = 0
        self.requests = 0
        self.errors = 0
        self.opened = time.monotonic()
        self._closing: asyncio.Task[None] | None = None

    @property
    def authenticated(self) -> bool:
        return self.user is not None

    @property
    def caller(self) -> str:
        """The authenticated user, for handlers: the RPC core refuses unauthenticated calls
        to every method that requires auth before a handler runs."""
        assert self.user is not None
        return self.user

    def on_overflow(self) -> None:
        if self._closing is None:
            log.warning("connection.slow_consumer", conn=self.id, pending=self.outbox.pending_bytes)
            self._closing = asyncio.get_running_loop().create_task(self._close_slow())

    async def _close_slow(self) -> None:
        # A peer that reads nothing cannot take the close frame either: websockets' close()
        # would wait in drain() forever, holding the connection and its buffers. So the
        # handshake gets server.close_timeout_s, then the TCP connection is dropped.
        try:
            async with asyncio.timeout(self.server.config.server.close_timeout_s):
                await self.ws.close(CLOSE_POLICY, "slow consumer")
        except TimeoutError:
            self.ws.transport.abort()

    def send_frame(self, frame: bytes) -> None:
        """Queue a frame behind any pending events (the writer task sends it)."""
        if not self.outbox.put(frame):
            self.on_overflow()

    async def reply(self, frame: bytes) -> None:
        """Send an RPC reply now, from the request's own task.

        Replies skip the outbox: a client that stops reading then blocks its own requests
        here, each holding an in-flight slot, so ``limits.max_inflight`` bounds them, and a
        fast client saves a task switch per request.
        """
        try:
            await self.ws.send(frame, text=True)
        except ConnectionClosed:
            pass


def _address(ws: ServerConnection) -> str:
    peer = ws.remote_address
    return str(peer[0]) if isinstance(peer, tuple) else str(peer)


class GatewayServer:
    """Owns the listening socket and every connection; ``close()`` is safe to call twice."""

    def __init__(
        self,
        config: Config,
        core: RpcCore,
        auth: Authenticator,
        hub: Hub,
        *,
        version: str,
        on_close: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.config = config
        self.core = core
        self.auth = auth
        self.hub = hub
        self.version = version
        self.started = time.monotonic()
        self.connections: set[Connection] = set()
        self._server: Server | None = None
        self._on_close = on_close
        self._closed = False
        self.port = 0

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        s = self.config.server
        ssl_ctx = None
        if self.config.tls.cert and self.config.tls.key:
            ssl_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ssl_ctx.load_cert_chain(self.config.tls.cert, self.config.tls.key)
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

    async def close(self) -> None:
        """Stop accepting, close connections 1001, then let the services drain."""
        if self._closed:
            return
        self._closed = True
        if self._server is not None:
            self._server.close(close_connections=True)
            await self._server.wait_closed()
        if self._on_close is not None:
            await self._on_close()
        log.info("gateway.closed")

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
        if path != "/":
            return _respond(ws, http.HTTPStatus.NOT_FOUND, "not found\n")
        origins = headers.get_all("Origin")
        if origins and (len(origins) > 1 or not self._origin_allowed(origins[0])):
            return _respond(ws, http.HTTPStatus.FORBIDDEN, "Origin not allowed\n")
        if len(self.connections) >= self.config.server.max_connections:
            return _respond(ws, http.HTTPStatus.SERVICE_UNAVAILABLE, "too many connections\n")
        authzs = headers.get_all("Authorization")
        authz = authzs[0] if len(authzs) == 1 else ("" if authzs else None)
        if authz is not None:
            scheme, _, token = authz.partition(" ")
            verdict = self.auth.check(token.strip() if scheme.lower() == "bearer" else None, _address(ws))
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

    def _origin_allowed(self, origin: str) -> bool:
        allowed = set(self.config.server.allowed_origins)
        for scheme in ("http", "https"):
            for name in ("localhost", "127.0.0.1", "[::1]"):
                allowed.add(f"{scheme}://{name}:{self.port}")
        return origin.rstrip("/") in allowed

    # -- connections ---------------------------------------------------------------------

    async def _handle(self, ws: ServerConnection) -> None:
        conn = Connection(self, ws, getattr(ws, "recalld_user", None))
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
            self.hub.drop(conn)
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
            first = True
            while not conn.authenticated:
                try:
                    async with asyncio.timeout_at(deadline):
                        data = await ws.recv()
                except TimeoutError:
                    log.info("auth.timeout")
                    await ws.close(CLOSE_POLICY, "authentication timeout")
                    return
                decoded, message = await self._decode_frame(conn, data)
                if decoded and first and _is_auth_frame(message):
                    if not await self._auth_frame(conn, message):
                        return
                    break
                first = False
                if decoded:
                    await self._answer(conn, message)
        ws.protocol.max_message_size = self.config.server.max_size
        async for data in ws:
            decoded, message = await self._decode_frame(conn, data)
            if not decoded:
                continue
            if self.core.runs_inline(message):
                await self._answer(conn, message)
                continue
            if conn.inflight >= self.config.limits.max_inflight:
                self._reject_busy(conn, message)
                continue
            conn.inflight += 1
            task = asyncio.create_task(self._run_message(conn, message))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

    async def _auth_frame(self, conn: Connection, msg: dict[str, Any]) -> bool:
        """Answer a first frame ``{"type":"auth","token":…}``; False when it failed (closed)."""
        token = msg.get("token")
        verdict = self.auth.check(token if isinstance(token, str) else None, conn.address)
        if verdict.ok:
            self.authenticate(conn, verdict.user or "default")
            await conn.reply(orjson.dumps({"type": "auth", "ok": True, "user": conn.user,
                                           "server": self.server_info()}))
            return True
        error = "too many failed attempts; retry later" if verdict.retry_after_s else "invalid token"
        log.info("auth.failed", via="frame", locked=bool(verdict.retry_after_s))
        await conn.reply(orjson.dumps({"type": "auth", "ok": False, "error": error}))
        await conn.ws.close(CLOSE_POLICY, "authentication failed")
        return False

    def authenticate(self, conn: Connection, user: str) -> None:
        conn.user = user
        structlog.contextvars.bind_contextvars(user=user)
        log.info("auth.ok")

    def server_info(self) -> dict[str, Any]:
        return {"name": "recalld", "version": self.version, "protocol": 1}

    def _reject_busy(self, conn: Connection, message: Any) -> None:
        req_id = message.get("id") if isinstance(message, dict) else None
        err = RateLimited(f"too many requests in flight (limit {self.config.limits.max_inflight})", 50)
        conn.errors += 1
        conn.send_frame(orjson.dumps(error_response(req_id, err.to_object())))

    async def _decode_frame(self, conn: Connection, data: str | bytes) -> tuple[bool, Any]:
        """(True, the frame's JSON value), or (False, None) once a -32700/-32600 went back."""
        conn.requests += 1
        try:
            if isinstance(data, bytes):
                raise InvalidRequest("invalid request: binary frames are not supported; send UTF-8 text")
            return True, RpcCore.decode(data)
        except GatewayError as exc:
            await self._send_reply(conn, orjson.dumps(error_response(None, exc.to_object())))
            return False, None

    async def _run_message(self, conn: Connection, message: Any) -> None:
        try:
            await self._answer(conn, message)
        finally:
            conn.inflight -= 1

    async def _answer(self, conn: Connection, message: Any) -> None:
        reply = await self.core.answer(message, conn)
        if reply is not None:
            await self._send_reply(conn, reply)

    @staticmethod
    async def _send_reply(conn: Connection, reply: bytes) -> None:
        if b'"error":{"code"' in reply:
            conn.errors += 1
        await conn.reply(reply)


def _is_auth_frame(message: Any) -> bool:
    return isinstance(message, dict) and message.get("type") == "auth"


def _respond(ws: ServerConnection, status: http.HTTPStatus, text: str) -> Response:
    resp = ws.respond(status, text)
    resp.headers["Cache-Control"] = "no-store"
    return resp

