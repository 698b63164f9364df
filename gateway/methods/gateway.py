"""``auth``, ``gateway.health``, ``rpc.discover`` and ``models.list``: the connection and the
server itself.

All four never wait on I/O, so they are declared inline: the server answers them in the
connection's read loop, and a connection at its in-flight limit can still check health.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal, Protocol, TypedDict

from gateway.auth import Authenticator
from gateway.errors import RateLimited, Unauthorized
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
    token: str = bounded(max_len=4096, doc="a configured or generated token")


class AuthReply(TypedDict):
    user: str
    server: ServerInfo
    protocol: int


class HealthReply(TypedDict):
    status: Literal["ok"]
    version: str
    uptimeS: float
    connections: int
    memory: MemoryHealth


class ModelsReply(TypedDict):
    models: list[str]  # what sessions.create {model} accepts
    default: str  # a session created without model runs on this one


class GatewayMethods:
    def __init__(self, authenticator: Authenticator, registry: Registry, server: ServerState,
                 version: str, memory: Memory | None, models: tuple[str, ...] = ()) -> None:
        self.authenticator = authenticator
        self.registry = registry  # rpc.discover describes it
        self.server = server
        self.version = version
        self.memory = memory
        self.models = models  # LlmConfig.choices: the configured model first

    async def auth(self, ctx: CallContext, p: AuthParams) -> AuthReply:
        verdict = self.authenticator.check(p.token, ctx.address)
        if verdict.user is None:
            if verdict.retry_after_s:
                raise RateLimited("too many failed attempts; retry later", int(verdict.retry_after_s * 1000))
            raise Unauthorized("unauthorized: invalid token")
        ctx.authenticate(verdict.user)
        info = server_info(self.version)
        return {"user": verdict.user, "server": info, "protocol": info["protocol"]}

    async def health(self, ctx: CallContext, p: Empty) -> HealthReply:
        return {
            "status": "ok",
            "version": self.version,
            "uptimeS": round(time.monotonic() - self.server.started, 3),
            "connections": self.server.connection_count,
            "memory": self._memory_health(),
        }

    async def discover(self, ctx: CallContext, p: Empty) -> OpenRpcDocument:
        return self.registry.openrpc(self.version)

    async def list_models(self, ctx: CallContext, p: Empty) -> ModelsReply:
        return {"models": list(self.models), "default": self.models[0]}

    def _memory_health(self) -> MemoryHealth:
        # No database query: gateway.health must stay cheap under load.
        if self.memory is None:
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
    reg.declare("auth", AuthParams, "Authenticate this connection with a token.", h.auth if h else None,
                result=AuthReply, requires_auth=False, inline=True)
    reg.declare("gateway.health", Empty, "Liveness, version, uptime, connections and memory summary.",
                h.health if h else None, result=HealthReply, inline=True)
    reg.declare("rpc.discover", Empty, "This OpenRPC document.", h.discover if h else None,
                result=OpenRpcDocument, inline=True)
    reg.declare("models.list", Empty, "The models a session may choose (llm.models) and the default.",
                h.list_models if h else None, result=ModelsReply, inline=True)
