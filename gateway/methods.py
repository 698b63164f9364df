"""Handlers of ``auth``, ``gateway.*``, ``rpc.discover`` and ``sessions.*``.

Handlers receive the caller's :class:`~gateway.server.Connection` and validated params, and
return plain data or raise; the RPC core turns exceptions into error objects. Blocking store
calls go to a worker thread so the event loop never waits on the disk.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from gateway import schemas
from gateway.errors import RateLimited, Unauthorized
from gateway.registry import Handler

if TYPE_CHECKING:
    from gateway.app import App
    from gateway.server import Connection

__all__ = ["register_core_methods"]


def register_core_methods(app: App) -> None:
    reg = app.registry
    store = app.store

    async def auth(conn: Connection, p: schemas.AuthParams) -> dict[str, Any]:
        verdict = app.authenticator.check(p.token, conn.address)
        if not verdict.ok:
            if verdict.retry_after_s:
                raise RateLimited(
                    "too many failed attempts; retry later", int(verdict.retry_after_s * 1000)
                )
            raise Unauthorized("unauthorized: invalid token")
        assert verdict.user is not None
        app.server.authenticate(conn, verdict.user)
        info = app.server.server_info()
        return {"user": verdict.user, "server": info, "protocol": info["protocol"]}

    async def health(conn: Connection, p: schemas.Empty) -> dict[str, Any]:
        memory: dict[str, Any] = {"enabled": False}
        if app.memory is not None:
            memory = await app.memory.health()
        return {
            "status": "ok",
            "version": app.version,
            "uptimeS": round(time.monotonic() - app.server.started, 3),
            "connections": len(app.server.connections),
            "memory": memory,
        }

    async def discover(conn: Connection, p: schemas.Empty) -> dict[str, Any]:
        return reg.openrpc(app.version)

    async def create(conn: Connection, p: schemas.CreateSessionParams) -> dict[str, Any]:
        session = await asyncio.to_thread(
            store.create, conn.caller, title=p.title, system_prompt=p.system_prompt, model=p.model
        )
        app.hub.attach(conn, conn.caller, session.session_key)
        wire = session.to_wire()
        return {"sessionKey": wire["sessionKey"], "title": wire["title"], "createdAt": wire["createdAt"]}

    async def list_(conn: Connection, p: schemas.ListSessionsParams) -> dict[str, Any]:
        sessions, nxt = await asyncio.to_thread(store.list, conn.caller, limit=p.limit, before=p.before)
        out: dict[str, Any] = {"sessions": [s.to_wire() for s in sessions]}
        if nxt:
            out["next"] = nxt
        return out

    async def get(conn: Connection, p: schemas.SessionKeyParams) -> dict[str, Any]:
        session = await asyncio.to_thread(store.get, conn.caller, p.session_key)
        return session.to_wire()

    async def history(conn: Connection, p: schemas.HistoryParams) -> dict[str, Any]:
        messages, nxt = await asyncio.to_thread(
            store.history, conn.caller, p.session_key, limit=p.limit, before=p.before
        )
        out: dict[str, Any] = {"messages": [m.to_wire() for m in messages]}
        if nxt:
            out["next"] = nxt
        return out

    async def delete(conn: Connection, p: schemas.SessionKeyParams) -> dict[str, Any]:
        user = conn.caller
        if app.chat is not None:
            await app.chat.abort_session(user, p.session_key)
        await asyncio.to_thread(store.delete, user, p.session_key)
        if app.memory is not None:
            await app.memory.delete_session(user, p.session_key)
        return {"deleted": True}

    async def subscribe(conn: Connection, p: schemas.SessionKeyParams) -> dict[str, Any]:
        await asyncio.to_thread(store.get, conn.caller, p.session_key)  # not-found check
        app.hub.attach(conn, conn.caller, p.session_key)
        return {"subscribed": True}

    async def unsubscribe(conn: Connection, p: schemas.SessionKeyParams) -> dict[str, Any]:
        return {"unsubscribed": app.hub.detach(conn, conn.caller, p.session_key)}

    handlers: dict[str, Handler] = {
        "auth": auth,
        "gateway.health": health,
        "rpc.discover": discover,
        "sessions.create": create,
        "sessions.list": list_,
        "sessions.get": get,
        "sessions.history": history,
        "sessions.delete": delete,
        "sessions.subscribe": subscribe,
        "sessions.unsubscribe": unsubscribe,
    }
    for name, handler in handlers.items():
        reg.implement(name, handler)
