"""The parts of one open index file, between a service's start and its close (or the swap of a
file that failed its integrity check): the writer and its indexer, the read connections, and
what searches keep in memory for this file (the vector pre-filter's sign bits and the counts
of common words). Dropping a :class:`LiveIndex` drops that state with it, so a restarted or
swapped index reloads it, and two services never share it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from memory.config import MemoryConfig
from memory.episodes import Episodes
from memory.facts import Facts
from memory.sqlite.common_terms import CommonTerms
from memory.sqlite.index.db import (
    OpenedIndex,
    ReaderPool,
    VectorBackend,
    WriteConnection,
    move_aside,
    open_index,
)
from memory.sqlite.index.indexing import Indexer
from memory.sqlite.index.knn import SignIndex
from sessions import scan_transcripts

__all__ = ["LiveIndex"]

log = structlog.get_logger("memory.service")


@dataclass(slots=True)
class LiveIndex:
    conn: WriteConnection
    indexer: Indexer
    readers: ReaderPool
    backend: VectorBackend
    rebuilt_reason: str  # non-empty when the file was rebuilt from the transcripts, and why
    signs: SignIndex = field(default_factory=SignIndex)
    common: CommonTerms = field(default_factory=CommonTerms)
    facts: Facts | None = None
    episodes: Episodes | None = None

    @classmethod
    async def open(cls, db_path: Path, sessions_dir: Path, config: MemoryConfig, *,
                   window: int | None, vec_extension: str | None,
                   min_free_bytes: int = 0) -> LiveIndex:
        """Open the file (creating it, or moving a corrupt one aside); ``window`` is the
        embedder's token window, ``min_free_bytes`` the free-disk floor of its writes."""
        missing = not await asyncio.to_thread(db_path.exists)
        opened = await asyncio.to_thread(open_index, db_path, vec_extension=vec_extension)
        reason = opened.rebuilt_reason
        if missing and await asyncio.to_thread(lambda: bool(scan_transcripts(sessions_dir))):
            # A deleted index is rebuilt like a corrupt one, and is reported like one.
            reason = f"{db_path.name} was missing; rebuilt from transcripts"
            log.warning("memory.db.missing", path=str(db_path),
                        effect="index rebuilt from transcripts")
        return cls._wire(opened, reason, db_path, sessions_dir, config, window, vec_extension,
                         min_free_bytes)

    async def replace(self, problem: str, db_path: Path, sessions_dir: Path, config: MemoryConfig,
                      *, window: int | None, vec_extension: str | None,
                      min_free_bytes: int = 0) -> LiveIndex:
        """Close this index, whose file failed its integrity check with ``problem``, move the
        file aside and open an empty one in its place (the next sync rebuilds it)."""
        await asyncio.to_thread(self.close)
        moved = await asyncio.to_thread(move_aside, db_path)
        log.error("memory.db.corrupt", path=str(db_path), moved_to=str(moved), error=problem,
                  effect="index rebuilt from transcripts")
        opened = await asyncio.to_thread(open_index, db_path, vec_extension=vec_extension)
        reason = (f"{db_path.name} failed its integrity check ({problem[:80]}); "
                  f"moved to {moved.name}, rebuilt from transcripts")
        return self._wire(opened, reason, db_path, sessions_dir, config, window, vec_extension,
                          min_free_bytes)

    @classmethod
    def _wire(cls, opened: OpenedIndex, rebuilt_reason: str, db_path: Path, sessions_dir: Path,
              config: MemoryConfig, window: int | None, vec_extension: str | None,
              min_free_bytes: int) -> LiveIndex:
        conn = WriteConnection(opened.db, min_free_bytes=min_free_bytes)
        indexer = Indexer.on(conn, opened.vectors, sessions_dir, config, window=window)
        readers = ReaderPool(db_path, vec_extension if opened.vectors.available else None,
                             mmap_bytes=config.read_mmap_mb << 20)
        return cls(conn, indexer, readers, opened.vectors, rebuilt_reason)

    def close(self) -> None:
        """Blocking: call it in a worker thread."""
        # Readers first: only a read-write connection closing last checkpoints the WAL into
        # memory.db and removes it, leaving one self-contained file after a clean stop.
        self.readers.close()
        self.conn.close()
