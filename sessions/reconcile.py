"""Keeping the metadata index in step with the transcripts on disk.

The index is a cache, so the rule is simple: whenever a row may disagree with its transcript,
re-derive the row from the file. :func:`reconcile` does that for the whole data dir at open —
one directory scan plus one ``stat`` per transcript when nothing changed — and
:func:`checked_summary` does it for one session.

Only transcripts as :mod:`sessions.layout` defines them count, and only if their header names
that same user and key: a transcript copied into another user's directory is never listed there.
"""

from __future__ import annotations

import time
from pathlib import Path

import structlog

from .errors import StorageError
from .fileio import FileIO
from .index import SessionIndex
from .layout import scan_transcripts, transcript_file
from .transcript import Summary, recover_tail, summarise

__all__ = ["checked_summary", "reconcile"]

log = structlog.get_logger(__name__)


def checked_summary(root: Path, user: str, session_key: str) -> Summary | None:
    """The transcript's summary if its header is readable and names this user and key."""
    path = transcript_file(root, user, session_key)
    summary = summarise(path)
    if summary is None:
        if path.exists():
            log.warning("transcript.unreadable", path=str(path), reason="bad header")
        return None
    if (summary.header.user, summary.header.session_key) != (user, session_key):
        log.warning("transcript.unreadable", path=str(path), reason="header names another")
        return None
    return summary


def reconcile(index: SessionIndex, root: Path, io: FileIO, *, durable: bool) -> None:
    """Bring every row in line with the disk (all of them when the index is new).

    A transcript without a row, or whose size differs from the recorded one (a crash between
    the append and the index update, a file copied in), has its tail repaired and its row
    re-derived; rows whose transcript is gone are dropped. Runs in one transaction. The caller
    turns ``apsw.Error`` into StorageError.
    """
    started = time.perf_counter()
    known = index.sizes()
    on_disk = scan_transcripts(root)
    changed = [ident for ident, size in on_disk.items() if known.get(ident) != size]
    gone = known.keys() - on_disk.keys()
    with index.transaction():
        for user, key in changed:
            try:
                recover_tail(transcript_file(root, user, key), io, durable=durable)
            except StorageError as err:
                # Leave it for the session's first use to retry: the daemon must still start.
                log.error("transcript.recovery_failed", user=user, session=key, error=str(err))
                continue
            summary = checked_summary(root, user, key)
            if summary is None:
                index.delete(user, key)
            else:
                index.put(user, summary)
        for user, key in gone:
            index.delete(user, key)
    # A brand-new data dir ("missing", nothing on disk) is not news; every other reset is.
    if changed or gone or index.reset_reason in ("corrupt", "schema"):
        log.info(
            "sessions.index_reconciled",
            reason=index.reset_reason or "stale",
            transcripts=len(on_disk),
            refreshed=len(changed),
            removed=len(gone),
            elapsed_ms=round((time.perf_counter() - started) * 1000, 1),
        )
