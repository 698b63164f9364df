"""Connections to the index database: apsw, sqlite-vec, pragmas, migrations, corruption recovery.

``open_index`` is the one factory. The daemon holds one :class:`WriteConnection` (every
change to the index goes through it) and a :class:`ReaderPool` of read-only connections for
searches and status, which WAL lets read while the writer writes. It loads sqlite-vec from the path
given (by default the ``sqlite-vec`` package's own ``loadable_path()``); when loading fails the
connection still works for keyword search and the returned :class:`VectorBackend` says why, and the
failure is logged as a warning — a silent downgrade to keyword-only is a known failure of peer
systems.

A file that is not a database (truncated, overwritten) is moved aside to
``memory.db.corrupt-<ts>`` and a fresh one is created; the index is rebuildable from the
transcripts, and the caller reports ``rebuiltFromTranscripts``.

**Integrity on the start path costs O(1), not O(size).** Opening reads the header and the
schema; a file shorter than the page count its header records (truncated) is refused there
(:func:`_check_length`). ``PRAGMA quick_check`` reads every page — about a second per 100k
chunks — so it is not run here: :class:`IntegrityCheck` runs it on its own read-only
connection after the daemon is serving (``MemoryService``), interruptible by ``close()``, and
a failure there moves the file aside and rebuilds exactly as a failure here would.
"""

from __future__ import annotations

import asyncio
import os
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

import apsw
import structlog

from memory.errors import MemoryStorageError
from memory.sqlite.index.migrations import SCHEMA_VERSION, migrate
from sessions import SchemaTooNew, StorageError, check_free_space

__all__ = [
    "DEFAULT_VEC_EXTENSION",
    "IndexSteps",
    "IntegrityCheck",
    "OpenedIndex",
    "ReaderPool",
    "VectorBackend",
    "WriteConnection",
    "get_meta",
    "move_aside",
    "open_index",
    "set_meta",
]

log = structlog.get_logger("memory.db")

BUSY_TIMEOUT_MS = 5000
# Sentinel: "load the extension shipped by the sqlite-vec package".
DEFAULT_VEC_EXTENSION = "default"


@dataclass(frozen=True, slots=True)
class VectorBackend:
    """Whether sqlite-vec is loaded on a connection, and if not, why."""

    available: bool
    reason: str = ""


@dataclass(slots=True)
class OpenedIndex:
    db: apsw.Connection
    vectors: VectorBackend
    rebuilt_reason: str = ""  # non-empty when a corrupt file was moved aside


def _load_vec(db: apsw.Connection, extension: str | None) -> VectorBackend:
    if extension is None:
        return VectorBackend(False, "sqlite-vec disabled")
    try:
        if extension == DEFAULT_VEC_EXTENSION:
            import sqlite_vec

            extension = sqlite_vec.loadable_path()
        db.enable_load_extension(True)
        try:
            db.load_extension(extension)
        finally:
            db.enable_load_extension(False)
        (version,) = db.execute("SELECT vec_version()").fetchone() or ("?",)
    except Exception as exc:  # ImportError, apsw.ExtensionLoadingError, missing symbol, ...
        return VectorBackend(False, f"sqlite-vec failed to load: {type(exc).__name__}: {exc}")
    return VectorBackend(True, f"sqlite-vec {version}")


def _create_private(path: Path) -> None:
    # The index holds chat text: created 0600 before SQLite sees it, so the -wal and -shm
    # files, which SQLite creates with the database file's mode, are private too.
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600))


def _connect(path: Path, extension: str | None, *,
             readonly: bool) -> tuple[apsw.Connection, VectorBackend]:
    if not readonly and str(path) != ":memory:":  # SQLite's in-memory database has no file
        _create_private(path)
    flags = (apsw.SQLITE_OPEN_READONLY if readonly
             else apsw.SQLITE_OPEN_READWRITE | apsw.SQLITE_OPEN_CREATE)
    db = apsw.Connection(str(path), flags=flags)
    db.set_busy_timeout(BUSY_TIMEOUT_MS)
    vectors = _load_vec(db, extension)
    return db, vectors


def _check_length(db: apsw.Connection, path: Path) -> None:
    """Refuse a main file shorter than its header's page count (a truncated copy or disk).

    SQLite trusts the header's count only while its change counter matches (bytes 24 and 92);
    the WAL may hold pages beyond the file, so a WAL's frames count as present.
    """
    try:
        with path.open("rb") as fh:
            header = fh.read(100)
        size = path.stat().st_size
    except OSError:
        return  # an in-memory or vanished path: the next statement reports it
    if len(header) < 100 or header[:16] != b"SQLite format 3\0" or header[24:28] != header[92:96]:
        return
    page_size = int.from_bytes(header[16:18], "big") or 65536
    pages = int.from_bytes(header[28:32], "big")
    wal = path.with_name(path.name + "-wal")
    if pages * page_size > size and not (wal.exists() and wal.stat().st_size > 32):
        raise apsw.CorruptError(f"{path.name} holds {size} bytes, its header says "
                                f"{pages * page_size}")


