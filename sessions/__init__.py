"""Sessions and their append-only JSONL transcripts (DESIGN 3); no network, no memory index.

The public surface is :class:`SessionStore` with its values (:class:`Session`,
:class:`Message`), settings (:class:`SessionsConfig`), the file seam for fault tests
(:class:`FileIO`) and the error tree rooted at :class:`SessionError`. See docs/sessions.md.
"""

from __future__ import annotations

from .config import FsyncPolicy, SessionsConfig
from .errors import InvalidSessionInput, LineTooLarge, SessionError, SessionNotFound, StorageError
from .fileio import FileIO
from .models import Message, Session, format_ts, now_ts, parse_ts
from .store import MessagePage, SessionPage, SessionStore

__all__ = [
    "FileIO",
    "FsyncPolicy",
    "InvalidSessionInput",
    "LineTooLarge",
    "Message",
    "MessagePage",
    "Session",
    "SessionError",
    "SessionNotFound",
    "SessionPage",
    "SessionStore",
    "SessionsConfig",
    "StorageError",
    "format_ts",
    "now_ts",
    "parse_ts",
]
