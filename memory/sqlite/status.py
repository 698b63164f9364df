"""What ``memory.status`` reports of the SQLite index that the service does not compute
elsewhere: the row counts and the size of the index files (the record of syncs,
:class:`~memory.reports.SyncLog`, is both backends')."""

from __future__ import annotations

from pathlib import Path

import apsw

__all__ = ["DB_NAME", "count_rows", "db_bytes"]

DB_NAME = "memory.db"


def count_rows(db: apsw.Connection, user: str | None) -> dict[str, int]:
    """Files, chunks, embedded and pending chunks (``user``'s, or all with the embedding cache)."""
    def q(sql: str, *args: str) -> int:
        row = db.execute(sql, args).fetchone()
        return int(row[0]) if row is not None else 0

    if user is not None:
        return {
            "files": q("SELECT count(*) FROM files WHERE user = ?", user),
            "chunks": q("SELECT count(*) FROM chunks WHERE user = ?", user),
            "embedded": q("SELECT count(*) FROM chunks WHERE user = ? AND embedded = 1", user),
            "pending": q("SELECT count(*) FROM chunks WHERE user = ? AND embedded = 0", user),
        }
    return {
        "files": q("SELECT count(*) FROM files"),
        "chunks": q("SELECT count(*) FROM chunks"),
        "embedded": q("SELECT count(*) FROM chunks WHERE embedded = 1"),
        "pending": q("SELECT count(*) FROM chunks WHERE embedded = 0"),
        "cacheEntries": q("SELECT count(*) FROM embedding_cache"),
    }


def db_bytes(data_dir: Path) -> int:
    """memory.db with its -wal and -shm (files moved aside as corrupt are not counted)."""
    return sum(p.stat().st_size for p in data_dir.glob(DB_NAME + "*") if p.is_file()
               and ".corrupt-" not in p.name)
