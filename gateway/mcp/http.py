"""Streamable HTTP at ``/mcp`` on its own listener (``[mcp] port``), behind the gateway's tokens.

websockets' server takes no request bodies, so MCP's POSTs cannot share the gateway's port;
this listener runs the SDK's streamable HTTP transport under uvicorn on ``server.host``, with
the gateway's ``[tls]``. In front of it, the rules the gateway's handshake has: exactly one
``Host``, a foreign DNS name → 421; a browser ``Origin`` not allowed → 403; no bearer token →
401, a wrong one → 401 (429 while locked out), counted by the daemon's own failure limiter
against the real peer address. Each request's token is then the token of every daemon
connection its tools open, so a second user's token sees only that user's memory.

The transport is stateless (a fresh MCP server per request, JSON answers): nothing of one
request, its token least of all, outlives it. So there is nothing to stream: ``GET /mcp`` (the
optional SSE stream of server-initiated messages) answers 405, as the MCP spec allows, rather
than hold a socket open for ever.

Its sockets count in the gateway's descriptor budget (:class:`SocketBudget`, fitted to the
open-file limit), with the gateway's ``server.header_timeout_s``: a request whose headers are
not in within it is closed, also between the requests of a kept-alive connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import socket
import ssl
from collections.abc import AsyncIterator
from typing import Protocol

import h11
import structlog
import uvicorn
from mcp.server.transport_security import TransportSecuritySettings
from starlette.datastructures import Headers
from starlette.responses import PlainTextResponse
from starlette.types import Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from gateway.config import Config
from gateway.errors import RateLimited
from gateway.mcp.link import DaemonLink, Route
from gateway.mcp.tools import build_server
from gateway.origins import host_allowed, origin_allowed
from gateway.rpc import ByteRate
from gateway.transport.guard import SocketBudget

__all__ = ["MCP_PATH", "McpHttpServer", "TokenCheck"]

log = structlog.get_logger("recalld.mcp")

MCP_PATH = "/mcp"
# The longest a request waits for its bytes to fit in its user's rate before it gets a 429.
PACE_LIMIT_S = 30.0

# The token of the HTTP request being served: a stateless request runs its MCP server in
# tasks started from the request's own context, so its tools read this request's token.
_request_token: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "recalld_mcp_token", default=None)


class TokenVerdict(Protocol):
    """What this listener reads of the daemon's :class:`gateway.auth.Verdict`."""

    @property
    def ok(self) -> bool: ...
    @property
    def retry_after_s(self) -> float: ...
    @property
    def user(self) -> str | None: ...


class TokenCheck(Protocol):
    """The daemon's :class:`gateway.auth.Authenticator`, as this listener uses it."""

    def check(self, token: str | None, address: str) -> TokenVerdict: ...


