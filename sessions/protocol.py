"""The session store as the gateway uses it: the seam a second backend (PostgreSQL) implements.

:class:`SessionStoreLike` lists exactly the methods the gateway calls on its store, with the
contract of :class:`~sessions.store.SessionStore`, which implements it over JSONL transcripts
and ``sessions.db``. Every method is synchronous and thread-safe (the gateway calls them through
``asyncio.to_thread``) and raises only the :class:`~sessions.errors.SessionError` tree.
"""

from __future__ import annotations

import builtins
from collections.abc import Collection
from datetime import datetime
from typing import Any, Protocol

from .models import ConversationSummary, Message, MessagePage, Session, SessionPage

__all__ = ["SessionStoreLike"]


class SessionStoreLike(Protocol):
    """Sessions and their messages for one data dir; see :class:`~sessions.store.SessionStore`."""

    def create(self, user: str, *, title: str | None = None, system_prompt: str | None = None,
               model: str | None = None, created_at: datetime | str | None = None,
               memory: bool = True, session_key: str | None = None) -> Session:
        """Start a session (``memory=False``: incognito, never read by the memory index;
        ``session_key``: a key the caller chose, e.g. an import's, instead of a new one)."""
        ...

    def get(self, user: str, session_key: str) -> Session:
        """The session's metadata; SessionNotFound for unknown, foreign or malformed keys."""
        ...

    def list(self, user: str, *, limit: int = 50, before: str | None = None) -> SessionPage:
        """One page of the user's sessions, newest ``updatedAt`` first, and the next cursor."""
        ...

    def history(self, user: str, session_key: str, *, limit: int = 50,
                before: str | None = None) -> MessagePage:
        """The latest ``limit`` messages before the cursor, oldest first, and the next cursor."""
        ...

    def recent_messages(self, user: str, session_key: str, n: int) -> builtins.list[Message]:
        """The last ``n`` messages in order, for the model's context."""
        ...

    def append_message(self, user: str, session_key: str, *, role: str, content: str,
                       run_id: str | None = None, name: str | None = None,
                       ts: datetime | str | None = None,
                       extra: dict[str, Any] | None = None) -> Message:
        """Append one message, whole or not at all."""
        ...

    def update(self, user: str, session_key: str, *, title: str | None = None,
               system_prompt: str | None = None, model: str | None = None,
               temperature: float | None = None, max_tokens: int | None = None,
               clear: Collection[str] = ()) -> Session:
        """Change the title, system prompt, model or sampling (``clear`` names those of
        ``sessions.inputs.CLEARABLE`` set back to the default); ``updatedAt`` does not move."""
        ...

    def delete(self, user: str, session_key: str) -> None:
        """Remove the session and everything kept of it."""
        ...

    def purge_messages(self, user: str, session_key: str, *, after: datetime | None = None,
                       before: datetime | None = None) -> int:
        """Remove the messages timed in ``[after, before)`` for good; returns how many."""
        ...

    def idle_sessions(self, cutoff: datetime, *, limit: int,
                      after: tuple[str, str] | None = None) -> builtins.list[tuple[str, str]]:
        """Up to ``limit`` ``(user, session_key)`` of every user's sessions whose ``updatedAt`` (the
        last message's time, else the creation time) is before ``cutoff``, in (user, key) order
        after ``after``; pass a page's last pair back for the next page (a short page is the last).
        For the retention sweep, so a whole store is never read at once."""
        ...

    def append_summary(self, user: str, session_key: str, *, content: str, through: str,
                       messages: int) -> ConversationSummary:
        """Keep a summary of the messages up to ``through`` (an id), ``messages`` of them; it
        supersedes the earlier one. Not a message: the count and ``updatedAt`` stay."""
        ...

    def summary(self, user: str, session_key: str) -> ConversationSummary | None:
        """The session's newest conversation summary, or None (deleted with the session, and
        dropped by a ``purge_messages`` that removes a message it covers)."""
        ...

    def flush(self) -> None:
        """Make every acknowledged write durable (a durability point under fsync="batch")."""
        ...

    def close(self) -> None:
        """Flush and release everything; safe to call twice."""
        ...
