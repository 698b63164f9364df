"""CheckedSessionStore: the public methods whose rule is the same on every backend, written once.

Each method here checks its arguments (:mod:`sessions.keys`, :mod:`sessions.inputs`), builds
the value it stores, and hands only checked values to one storage step that the backend
implements (``_create``, ``_list_page``, ``_read_back``, ``_append_message``). So the JSONL
store (:class:`~sessions.store.SessionStore`) and PostgreSQL
(:class:`~sessions.pg.PgSessionStore`) refuse the same input with the same errors, in the same
order, and cut their pages the same way. It holds no SQL and no file I/O.
"""

from __future__ import annotations

import builtins
from abc import ABC, abstractmethod
from collections.abc import Callable
from datetime import datetime
from typing import Any

from . import inputs
from .config import SessionsConfig
from .errors import InvalidSessionInput, StorageError
from .keys import (
    check_session_key,
    check_user,
    decode_history_cursor,
    decode_list_cursor,
    encode_list_cursor,
    is_session_key,
)
from .models import Message, MessagePage, Session, SessionPage
from .transcript import Header

__all__ = ["CheckedSessionStore"]


class CheckedSessionStore(ABC):
    """The checked half of a session store; a backend subclasses it and fills in the storage."""

    # Set by the backend's __init__.
    _config: SessionsConfig
    _key_factory: Callable[[], str]
    _closed: bool

    def create(
        self,
        user: str,
        *,
        title: str | None = None,
        system_prompt: str | None = None,
        model: str | None = None,
        created_at: datetime | str | None = None,
        memory: bool = True,
        session_key: str | None = None,
    ) -> Session:
        """Start a session holding no message yet. ``memory=False``: incognito (kept, but the
        memory index never reads it). ``session_key``: the key the caller chose (an import's,
        stable across re-imports) instead of a new one; a key already taken is a StorageError."""
        self._check_open()
        user = check_user(user)
        if session_key is not None and not is_session_key(session_key):
            raise InvalidSessionInput("sessionKey", "is not a session key")
        header, line = inputs.build_header(
            user,
            session_key=self._new_key() if session_key is None else session_key,
            title=title,
            system_prompt=system_prompt,
            model=model,
            created_at=created_at,
            config=self._config,
            memory=memory,
        )
        return self._create(user, header, line)

    def list(self, user: str, *, limit: int = 50, before: str | None = None) -> SessionPage:
        """One page of ``user``'s sessions, newest ``updatedAt`` first (ties: key descending).

        Returns the page and the cursor for the next one (None at the end). Keyset paging: a
        session updated between two calls moves to the front and is not repeated further on.
        """
        self._check_open()
        user = check_user(user)
        limit = inputs.check_limit(limit, self._config)
        after = decode_list_cursor(before) if before is not None else None
        # One row more than the page says whether there is a next one.
        rows = self._list_page(user, after, limit + 1)
        if len(rows) <= limit:
            return rows, None
        last = rows[limit - 1]
        return rows[:limit], encode_list_cursor(last.updated_at, last.session_key)

    def history(
        self, user: str, session_key: str, *, limit: int = 50, before: str | None = None
    ) -> MessagePage:
        """The latest ``limit`` messages before the cursor, oldest first, and the next cursor.

        The page also stops before the message that would take its lines past
        ``max_page_bytes`` (it always holds one), and the cursor then resumes exactly there.
        """
        self._check_open()
        user, key = check_user(user), check_session_key(session_key)
        limit = inputs.check_limit(limit, self._config)
        end = decode_history_cursor(before, key) if before is not None else None
        return self._read_back(user, key, limit, end, self._config.max_page_bytes)

    def recent_messages(self, user: str, session_key: str, n: int) -> builtins.list[Message]:
        """The last ``n`` messages in order, for the model's context, within
        ``max_context_bytes``."""
        self._check_open()
        user, key = check_user(user), check_session_key(session_key)
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise InvalidSessionInput("n", "must be a non-negative integer")
        return self._read_back(user, key, n, None, self._config.max_context_bytes)[0]

    def append_message(
        self,
        user: str,
        session_key: str,
        *,
        role: str,
        content: str,
        run_id: str | None = None,
        name: str | None = None,
        ts: datetime | str | None = None,
        extra: dict[str, Any] | None = None,
    ) -> Message:
        """Append one message, whole or not at all; nothing is written if anything is wrong.

        ``ts`` defaults to now (the benchmark harness passes dataset dates). ``extra`` adds keys
        such as ``model``, ``usage``, ``finishReason``, ``aborted``, ``failed`` to the message.
        """
        self._check_open()
        user, key = check_user(user), check_session_key(session_key)
        message, line = inputs.build_message(
            role=role, content=content, run_id=run_id, name=name, ts=ts, extra=extra,
            config=self._config,
        )
        return self._append_message(user, key, message, line)

    # ----------------------------------------------------------------- for the backends

    def _new_key(self) -> str:
        key = self._key_factory()
        if not is_session_key(key):
            # A programming error in the caller's factory, not bad input from a client.
            raise ValueError(f"key_factory returned {key!r}, which is not a session key")
        return key

    def _check_open(self) -> None:
        if self._closed:
            raise StorageError("the session store is closed")

    @abstractmethod
    def _create(self, user: str, header: Header, line: bytes) -> Session:
        """Store a new session from its checked header (``line``: its serialised form, whose
        size the checks bounded)."""

    @abstractmethod
    def _list_page(self, user: str, after: tuple[str, str] | None,
                   limit: int) -> builtins.list[Session]:
        """Up to ``limit`` of ``user``'s sessions, newest first, strictly past ``after`` (an
        ``(updatedAt, sessionKey)`` pair); their ``system_prompt`` is None (``get`` has it)."""

    @abstractmethod
    def _read_back(self, user: str, key: str, limit: int, before: int | None,
                   max_bytes: int | None) -> MessagePage:
        """Up to ``limit`` of the session's messages before the history cursor's position
        ``before`` (default: the end), oldest first, their lines within ``max_bytes``."""

    @abstractmethod
    def _append_message(self, user: str, key: str, message: Message, line: bytes) -> Message:
        """Store a checked message (``line``: its transcript line) as the session's newest."""
