"""The memory index: chunks of transcripts in SQLite, keyword (FTS5) and vector (sqlite-vec) search.

The public surface is :class:`MemoryService` (lifecycle, indexing, search, status) with its
settings (:class:`MemoryConfig`), the embedder choice (:func:`select_embedder`), progress
values and the error tree rooted at :class:`MemoryIndexError`. Modules inside the package may
move; importers outside it use these names. See docs/memory.md.
"""

from __future__ import annotations

from .chunking import approx_tokens
from .config import EmbedderChoice, MemoryConfig
from .embedders.embeddings import Embedder, probe_auto_embedder, select_embedder
from .episodes import Episode, EpisodeDraft, EpisodeJob, Episodes, EpisodeWire, ScoredEpisode
from .errors import (
                     EmbedderError,
                     FactNotFound,
                     InvalidFact,
                     InvalidSearch,
                     MemoryIndexError,
                     MemoryStorageError,
                     MemoryUnavailable,
)
from .facts import Fact, FactChange, FactChangeWire, Facts, FactsPage, FactWire, ScoredFact
from .facts import normalise as normalise_fact
from .forgetting import ForgetRange
from .index.indexing import SyncProgress
from .index.sync import SyncReport
from .retrieval.request import MAX_QUERY_CHARS, SearchHit, SearchResponse
from .retrieval.timephrases import TimeWindow, find_time_window
from .service import MemoryService

__all__ = [
    "MAX_QUERY_CHARS",
    "Embedder",
    "EmbedderChoice",
    "EmbedderError",
    "Episode",
    "EpisodeDraft",
    "EpisodeJob",
    "Episodes",
    "EpisodeWire",
    "ScoredEpisode",
    "TimeWindow",
    "find_time_window",
    "Fact",
    "FactChange",
    "FactChangeWire",
    "FactNotFound",
    "Facts",
    "FactsPage",
    "FactWire",
    "ForgetRange",
    "InvalidFact",
    "ScoredFact",
    "InvalidSearch",
    "MemoryConfig",
    "MemoryIndexError",
    "MemoryService",
    "MemoryStorageError",
    "MemoryUnavailable",
    "SearchHit",
    "SearchResponse",
    "SyncProgress",
    "SyncReport",
    "approx_tokens",
    "normalise_fact",
    "probe_auto_embedder",
    "select_embedder",
]
