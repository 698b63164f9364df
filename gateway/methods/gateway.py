"""``auth``, ``auth.code``, ``gateway.health``, ``rpc.discover`` and ``models.list``: the
connection and the server itself.

None of them waits on I/O, so they are declared inline: the server answers them in the
connection's read loop, and a connection at its in-flight limit can still check health.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, NotRequired, Protocol, TypedDict

from gateway.auth import Authenticator
from gateway.errors import Forbidden, InvalidParams, RateLimited, Unauthorized
from gateway.readiness import SQLITE_STATE, StorageState
from gateway.rpc import CallContext, OpenRpcDocument, Registry, bounded
from gateway.wire import MemoryHealth, ServerInfo, server_info
from memory import Memory

__all__ = ["GatewayMethods", "declare_gateway"]


class ServerState(Protocol):
    """What health reports about the server (the transport's ``GatewayServer``)."""

    @property
    def started(self) -> float: ...

    @property
    def connection_count(self) -> int: ...


@dataclass(frozen=True, slots=True)
class Empty:
    pass


@dataclass(frozen=True, slots=True)
class AuthParams:
    token: str | None = bounded(None, max_len=4096, doc="a configured or generated token")
    code: str | None = bounded(None, max_len=256,
                               doc="a one-time sign-in code from auth.code, instead of a token")


class AuthReply(TypedDict):
    user: str
    server: ServerInfo
    protocol: int
    token: NotRequired[str]  # only for a code: the user's token, for the page to keep


class CodeReply(TypedDict):
    code: str
    expiresInS: float


class StorageHealth(TypedDict):
    backend: Literal["sqlite", "postgres"]
    status: Literal["ok", "degraded"]
    reason: str | None  # why not ok: the database's last check (gateway.readiness)
    sinceS: float  # seconds since the status last changed (since start while it never did)


class HealthReply(TypedDict):
    status: Literal["ok", "degraded"]  # "degraded": storage is not ok (GET /readyz answers 503)
    version: str
    uptimeS: float
    connections: int
    memory: MemoryHealth
    storage: StorageHealth


class ModelsReply(TypedDict):
    models: list[str]  # what sessions.create {model} accepts
    default: str  # a session created without model runs on this one


class GatewayMethods:
    def __init__(self, authenticator: Authenticator, registry: Registry, server: ServerState,
                 version: str, memory: Memory, models: tuple[str, ...] = (), *,
                 storage: Callable[[], StorageState] = lambda: SQLITE_STATE) -> None:
        self.authenticator = authenticator
        self.storage = storage  # the database check's last answer (no I/O: health is inline)
        self.registry = registry  # rpc.discover describes it
        self.server = server
        self.version = version
        self.memory = memory
        self.models = models  # LlmConfig.choices: the configured model first

    async def auth(self, ctx: CallContext, p: AuthParams) -> AuthReply:
        if (p.token is None) == (p.code is None):
            raise InvalidParams("token", "give exactly one of token and code")
        if p.code is not None:
            verdict = self.authenticator.redeem_code(p.code, ctx.address)
        else:
            verdict = self.authenticator.check(p.token, ctx.address)
        if verdict.user is None:
            if verdict.retry_after_s:
                raise RateLimited("too many failed attempts; retry later",
                                  int(verdict.retry_after_s * 1000))
            if p.code is not None:
                raise Unauthorized("unauthorized: this sign-in code was already used or has "
                                   "expired (a code works once, within "
                                   f"{self.authenticator.codes.ttl_s:g} s); run "
                                   "`recalld open` again")
            raise Unauthorized("unauthorized: invalid token")
        ctx.authenticate(verdict.user, verdict.client, verdict.read_only)
        info = server_info(self.version)
        reply: AuthReply = {"user": verdict.user, "server": info, "protocol": info["protocol"]}
        token = self.authenticator.token_of(verdict.user) if p.code is not None else None
        if token is not None:
            reply["token"] = token
        return reply

    async def code(self, ctx: CallContext, p: Empty) -> CodeReply:
        if ctx.client is not None:
            # A redeemed code hands the page the user's own token: a client token must not be
            # a way to that (revoking the client would leave the page signed in for good).
            raise Forbidden("forbidden: auth.code needs the user's own token, not client "
                            f"{ctx.client!r}'s")
        codes = self.authenticator.codes
        return {"code": codes.issue(ctx.caller), "expiresInS": codes.ttl_s}

    async def health(self, ctx: CallContext, p: Empty) -> HealthReply:
        state = self.storage()
        now = time.monotonic()
        storage: StorageHealth = {
            "backend": state.backend, "status": "ok" if state.ok else "degraded",
            "reason": state.reason, "sinceS": round(now - max(state.since, self.server.started), 3)}
        return {
            "status": storage["status"],
            "version": self.version,
            "uptimeS": round(now - self.server.started, 3),
            "connections": self.server.connection_count,
            "memory": self._memory_health(),
            "storage": storage,
        }

    async def discover(self, ctx: CallContext, p: Empty) -> OpenRpcDocument:
        return self.registry.openrpc(self.version)

    async def list_models(self, ctx: CallContext, p: Empty) -> ModelsReply:
        return {"models": list(self.models), "default": self.models[0]}

    def _memory_health(self) -> MemoryHealth:
        # No database query: gateway.health must stay cheap under load.
        if not self.memory.config.enabled:
            return {"enabled": False}
        embedder = self.memory.embedder
        return {
            "enabled": True,
            "provider": embedder.provider if embedder else "none",
            "model": embedder.model_id if embedder else None,
            "embedderReason": self.memory.embedder_reason,
            "syncCount": self.memory.sync_count,
        }


def declare_gateway(reg: Registry, h: GatewayMethods | None) -> None:
    reg.declare("auth", AuthParams, "Authenticate this connection with a token.",
                h.auth if h else None, result=AuthReply, requires_auth=False, inline=True)
    reg.declare("auth.code", Empty, "A one-time sign-in code for this connection's user, redeemed "
                "once by `auth {code}` within auth.code_ttl_s (what `recalld open` "
                "hands a browser).",
                h.code if h else None, result=CodeReply, inline=True)
    reg.declare("gateway.health", Empty, "Liveness, version, uptime, connections, memory summary "
                "and storage (degraded while the database is unreachable).",
                h.health if h else None, result=HealthReply, inline=True)
    reg.declare("rpc.discover", Empty, "This OpenRPC document.", h.discover if h else None,
                result=OpenRpcDocument, inline=True)
    reg.declare("models.list", Empty,
                "The models a session may choose (llm.models) and the default.",
                h.list_models if h else None, result=ModelsReply, inline=True)