def _prepare(db: apsw.Connection, readonly: bool, path: Path, mmap_bytes: int = 0) -> None:
    # The first statement that reads the file is where "not a database" shows up.
    db.execute("SELECT count(*) FROM sqlite_schema").fetchone()
    if not readonly:
        _check_length(db, path)
        db.execute("PRAGMA journal_mode=WAL").fetchone()
        migrate(db)
    if readonly and mmap_bytes:
        db.execute(f"PRAGMA mmap_size={int(mmap_bytes)}").fetchone()
    db.execute("PRAGMA synchronous=NORMAL")  # the index is rebuildable from transcripts
    db.execute("PRAGMA foreign_keys=OFF")


def move_aside(path: Path) -> Path:
    """Rename ``path`` (and its -wal/-shm) to ``<name>.corrupt-<UTC timestamp>``; returns the new
    path."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
    target = path.with_name(f"{path.name}.corrupt-{stamp}")
    os.replace(path, target)
    for suffix in ("-wal", "-shm"):
        side = path.with_name(path.name + suffix)
        if side.exists():
            os.replace(side, target.with_name(target.name + suffix))
    return target


def open_index(
    path: Path,
    *,
    vec_extension: str | None = DEFAULT_VEC_EXTENSION,
    readonly: bool = False,
    mmap_bytes: int = 0,
) -> OpenedIndex:
    """Open (creating and migrating unless ``readonly``) the index at ``path``.

    ``vec_extension``: a loadable path, :data:`DEFAULT_VEC_EXTENSION`, or ``None`` to run
    keyword-only; tests pass a bad path to prove the fallback. ``mmap_bytes``: how much of the
    file a read-only connection maps (``memory.read_mmap_mb``; 0 maps nothing).
    """
    db, vectors = _connect(path, vec_extension, readonly=readonly)
    rebuilt = ""
    try:
        _prepare(db, readonly, path, mmap_bytes)
    except SchemaTooNew:  # a newer recalld's index: kept as it is, for that version
        db.close()
        raise
    except (apsw.NotADBError, apsw.CorruptError) as exc:
        db.close()
        if readonly:
            raise
        moved = move_aside(path)
        rebuilt = (f"{path.name} was unreadable ({type(exc).__name__}); moved to {moved.name}, "
                   "rebuilt from transcripts")
        log.error("memory.db.corrupt", path=str(path), moved_to=str(moved), error=str(exc))
        db, vectors = _connect(path, vec_extension, readonly=False)
        _prepare(db, False, path)
    if not vectors.available and vec_extension is not None and not readonly:
        log.warning("memory.vector_backend.unavailable", reason=vectors.reason,
                    effect="memory search runs keyword-only")
    if not readonly:
        set_meta(db, "schema_version", str(SCHEMA_VERSION))
    return OpenedIndex(db, vectors, rebuilt)


def get_meta(db: apsw.Connection, key: str) -> str | None:
    row = db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
    return None if row is None else str(row[0])


def set_meta(db: apsw.Connection, key: str, value: str | None) -> None:
    if value is None:
        db.execute("DELETE FROM meta WHERE key = ?", (key,))
    else:
        db.execute(
            "INSERT INTO meta(key, value) VALUES (?, ?) ON CONFLICT(key) "
            "DO UPDATE SET value = excluded.value",
            (key, value),
        )


class IntegrityCheck:
    """``PRAGMA quick_check`` of one database file on its own read-only connection.

    :meth:`run` blocks (call it in a worker thread); :meth:`cancel`, from any thread, interrupts
    it, so a daemon stopping mid-check neither waits for a full read nor leaves a reader open
    (which would keep the last writer from checkpointing and removing the WAL).
    """

    def __init__(self, path: Path) -> None:
        self._path = path
        self._lock = threading.Lock()
        self._db: apsw.Connection | None = None
        self._cancelled = False

    def run(self) -> str | None:
        """None when the file passes (or the check was cancelled); else what is wrong."""
        with self._lock:
            if self._cancelled:
                return None
            try:
                self._db = db = apsw.Connection(str(self._path), flags=apsw.SQLITE_OPEN_READONLY)
            except apsw.Error as exc:
                return f"{type(exc).__name__}: {exc}"
        try:
            rows = self._quick_check(db)
        except apsw.InterruptError:
            return None
        except (apsw.NotADBError, apsw.CorruptError) as exc:
            return f"{type(exc).__name__}: {exc}"
        finally:
            with self._lock:
                self._db = None
                db.close()
        return None if rows == ["ok"] else "quick_check: " + "; ".join(rows[:3])

    @staticmethod
    def _quick_check(db: apsw.Connection) -> list[str]:
        # The writer may change the schema while the check reads (a vector rebuild drops and
        # creates chunks_vec): SQLite then answers SQLITE_SCHEMA, which says nothing about the
        # file's health, so the check starts again on the new schema.
        for attempt in range(3):
            try:
                return [str(r[0]) for r in db.execute("PRAGMA quick_check")]
            except apsw.SchemaChangeError:
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def cancel(self) -> None:
        with self._lock:
            self._cancelled = True
            if self._db is not None:
                self._db.interrupt()


class WriteConnection:
    """The one writing connection and the lock that keeps its transactions from interleaving.

    Blocking: used from worker threads. Every step that touches ``db`` holds ``lock`` for its
    whole length (it is re-entrant, so a step may call another). The sync loop never runs two
    syncs at once, but a reindex request, a session delete or a status probe may arrive during
    one.
    """

    def __init__(self, db: apsw.Connection, *, min_free_bytes: int = 0) -> None:
        self.db = db
        self.lock = threading.RLock()
        self.min_free_bytes = min_free_bytes  # the transcripts' floor (sessions.min_free_bytes)
        # Read once here: apsw raises ThreadingViolationError for any use of a connection,
        # even its filename, while another thread runs a statement on it.
        self.directory = Path(db.filename).parent

    def check_room(self, action: str) -> None:
        """MemoryStorageError ("disk almost full …") when the index's file system is below the
        free-disk floor: a write that adds rows is refused before it starts, as an append to a
        transcript is. Deletes never ask: they are how space comes back."""
        try:
            check_free_space(self.directory, self.min_free_bytes)
        except StorageError as exc:
            raise MemoryStorageError(f"{exc.message} (while {action})") from exc

    def close(self) -> None:
        with self.lock:  # a to_thread step of a cancelled sync may still be running
            self.db.close()


_T = TypeVar("_T")


class ReaderPool:
    """Read-only connections, opened on demand and reused; each used by one thread at a time."""

    def __init__(self, path: Path, vec_extension: str | None, *, mmap_bytes: int = 0) -> None:
        self._path = path
        self._vec_extension = vec_extension
        self._mmap_bytes = mmap_bytes
        self._idle: queue.SimpleQueue[apsw.Connection] = queue.SimpleQueue()
        # Held while a reader is handed back and while close() drains the pool, so a search
        # finishing during close() cannot put its connection back after the drain (a leak).
        self._lock = threading.Lock()
        self._closed = False

    def run(self, fn: Callable[[apsw.Connection], _T]) -> _T:
        """``fn(connection)`` on an idle reader (blocking; call it off the event loop)."""
        try:
            db = self._idle.get_nowait()
        except queue.Empty:
            db = open_index(self._path, vec_extension=self._vec_extension, readonly=True,
                            mmap_bytes=self._mmap_bytes).db
        try:
            return fn(db)
        finally:
            with self._lock:
                if self._closed:
                    db.close()
                else:
                    self._idle.put(db)

    def close(self) -> None:
        """Close every idle reader; one still in use is closed when it is handed back."""
        with self._lock:
            self._closed = True
            while True:
                try:
                    self._idle.get_nowait().close()
                except queue.Empty:
                    break


# --- async steps (facts, episodes and the service share one way to reach the database) ---------


async def in_thread(action: str, fn: Callable[..., _T], *args: object) -> _T:
    """Run blocking index work off the event loop; a SQLite failure (disk full, I/O) becomes
    :class:`MemoryStorageError` naming ``action``, which the gateway answers as a storage
    error, not a crash."""
    try:
        return await asyncio.to_thread(fn, *args)
    except apsw.Error as exc:
        raise MemoryStorageError(f"memory index failed while {action}: "
                                 f"{type(exc).__name__}") from exc


async def write_step(conn: WriteConnection, action: str, fn: Callable[..., _T], *args: object,
                     grows: bool = False) -> _T:
    """``fn(db, *args)`` on the writing connection, holding its lock, off the loop; ``grows``:
    it adds rows, so it is refused below the free-disk floor
    (:meth:`WriteConnection.check_room`)."""

    def step() -> _T:
        with conn.lock:
            if grows:
                conn.check_room(action)
            return fn(conn.db, *args)

    return await in_thread(action, step)


async def read_step(readers: ReaderPool, action: str, fn: Callable[[apsw.Connection], _T]) -> _T:
    """``fn(db)`` on a pooled read-only connection, off the loop."""
    return await in_thread(action, readers.run, fn)


class IndexSteps:
    """:class:`memory.steps.Steps` on the index: writes on the one writing connection (its lock
    held, the free-disk floor checked when a step grows the index), reads on a pooled reader."""

    __slots__ = ("_conn", "_readers")

    def __init__(self, conn: WriteConnection, readers: ReaderPool) -> None:
        self._conn = conn
        self._readers = readers

    async def write(self, action: str, fn: Callable[..., _T], *args: object,
                    grows: bool = False) -> _T:
        return await write_step(self._conn, action, fn, *args, grows=grows)

    async def read(self, action: str, fn: Callable[[apsw.Connection], _T]) -> _T:
        return await read_step(self._readers, action, fn)
