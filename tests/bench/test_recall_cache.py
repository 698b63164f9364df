"""The harness's embedding-cache file fills while a run embeds, not only when it ends."""

from __future__ import annotations

import asyncio
from pathlib import Path

import apsw

from bench import recall


def _rows(path: Path) -> int:
    if not path.exists():
        return 0
    db = apsw.Connection(str(path))
    db.setbusytimeout(10_000)
    try:
        if not db.execute("SELECT 1 FROM sqlite_master WHERE name = 'embedding_cache'").fetchall():
            return 0
        ((count,),) = db.execute("SELECT count(*) FROM embedding_cache").fetchall()
        assert isinstance(count, int)
        return count
    finally:
        db.close()


def _embed(index_db: Path, content_hash: str) -> None:
    db = apsw.Connection(str(index_db))
    db.setbusytimeout(10_000)
    db.execute("CREATE TABLE IF NOT EXISTS embedding_cache(provider TEXT, model TEXT, "
               "endpoint_hash TEXT, content_hash TEXT, dims INTEGER, vector BLOB)")
    db.execute("INSERT INTO embedding_cache VALUES ('local', 'm', 'local', ?, 2, x'0102')",
               (content_hash,))
    db.close()


async def test_vectors_reach_the_cache_file_while_the_sync_still_runs(tmp_path: Path) -> None:
    """A run stopped half-way keeps what it embedded: the copy runs during the sync and once
    after."""
    index_db, cache = tmp_path / "memory.db", tmp_path / "cache.sqlite"
    _embed(index_db, "a")
    release = asyncio.Event()

    async def sync() -> str:
        await release.wait()
        return "synced"

    task = asyncio.ensure_future(recall._keeping(sync(), index_db, cache, every_s=0.01))
    for _ in range(1000):
        if _rows(cache) == 1:
            break
        await asyncio.sleep(0.01)
    assert _rows(cache) == 1 and not task.done()
    _embed(index_db, "b")
    release.set()
    assert await task == "synced"
    assert _rows(cache) == 2
