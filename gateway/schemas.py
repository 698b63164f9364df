"""Parameter dataclasses of every v1 method, declared once into a :class:`Registry`.

Everything the wire accepts is written here; handlers are attached elsewhere
(``gateway.methods``, ``gateway.chat``, ``gateway.memory_methods``) with
``Registry.implement``. A method declared but not implemented answers -32601.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gateway.registry import Registry, bounded

__all__ = ["declare_all"]

MAX_KEY = 128
MAX_TEXT = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Empty:
    pass


@dataclass(frozen=True, slots=True)
class AuthParams:
    token: str = bounded(max_len=4096, doc="a configured or generated token")


@dataclass(frozen=True, slots=True)
class CreateSessionParams:
    title: str | None = bounded(None, max_len=200)
    system_prompt: str | None = bounded(None, max_len=64 * 1024)
    model: str | None = bounded(None, max_len=200)


@dataclass(frozen=True, slots=True)
class ListSessionsParams:
    limit: int = bounded(50, min=1, max=200)
    before: str | None = bounded(None, max_len=512, doc="cursor from a previous page's next")


@dataclass(frozen=True, slots=True)
class SessionKeyParams:
    session_key: str = bounded(max_len=MAX_KEY)


@dataclass(frozen=True, slots=True)
class HistoryParams:
    session_key: str = bounded(max_len=MAX_KEY)
    limit: int = bounded(50, min=1, max=500)
    before: str | None = bounded(None, max_len=512)


@dataclass(frozen=True, slots=True)
class ChatSendParams:
    session_key: str = bounded(max_len=MAX_KEY)
    message: str = bounded(max_len=MAX_TEXT)
    idempotency_key: str | None = bounded(None, max_len=200)


@dataclass(frozen=True, slots=True)
class ChatAbortParams:
    session_key: str = bounded(max_len=MAX_KEY)
    run_id: str | None = bounded(None, max_len=MAX_KEY)


@dataclass(frozen=True, slots=True)
class MemorySearchParams:
    query: str = bounded(max_len=8192)
    k: int | None = bounded(None, min=1, max=50)
    mode: Literal["hybrid", "keyword", "vector"] = "hybrid"
    session_key: str | None = bounded(None, max_len=MAX_KEY)
    exclude_session_key: str | None = bounded(None, max_len=MAX_KEY)
    after: str | None = bounded(None, max_len=64, doc="ISO-8601 lower bound on chunk time")
    before: str | None = bounded(None, max_len=64, doc="ISO-8601 upper bound on chunk time")


@dataclass(frozen=True, slots=True)
class ReindexParams:
    full: bool = False


def declare_all(registry: Registry) -> None:
    """Declare every v1 method with its params, so ``rpc.discover`` is complete."""
    d = registry.declare
    # inline=True: the handler never waits on I/O (see RpcCore.runs_inline).
    d("auth", AuthParams, "Authenticate this connection with a token.", requires_auth=False, inline=True)
    d("gateway.health", Empty, "Liveness, version, uptime, connections and memory summary.", inline=True)
    d("rpc.discover", Empty, "This OpenRPC document.", inline=True)
    d("sessions.create", CreateSessionParams, "Create a session.")
    d("sessions.list", ListSessionsParams, "List your sessions, newest first.")
    d("sessions.get", SessionKeyParams, "One session's metadata.")
    d("sessions.history", HistoryParams, "Messages of a session, oldest first within a page.")
    d("sessions.delete", SessionKeyParams, "Delete a session, its transcript and index rows.")
    d("sessions.subscribe", SessionKeyParams, "Receive chat events of a session.")
    d("sessions.unsubscribe", SessionKeyParams, "Stop receiving a session's chat events.", inline=True)
    d("chat.send", ChatSendParams, "Send a message; the reply streams as chat.* events.")
    d("chat.abort", ChatAbortParams, "Abort the running reply of a session.")
    d("memory.search", MemorySearchParams, "Hybrid keyword + vector search of your past conversations.")
    d("memory.status", Empty, "Index and embedder state.")
    d("memory.reindex", ReindexParams, "Queue an index sync (full=true rebuilds from transcripts).")
