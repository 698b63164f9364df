"""Who receives which session's events. No I/O: it fills connections' outboxes.

A connection is attached to a session when it creates it, sends to it, or subscribes to it;
events of that session go to every attached connection of the same user. Detaching happens
on unsubscribe and when the connection closes.
"""

from __future__ import annotations

from typing import Any, Protocol

import orjson

from gateway.outbox import Outbox

__all__ = ["Hub", "Subscriber"]


class Subscriber(Protocol):
    @property
    def user(self) -> str | None: ...

    @property
    def outbox(self) -> Outbox: ...

    def on_overflow(self) -> None:
        """Called once the outbox exceeds its bound; the connection closes 1008."""


class Hub:
    def __init__(self) -> None:
        self._by_session: dict[tuple[str, str], set[Subscriber]] = {}
        self._by_conn: dict[Subscriber, set[tuple[str, str]]] = {}

    def attach(self, conn: Subscriber, user: str, session_key: str) -> None:
        key = (user, session_key)
        self._by_session.setdefault(key, set()).add(conn)
        self._by_conn.setdefault(conn, set()).add(key)

    def detach(self, conn: Subscriber, user: str, session_key: str) -> bool:
        key = (user, session_key)
        subs = self._by_session.get(key)
        if not subs or conn not in subs:
            return False
        subs.discard(conn)
        if not subs:
            del self._by_session[key]
        self._by_conn.get(conn, set()).discard(key)
        return True

    def drop(self, conn: Subscriber) -> None:
        """Forget a closed connection everywhere."""
        for key in self._by_conn.pop(conn, set()):
            subs = self._by_session.get(key)
            if subs is not None:
                subs.discard(conn)
                if not subs:
                    del self._by_session[key]

    def subscribers(self, user: str, session_key: str) -> list[Subscriber]:
        return list(self._by_session.get((user, session_key), ()))

    def publish(self, user: str, session_key: str, method: str, params: dict[str, Any]) -> int:
        """Queue an event for every attached connection; returns how many got it."""
        subs = self._by_session.get((user, session_key))
        if not subs:
            return 0
        frame: bytes | None = None
        for conn in list(subs):
            if method == "chat.delta":
                ok = conn.outbox.put_delta(params)
            else:
                if frame is None:
                    frame = orjson.dumps({"jsonrpc": "2.0", "method": method, "params": params})
                ok = conn.outbox.put(frame)
            if not ok:
                conn.on_overflow()
        return len(subs)