class McpHttpServer:
    """``await start()`` binds and serves; ``await close()`` (safe twice) stops accepting,
    lets requests being answered finish within ``server.shutdown_grace_s``, then stops."""

    def __init__(self, config: Config, tokens: TokenCheck, *, daemon_url: str, version: str,
                 sockets: SocketBudget) -> None:
        self.config = config
        self.tokens = tokens
        tls = config.tls
        self.scheme = "https" if tls.cert else "http"
        trust = _loopback_ssl(config)
        link = DaemonLink(lambda: Route(daemon_url, _request_token.get(), trust))
        self._mcp = build_server(link, version=version)
        # Host and Origin are checked in front (the gateway's rules), so the SDK's own check,
        # with its fixed list of names, is off.
        self._app = self._mcp.streamable_http_app(
            streamable_http_path=MCP_PATH, json_response=True, stateless_http=True,
            # 413 unread
            max_request_body_size=min(config.mcp.max_request_bytes, config.server.max_size),
            transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        )
        self._uvicorn = uvicorn.Server(uvicorn.Config(
            self._asgi, interface="asgi3", lifespan="off", log_config=None, access_log=False,
            server_header=False,
            # X-Forwarded-For from loopback would let any local process pick the address its
            # failed tokens are counted against: the peer is the socket's, as on the gateway.
            proxy_headers=False,
            ssl_certfile=tls.cert, ssl_keyfile=tls.key,
            # The gateway's socket budget bounds the connections (and so the requests: h11 serves
            # one at a time per connection); uvicorn's own limit_concurrency would count the
            # sockets a slowloris holds and answer every legitimate request 503.
            http=_guarded_h11(sockets),
            timeout_graceful_shutdown=max(1, int(config.server.shutdown_grace_s)),
        ))
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self.port = 0
        # Each user's requests in flight and body bytes a minute (the SDK parses a body on the
        # event loop, outside the gateway's per-user fairness): a waiting request's body stays
        # unread in its socket, one over the rate is refused unread.
        self._body_limit = min(config.mcp.max_request_bytes, config.server.max_size)
        self._places = _Places(config.mcp.max_requests_per_user)
        self._bytes = ByteRate(config.mcp.request_bytes_per_minute, "mcp.request_bytes_per_minute",
                               largest=self._body_limit)

    @property
    def url(self) -> str:
        host = self.config.server.host
        return f"{self.scheme}://{f'[{host}]' if ':' in host else host}:{self.port}{MCP_PATH}"

    async def start(self) -> None:
        host, port = self.config.server.host, self.config.mcp.port
        try:
            # Bound here, not by uvicorn, whose own bind ends the process on an error.
            sock = socket.create_server((host, port),
                                        family=socket.AF_INET6 if ":" in host else socket.AF_INET)
        except OSError as exc:
            raise OSError(exc.errno, f"[mcp] port {port} on {host}: {exc.strerror}") from None
        self.port = sock.getsockname()[1]
        # What uvicorn's own serve() does first, without its signal handlers: the daemon's
        # SIGINT/SIGTERM handlers must stay the daemon's.
        self._uvicorn.config.load()
        self._uvicorn.lifespan = self._uvicorn.config.lifespan_class(self._uvicorn.config)
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._serve(sock, ready))
        await asyncio.wait([ready, self._task], return_when=asyncio.FIRST_COMPLETED)
        if not ready.done():
            sock.close()
            await self._task  # raises what stopped it
        log.info("mcp.listening", url=self.url, port=self.port)

    async def _serve(self, sock: socket.socket, ready: asyncio.Future[None]) -> None:
        try:
            async with self._mcp.session_manager.run():
                await self._uvicorn.startup(sockets=[sock])
                ready.set_result(None)
                await self._uvicorn.main_loop()
                await self._uvicorn.shutdown(sockets=[sock])
        finally:
            sock.close()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._uvicorn.should_exit = True
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
        log.info("mcp.closed")

    # -- the guard in front of the SDK's transport ---------------------------------------

    async def _asgi(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        if scope["method"] == "GET" and scope["path"].rstrip("/") == MCP_PATH:
            # Stateless: no session, so no server-initiated message would ever go down the
            # stream; an open one would only hold a descriptor.
            await PlainTextResponse("no SSE stream: this server is stateless (use POST)\n", 405,
                                    headers={"Allow": "POST"})(scope, receive, send)
            return
        admitted = self._admit(scope)
        if not isinstance(admitted, str):
            await admitted(scope, receive, send)
            return
        headers = Headers(scope=scope)
        declared = headers.get("content-length", "")
        # Charged before the body is read: what it says it is, else as much as it may be; one
        # that says it is too big costs nothing (the SDK answers 413 without reading it).
        size = int(declared) if declared.isdigit() else self._body_limit
        token = _bearer(headers)
        reset = _request_token.set(token)
        try:
            async with self._places.of(admitted):
                refusal = await self._paced(admitted, size) if size <= self._body_limit else None
                await (refusal or self._app)(scope, receive, send)
        finally:
            _request_token.reset(reset)

    async def _paced(self, user: str, size: int) -> PlainTextResponse | None:
        """Wait, holding the request's place and leaving its body unread, until ``size`` bytes
        fit in the user's ``mcp.request_bytes_per_minute``; a 429 when that would be longer than
        PACE_LIMIT_S. Pacing rather than refusing at once: a refused client retries at once,
        and a flood of cheap refusals costs the loop what the bodies did."""
        waited = 0.0
        while True:
            try:
                self._bytes.take(user, size)
                return None
            except RateLimited as exc:
                wait_s = exc.retry_after_ms / 1000
                if waited + wait_s > PACE_LIMIT_S:
                    return PlainTextResponse(
                        "too many request bytes for this user "
                        f"({self.config.mcp.request_bytes_per_minute} a minute, "
                        f"mcp.request_bytes_per_minute); retry in {exc.retry_after_ms} ms\n", 429,
                        headers={"Retry-After": str(exc.retry_after_ms // 1000 + 1)})
                await asyncio.sleep(wait_s)
                waited += wait_s

    def _admit(self, scope: Scope) -> PlainTextResponse | str:
        """The refusal of a request, or the user it is served as."""
        headers = Headers(scope=scope)
        if scope["path"].rstrip("/") != MCP_PATH:
            return PlainTextResponse("not found\n", 404)
        hosts = headers.getlist("host")
        if len(hosts) != 1:
            return PlainTextResponse("exactly one Host header is required\n", 400)
        if not self._host_allowed(hosts[0]):
            return PlainTextResponse("Host not allowed\n", 421)
        origins = headers.getlist("origin")
        if origins and (len(origins) > 1 or not self._origin_allowed(origins[0], hosts[0])):
            return PlainTextResponse("Origin not allowed\n", 403)
        authzs = headers.getlist("authorization")
        if not authzs and self.config.auth.mode == "none":
            return "default"
        if not authzs:
            # Not counted as a failure: a client's first request often comes without one.
            return _unauthorized("a bearer token is required (Authorization: Bearer <token>)\n")
        client = scope.get("client")
        verdict = self.tokens.check(_bearer(headers) if len(authzs) == 1 else None,
                                    client[0] if client else "")
        if verdict.ok and verdict.user is not None:
            return verdict.user
        if verdict.retry_after_s:
            return PlainTextResponse("too many failed attempts\n", 429,
                                     headers={"Retry-After": str(int(verdict.retry_after_s) + 1)})
        return _unauthorized("invalid token\n")

    # The same rules as the gateway's handshake (gateway/origins.py), for this port.
    def _host_allowed(self, host_header: str) -> bool:
        server = self.config.server
        return host_allowed(host_header, server.host, server.allowed_hosts)

    def _origin_allowed(self, origin: str, host_header: str) -> bool:
        return origin_allowed(origin, host_header, port=self.port, page_scheme=self.scheme,
                              allowed_origins=self.config.server.allowed_origins)


class _Places:
    """At most ``limit`` requests of one user served at once (``mcp.max_requests_per_user``),
    whatever number of connections they come on. A user's entry lives while one of their
    requests is waiting or served."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._held: dict[str, tuple[asyncio.Semaphore, list[int]]] = {}

    @contextlib.asynccontextmanager
    async def of(self, user: str) -> AsyncIterator[None]:
        sem, users = self._held.setdefault(user, (asyncio.Semaphore(self._limit), [0]))
        users[0] += 1
        try:
            async with sem:
                yield
        finally:
            users[0] -= 1
            if not users[0]:
                del self._held[user]

    def __len__(self) -> int:
        return len(self._held)


def _guarded_h11(sockets: SocketBudget) -> type[H11Protocol]:
    """uvicorn's h11 protocol with its sockets in ``sockets``: counted from accept to close, and
    closed unless each request's headers arrive within ``sockets.header_timeout_s`` (uvicorn
    itself never times out a first request's headers, and its keep-alive timer stops at the
    first byte of the next one)."""

    class GuardedH11(H11Protocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            sockets.admit(self, transport)  # aborted at once when nothing fits

        def connection_lost(self, exc: Exception | None) -> None:
            sockets.release(self)
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.conn.their_state is not h11.IDLE:  # a request's headers are in (or it failed)
                sockets.headers_done(self)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
                sockets.await_headers(self, self.transport)

    return GuardedH11


def _bearer(headers: Headers) -> str | None:
    scheme, _, token = headers.get("authorization", "").partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


def _unauthorized(text: str) -> PlainTextResponse:
    return PlainTextResponse(text, 401, headers={"WWW-Authenticate": 'Bearer realm="recalld"'})


def _loopback_ssl(config: Config) -> ssl.SSLContext | None:
    """TLS trust for this process's own connections to the gateway: its own certificate, which
    is what the peer must present (a partial chain: the leaf itself is the anchor, CA-signed or
    not). The name is not checked: the peer is this daemon on loopback, whatever name the
    certificate was issued for."""
    if not config.tls.cert:
        return None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(cafile=config.tls.cert)
    ctx.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
    ctx.check_hostname = False
    return ctx


