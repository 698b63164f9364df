"""Sessions and their append-only JSONL transcripts; no network, no memory index.

The public surface is :class:`SessionStore` (and :class:`SessionStoreLike`, the Protocol of
the methods the gateway calls, for a second backend) with its values (:class:`Session`,
:class:`Message`, :class:`ConversationSummary`), settings (:class:`SessionsConfig`), the file seam
for fault tests (:class:`FileIO`) and the error tree rooted at :class:`SessionError`. Readers that
follow transcripts from outside the store (the memory indexer) use the path layout
(:func:`sessions_root`, :func:`transcript_relpath`, :func:`parse_transcript_relpath`,
:func:`scan_transcripts`), :class:`ForwardReader` and :func:`read_header`, so the format has one
owner. Every database of recalld (the memory index, and on PostgreSQL the sessions', memory's and
cluster's tables) applies its ordered, named, recorded migrations through :func:`apply_migrations`
and a ledger (:mod:`sessions.migrations`). :class:`PgSessionStore` (``sessions.pg``, the same API on
PostgreSQL) is imported on first use only, since it needs psycopg (the ``postgres`` extra), as is
``pg_feed`` (:mod:`sessions.pg.feed`: what the PostgreSQL memory indexer reads of its tables, and
the change notifications). :class:`RunFence` (:mod:`sessions.fence`) is the run lease a PostgreSQL
append of a chat run carries. See docs/sessions.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .attachments import AttachmentFiles, AttachmentStore, is_sha256
from .config import FsyncPolicy, SessionsConfig
from .errors import (
    InvalidSessionInput,
    LineTooLarge,
    SchemaTooNew,
    SessionError,
    SessionNotFound,
    StorageError,
    UnsafePath,
)
from .fence import RUN_FENCE, LeaseLost, RunFence
from .fileio import FileIO, check_free_space
from .inputs import DEFAULT_TITLE, plain_title
from .keys import check_user
from .layout import (
    TRANSCRIPT_SUFFIX,
    parse_transcript_relpath,
    scan_transcripts,
    sessions_root,
    transcript_file,
    transcript_relpath,
)
from .migrations import (
    AsyncLedger,
    AsyncPgLedger,
    Ledger,
    PgLedger,
    SqliteLedger,
    apply_migrations,
    apply_migrations_async,
    async_pg_ledger,
    pg_ledger,
    sqlite_ledger,
)
from .models import (
    MESSAGE_ROLES,
    SUMMARY_TYPE,
    ConversationSummary,
    Message,
    MessagePage,
    Session,
    SessionPage,
    format_ts,
    now_ts,
    parse_ts,
)
from .protocol import SessionStoreLike
from .reader import ForwardReader, TranscriptEntry
from .store import SessionStore
from .supersede import CONTINUES_KEY, REPLACES_KEY, replaced_id, visible_history, visible_messages
from .transcript import Header, memory_enabled, read_header
from .versions import RESTORES_KEY, Restore, Versions, read_all

if TYPE_CHECKING:
    from .pg import PgSessionStore as PgSessionStore
    from .pg import feed as pg_feed  # noqa: F401  (for mypy; __getattr__ imports it at run time)

__all__ = [
    "AttachmentFiles",
    "AttachmentStore",
    "is_sha256",
    "AsyncLedger",
    "AsyncPgLedger",
    "Ledger",
    "PgLedger",
    "SqliteLedger",
    "apply_migrations",
    "apply_migrations_async",
    "async_pg_ledger",
    "pg_ledger",
    "sqlite_ledger",
    "DEFAULT_TITLE",
    "MESSAGE_ROLES",
    "CONTINUES_KEY",
    "REPLACES_KEY",
    "RESTORES_KEY",
    "Restore",
    "Versions",
    "read_all",
    "SUMMARY_TYPE",
    "TRANSCRIPT_SUFFIX",
    "ConversationSummary",
    "FileIO",
    "ForwardReader",
    "FsyncPolicy",
    "LeaseLost",
    "Header",
    "InvalidSessionInput",
    "LineTooLarge",
    "Message",
    "RUN_FENCE",
    "RunFence",
    "MessagePage",
    "Session",
    "SessionError",
    "SessionNotFound",
    "SessionPage",
    "SessionStore",
    "SessionStoreLike",
    "SessionsConfig",
    "StorageError",
    "TranscriptEntry",
    "SchemaTooNew",
    "UnsafePath",
    "check_free_space",
    "check_user",
    "format_ts",
    "memory_enabled",
    "now_ts",
    "parse_transcript_relpath",
    "parse_ts",
    "plain_title",
    "read_header",
    "replaced_id",
    "scan_transcripts",
    "sessions_root",
    "transcript_file",
    "transcript_relpath",
    "visible_history",
    "visible_messages",
]


def __getattr__(name: str) -> Any:
    # Neither is in __all__: a star import must not pull in psycopg.
    if name == "PgSessionStore":
        from .pg import PgSessionStore

        return PgSessionStore
    if name == "pg_feed":
        from .pg import feed

        return feed
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
