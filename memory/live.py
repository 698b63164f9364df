"""The parts of one open index file, between a service's start and its close (or the swap of a
file that failed its integrity check): the writer and its indexer, the read connections, and
what searches keep in memory for this file (the vector pre-filter's sign bits and the counts
of common words). Dropping a :class:`LiveIndex` drops that state with it, so a restarted or
swapped index reloads it, and two services never share it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from memory.config import MemoryConfig
from memory.episodes import Episodes
from memory.facts import Facts
from memory.index.db import OpenedIndex, ReaderPool, WriteConnection
from memory.index.indexing import Indexer
from memory.index.knn import SignIndex
from memory.retrieval.common_terms import CommonTerms

__all__ = ["LiveIndex"]


@dataclass(slots=True)
class LiveIndex:
    conn: WriteConnection
    indexer: Indexer
    readers: ReaderPool
    signs: SignIndex = field(default_factory=SignIndex)
    common: CommonTerms = field(default_factory=CommonTerms)
    facts: Facts | None = None
    episodes: Episodes | None = None

    @classmethod
    def wire(cls, opened: OpenedIndex, db_path: Path, sessions_dir: Path, config: MemoryConfig, *,
             window: int | None, vec_extension: str | None) -> LiveIndex:
        """The parts on a freshly opened file; ``window`` is the embedder's token window."""
        conn = WriteConnection(opened.db)
        indexer = Indexer.on(conn, opened.vectors, sessions_dir, config, window=window)
        readers = ReaderPool(db_path, vec_extension if opened.vectors.available else None,
                             mmap_bytes=config.read_mmap_mb << 20)
        return cls(conn, indexer, readers)

    def close(self) -> None:
        """Blocking: call it in a worker thread."""
        # Readers first: only a read-write connection closing last checkpoints the WAL into
        # memory.db and removes it, leaving one self-contained file after a clean stop.
        self.readers.close()
        self.conn.close()
