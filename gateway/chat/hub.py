"""Who receives which session's events. No I/O: it hands notifications to callers.

A connection is attached to a session when it creates it, sends to it, or subscribes to it;
events of that session go to every attached connection of the same user. Detaching happens
on unsubscribe and when the connection closes (the transport calls :meth:`Hub.drop`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.rpc import CallContext, Notification

__all__ = ["ALL_SESSIONS", "Hub"]

# The channel of a user's session-list events (sessions.watch); never a session key (32 hex digits).
ALL_SESSIONS = "*"


class Hub:
    def __init__(self) -> None:
        self._by_session: dict[tuple[str, str], set[CallContext]] = {}
        self._by_conn: dict[CallContext, set[tuple[str, str]]] = {}

    def attach(self, conn: CallContext, user: str, session_key: str) -> None:
        key = (user, session_key)
        self._by_session.setdefault(key, set()).add(conn)
        self._by_conn.setdefault(conn, set()).add(key)

    def detach(self, conn: CallContext, user: str, session_key: str) -> bool:
        key = (user, session_key)
        subs = self._by_session.get(key)
        if not subs or conn not in subs:
            return False
        subs.discard(conn)
        if not subs:
            del self._by_session[key]
        self._by_conn.get(conn, set()).discard(key)
        return True

    def drop(self, conn: CallContext) -> None:
        """Forget a closed connection everywhere."""
        for key in self._by_conn.pop(conn, set()):
            subs = self._by_session.get(key)
            if subs is not None:
                subs.discard(conn)
                if not subs:
                    del self._by_session[key]

    def subscribers(self, user: str, session_key: str) -> list[CallContext]:
        return list(self._by_session.get((user, session_key), ()))

    def publish(self, user: str, session_key: str, method: str, params: Mapping[str, Any]) -> int:
        """Queue an event for every attached connection; returns how many got it."""
        subs = self._by_session.get((user, session_key))
        if not subs:
            return 0
        note = Notification(method, params)  # encoded once, on first need, for all of them
        for conn in list(subs):
            conn.notify(note)
        return len(subs)
