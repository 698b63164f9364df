"""Opening the index database: apsw, sqlite-vec, pragmas, migrations, corruption recovery.

``open_index`` is the one factory. It loads sqlite-vec from the path given (by default the
``sqlite-vec`` package's own ``loadable_path()``); when loading fails the connection still
works for keyword search and the returned :class:`VectorBackend` says why, and the failure is
logged as a warning — a silent downgrade to keyword-only is a known failure of peer systems.

A file that is not a database (truncated, overwritten) is moved aside to
``memory.db.corrupt-<ts>`` and a fresh one is created; the index is rebuildable from the
transcripts, and the caller reports ``rebuiltFromTranscripts``.
"""

from __future__ import annotations

import array
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import apsw
import structlog

from memory.migrations import SCHEMA_VERSION, migrate

__all__ = [
    "DEFAULT_VEC_EXTENSION",
    "OpenedIndex",
    "VectorBackend",
    "drop_vector_table",
    "ensure_vector_table",
    "get_meta",
    "open_index",
    "quantize_int8",
    "set_meta",
    "cached_vector_to_int8",
    "vector_format",
    "vector_from_blob",
    "vector_table_dims",
    "vector_to_blob",
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


def _connect(path: Path, extension: str | None, *, readonly: bool) -> tuple[apsw.Connection, VectorBackend]:
    flags = apsw.SQLITE_OPEN_READONLY if readonly else apsw.SQLITE_OPEN_READWRITE | apsw.SQLITE_OPEN_CREATE
    db = apsw.Connection(str(path), flags=flags)
    db.set_busy_timeout(BUSY_TIMEOUT_MS)
    vectors = _load_vec(db, extension)
    return db, vectors


def _prepare(db: apsw.Connection, readonly: bool) -> None:
    # The first statement that reads the file is where "not a database" shows up.
    db.execute("SELECT count(*) FROM sqlite_schema").fetchone()
    if not readonly:
        db.execute("PRAGMA journal_mode=WAL").fetchone()
        migrate(db)
        quick = db.execute("PRAGMA quick_check").fetchone()
        if quick is None or quick[0] != "ok":
            raise apsw.CorruptError(f"quick_check: {quick[0] if quick else 'no answer'}")
    db.execute("PRAGMA synchronous=NORMAL")  # the index is rebuildable from transcripts
    db.execute("PRAGMA foreign_keys=OFF")


def _move_aside(path: Path) -> Path:
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
) -> OpenedIndex:
    """Open (creating and migrating unless ``readonly``) the index at ``path``.

    ``vec_extension``: a loadable path, :data:`DEFAULT_VEC_EXTENSION`, or ``None`` to run
    keyword-only; tests pass a bad path to prove the fallback.
    """
    db, vectors = _connect(path, vec_extension, readonly=readonly)
    rebuilt = ""
    try:
        _prepare(db, readonly)
    except (apsw.NotADBError, apsw.CorruptError) as exc:
        db.close()
        if readonly:
            raise
        moved = _move_aside(path)
        rebuilt = f"{path.name} was unreadable ({type(exc).__name__}); moved to {moved.name}, rebuilt from transcripts"
        log.error("memory.db.corrupt", path=str(path), moved_to=str(moved), error=str(exc))
        db, vectors = _connect(path, vec_extension, readonly=False)
        _prepare(db, False)
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
            "INSERT INTO meta(key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            (key, value),
        )


def vector_table_dims(db: apsw.Connection) -> int | None:
    """The width of ``chunks_vec`` as recorded in meta, or None when it does not exist."""
    exists = db.execute("SELECT 1 FROM sqlite_schema WHERE name = 'chunks_vec'").fetchone()
    if exists is None:
        return None
    dims = get_meta(db, "vector_dims")
    return int(dims) if dims else None


def vector_format(dims: int) -> str:
    """How ``chunks_vec`` stores a ``dims``-wide vector: sign bits when the width allows
    (``bit[D]`` needs a multiple of 8), else int8. Either way the vector leg re-ranks the
    KNN's candidates by cosine over the cached int8 vectors (``memory.search``)."""
    return "bit" if dims % 8 == 0 else "int8"


def ensure_vector_table(db: apsw.Connection, dims: int) -> None:
    """Create ``chunks_vec`` for ``dims``-wide vectors unless it exists (caller's transaction).

    ``user`` is a partition key so a KNN scans only the caller's vectors; session and time
    are metadata columns so the filters apply inside the KNN, before ``k`` is cut. The
    embedding is quantized (``vector_format``): at 384 dims a row costs 48 bytes of bits
    instead of 1,536 of float32, and a KNN over 100k rows is ~10× faster; the precise
    vector lives once, in ``embedding_cache``.
    """
    fmt = vector_format(int(dims))
    if vector_table_dims(db) == dims and get_meta(db, "vector_format") == fmt:
        return
    db.execute("DROP TABLE IF EXISTS chunks_vec")
    column = f"bit[{int(dims)}]" if fmt == "bit" else f"int8[{int(dims)}] distance_metric=cosine"
    db.execute(
        f"""
        CREATE VIRTUAL TABLE chunks_vec USING vec0(
            chunk_id     INTEGER PRIMARY KEY,
            user         TEXT PARTITION KEY,
            embedding    {column},
            session_key  TEXT,
            start_ms     INTEGER,
            end_ms       INTEGER
        )
        """
    )
    set_meta(db, "vector_dims", str(int(dims)))
    set_meta(db, "vector_format", fmt)


def drop_vector_table(db: apsw.Connection) -> None:
    db.execute("DROP TABLE IF EXISTS chunks_vec")
    set_meta(db, "vector_dims", None)
    set_meta(db, "vector_format", None)


def vector_to_blob(vector: Sequence[float]) -> bytes:
    """float32 little-endian, the layout sqlite-vec reads."""
    arr = array.array("f", vector)
    if sys.byteorder != "little":
        arr.byteswap()
    return arr.tobytes()


def quantize_int8(vector: Sequence[float]) -> bytes:
    """int8 with a per-vector scale (largest magnitude → 127): what the cache stores.

    Cosine distance ignores a vector's scale, so ``vec_distance_cosine(vec_int8(a),
    vec_int8(b))`` is the float cosine up to rounding (≤ ~0.4% of an element), and the signs —
    all ``bit`` storage keeps — are unchanged. 1 byte per dimension instead of 4.
    """
    peak = max((abs(x) for x in vector), default=0.0)
    scale = 127.0 / peak if peak > 0 else 0.0
    return array.array("b", [round(x * scale) for x in vector]).tobytes()


def cached_vector_to_int8(blob: bytes, dims: int) -> bytes:
    """A cache blob as int8: rows written before ``m002`` hold float32 (4 bytes a dimension)."""
    if len(blob) == 4 * dims and dims > 0:
        return quantize_int8(vector_from_blob(blob))
    return blob


def vector_from_blob(blob: bytes) -> list[float]:
    arr = array.array("f")
    arr.frombytes(blob)
    if sys.byteorder != "little":
        arr.byteswap()
    return arr.tolist()
