"""Keeping the metadata index in step with the transcripts on disk.

The index is a cache, so the rule is simple: whenever a row may disagree with its transcript,
re-derive the row from the file. :func:`reconcile` does that for the whole data dir at open —
one directory scan plus one ``stat`` per transcript when nothing changed; after a clean stop
:func:`reconcile_at_open` looks only in the user directories that changed
(:mod:`sessions.shutdown`) and :func:`catch_up` checks the rest while the store is in use;
:func:`sessions.rows.checked_summary` does it for one session.

Only transcripts as :mod:`sessions.layout` defines them count, and only if their header names
that same user and key: a transcript copied into another user's directory is never listed there.
"""

from __future__ import annotations

import stat
import threading
import time
from collections.abc import Callable, Collection
from pathlib import Path

import structlog

from .errors import StorageError
from .fileio import FileIO
from .index import SessionIndex
from .layout import scan_transcripts, scan_user_transcripts, transcript_file
from .recovery import recover_tail
from .rows import IndexRows, checked_summary
from .shutdown import changed_users, stamp_dirs, take_marker

__all__ = ["catch_up", "reconcile", "reconcile_at_open"]

log = structlog.get_logger(__name__)


def reconcile(index: SessionIndex, root: Path, io: FileIO, *, durable: bool,
              users: Collection[str] | None = None, gone_users: Collection[str] = ()) -> None:
    """Bring every row in line with the disk (all of them when the index is new).

    A transcript without a row, or whose size differs from the recorded one (a crash between
    the append and the index update, a file copied in), has its tail repaired and its row
    re-derived; rows whose transcript is gone are dropped. ``users``: look only in these
    users' directories, and drop every row of ``gone_users`` (a start after a clean stop,
    :mod:`sessions.shutdown`). Runs in one transaction. The caller turns ``apsw.Error`` into
    StorageError.
    """
    started = time.perf_counter()
    if users is None:
        known = index.sizes()
        on_disk = scan_transcripts(root)
    else:
        known, on_disk = {}, {}
        for user in users:
            known.update(index.sizes(user))
            on_disk.update(scan_user_transcripts(root, user))
        for user in gone_users:
            known.update(index.sizes(user))
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


def reconcile_at_open(index: SessionIndex, data_dir: Path, root: Path, io: FileIO, *, durable: bool,
                      trust_marker: bool) -> bool:
    """The reconcile a store's open runs; True when a clean stop's marker let it look only in
    the user directories that changed since (:mod:`sessions.shutdown`).

    The marker is taken away whether or not it is trusted, so it never outlives the run after
    it; an index that started empty (new, corrupt, another schema) is rebuilt in full anyway.
    """
    marker = take_marker(data_dir, durable=durable)
    if marker is None or not trust_marker or index.reset_reason is not None:
        reconcile(index, root, io, durable=durable)
        return False
    stamps = stamp_dirs(root)
    rescan, gone = changed_users(marker, stamps)
    reconcile(index, root, io, durable=durable, users=rescan, gone_users=gone)
    log.info("sessions.clean_start", users=len(stamps), rescanned=len(rescan), gone=len(gone))
    return True


def catch_up(rows: IndexRows, root: Path, io: FileIO, *, durable: bool,
             stripe: Callable[[str], threading.Lock], forget: Callable[[tuple[str, str]], None],
             closed: Callable[[], bool]) -> int:
    """:func:`reconcile` for a store in use; returns how many rows it re-derived.

    Each transcript that looks changed is looked at again under its ``stripe`` lock, where no
    write of the store is half-way, so a session written meanwhile is left alone; ``forget``
    makes the store validate a re-derived transcript again on its next use. Stops early once
    ``closed()``.
    """
    with rows.op("reading the session index"):
        known = rows.index.sizes()
    on_disk = scan_transcripts(root)  # after `known`: a session created in between is seen
    suspects = [ident for ident, size in on_disk.items() if known.get(ident) != size]
    suspects += known.keys() - on_disk.keys()
    repaired = 0
    for user, key in suspects:
        with stripe(key):
            if closed():
                break
            path = transcript_file(root, user, key)
            with rows.op("reading the session index"):
                row = rows.index.get(user, key)
            try:
                st = path.lstat()
                size = st.st_size if stat.S_ISREG(st.st_mode) else None
            except FileNotFoundError:
                size = None
            if (row[1] if row is not None else None) == size:
                continue
            if size is not None:
                try:
                    recover_tail(path, io, durable=durable)
                except StorageError as err:
                    log.error("transcript.recovery_failed", user=user, session=key, error=str(err))
                    continue
            forget((user, key))
            rows.refresh(user, key)
            repaired += 1
    if repaired:
        log.info("sessions.caught_up", transcripts=len(on_disk), refreshed=repaired)
    return repaired
