"""The session index as the store uses it: one lock, failures mapped, rows repaired from files.

The transcript is the truth and the index its cache, so a failed index write after a transcript
changed is logged and remembered here, and the row is re-derived from the file later
(:meth:`IndexRows.refresh_pending`) rather than failing a write that already reached the disk.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeAlias

import apsw
import structlog

from .errors import SessionNotFound, StorageError, UnsafePath
from .index import SessionIndex
from .layout import transcript_file
from .models import Session
from .transcript import Summary, summarise

__all__ = ["IndexRows", "checked_summary"]

log = structlog.get_logger(__name__)

_Ident: TypeAlias = "tuple[str, str]"


def checked_summary(root: Path, user: str, session_key: str) -> Summary | None:
    """The transcript's summary if its header is readable and names this user and key."""
    path = transcript_file(root, user, session_key)
    try:
        summary = summarise(path)
    except UnsafePath:
        # A link (or a FIFO) is no transcript: its row goes, and it is never read.
        log.warning("transcript.unreadable", path=str(path), reason="not a regular file")
        return None
    if summary is None:
        if path.exists():
            log.warning("transcript.unreadable", path=str(path), reason="bad header")
        return None
    if (summary.header.user, summary.header.session_key) != (user, session_key):
        log.warning("transcript.unreadable", path=str(path), reason="header names another")
        return None
    return summary


class IndexRows:
    """``index`` behind ``lock`` (the store's *index* lock: taken after a stripe, never before)."""

    def __init__(self, index: SessionIndex, root: Path,
                 stripe: Callable[[str], threading.Lock]) -> None:
        self.index = index
        self.lock = threading.Lock()
        self._root = root
        self._stripe = stripe
        self._pending_lock = threading.Lock()  # innermost: held only for set operations
        self._needs_refresh: set[_Ident] = set()

    @contextlib.contextmanager
    def op(self, action: str) -> Iterator[None]:
        with self.lock:
            try:
                yield
            except apsw.Error as err:
                log.error("sessions.index_failed", action=action, error=str(err))
                raise StorageError(f"session index failed while {action}") from err

    def write(self, ident: _Ident, write: Callable[[], None]) -> None:
        """An index update after the transcript changed: the transcript is already the truth,
        so a failure here is logged and repaired from the file later rather than raised."""
        try:
            with self.op("updating the session index"):
                write()
        except StorageError:
            with self._pending_lock:
                self._needs_refresh.add(ident)

    def refresh(self, user: str, key: str) -> Session | None:
        """Re-derive one row from its transcript (deleting it if the transcript is unusable)."""
        summary = checked_summary(self._root, user, key)
        with self.op("updating the session index"):
            if summary is None:
                self.index.delete(user, key)
                return None
            self.index.put(user, summary)
        return summary.session(user)

    def refresh_pending(self) -> None:
        with self._pending_lock:
            if not self._needs_refresh:
                return
            pending, self._needs_refresh = self._needs_refresh, set()
        for user, key in pending:
            try:
                with self._stripe(key):
                    self.refresh(user, key)
            except StorageError:
                with self._pending_lock:
                    self._needs_refresh.add((user, key))

    def session(self, user: str, key: str) -> Session:
        """The row's session, re-derived from the transcript when the row is missing."""
        with self.op("reading the session index"):
            row = self.index.get(user, key)
        if row is not None:
            return row[0]
        session = self.refresh(user, key)
        if session is None:
            raise SessionNotFound()
        return session
