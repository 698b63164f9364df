"""The memory index: chunks of transcripts, keyword and vector search, facts and episodes.

memory's rules (search requests, fusion, recall, excerpts, facts, episodes, forgetting) live in
this package's neutral modules; each backend is one folder: ``memory/sqlite/`` (the default:
FTS5 and sqlite-vec in one file) and ``memory/pg/`` (PostgreSQL + pgvector). The public surface
is :class:`MemoryService` (the SQLite backend: lifecycle, indexing, search, status) with its
settings (:class:`MemoryConfig`), the embedder choice (:func:`select_embedder`), progress
values and the error tree rooted at :class:`MemoryIndexError`. Modules inside the package may
move; importers outside it use these names. :class:`PgMemory` (``memory.pg``, the same
:class:`Memory` on PostgreSQL) is imported on first use only, since it needs psycopg (the
``postgres`` extra). See docs/memory.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .chunking import approx_tokens, content_terms, iso_to_ms
from .config import EmbedderChoice, MemoryConfig
from .context import RECALL_QUERY_CHARS, MemoryContext, RunMemory
from .embedders.embeddings import Embedder, probe_auto_embedder, select_embedder
from .episodes import Episode, EpisodeDraft, EpisodeJob, Episodes, ScoredEpisode
from .episodes.writer import SUMMARY_INSTRUCTIONS, EpisodeWriter, Summarizer
from .errors import (
    EmbedderError,
    FactNotFound,
    InvalidFact,
    InvalidSearch,
    MemoryIndexError,
    MemoryStorageError,
    MemoryUnavailable,
    SummarizerError,
)
from .facts import (
    BLOCK_CLOSE,
    BLOCK_OPEN,
    BlockFilter,
    Fact,
    FactChange,
    Facts,
    FactsPage,
    MalformedBlock,
    ScoredFact,
    parse_block,
)
from .facts import Action as FactAction
from .facts import normalise as normalise_fact
from .forget_range import ForgetRange
from .off import MemoryOff
from .protocols import EpisodesMemory, FactsMemory, Memory
from .reports import SyncProgress, SyncReport
from .retrieval.excerpts import drop_shown
from .retrieval.recall import CUT_MARK, trim_to_tokens
from .retrieval.request import MAX_QUERY_CHARS, STOPWORDS, SearchHit, SearchResponse, ShownHistory
from .retrieval.timephrases import TimeWindow, find_time_window
from .sqlite.service import MemoryService

if TYPE_CHECKING:
    from .pg.service import PgMemory as PgMemory

__all__ = [
    "STOPWORDS",
    "CUT_MARK",
    "BLOCK_CLOSE",
    "BLOCK_OPEN",
    "BlockFilter",
    "MalformedBlock",
    "parse_block",
    "MAX_QUERY_CHARS",
    "RECALL_QUERY_CHARS",
    "MemoryContext",
    "RunMemory",
    "Embedder",
    "EmbedderChoice",
    "EmbedderError",
    "Episode",
    "EpisodeDraft",
    "EpisodeJob",
    "Episodes",
    "EpisodeWriter",
    "SUMMARY_INSTRUCTIONS",
    "Summarizer",
    "SummarizerError",
    "ScoredEpisode",
    "TimeWindow",
    "find_time_window",
    "Fact",
    "FactAction",
    "FactChange",
    "FactNotFound",
    "Facts",
    "FactsPage",
    "ForgetRange",
    "InvalidFact",
    "ScoredFact",
    "InvalidSearch",
    "MemoryConfig",
    "MemoryIndexError",
    "Memory",
    "MemoryService",
    "MemoryOff",
    "FactsMemory",
    "EpisodesMemory",
    "MemoryStorageError",
    "MemoryUnavailable",
    "SearchHit",
    "ShownHistory",
    "SearchResponse",
    "SyncProgress",
    "SyncReport",
    "approx_tokens",
    "content_terms",
    "drop_shown",
    "iso_to_ms",
    "trim_to_tokens",
    "normalise_fact",
    "probe_auto_embedder",
    "select_embedder",
]


def __getattr__(name: str) -> Any:
    # Not in __all__: a star import must not pull in psycopg.
    if name == "PgMemory":
        from .pg.service import PgMemory

        return PgMemory
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
