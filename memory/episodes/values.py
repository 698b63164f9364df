"""The values of episodic memory, on either backend: an episode's row (:class:`Episode`), one
about to be written (:class:`EpisodeDraft`), a queued summary still to write
(:class:`EpisodeJob`) and one found by a search (:class:`ScoredEpisode`).

Plain values with no storage behind them, so :mod:`memory.protocols`, :mod:`memory.context`
and both backends (:mod:`memory.episodes.store` over SQLite, :mod:`memory.pg.episodes` over
PostgreSQL) import them from here rather than from an implementation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

__all__ = ["Episode", "EpisodeDraft", "EpisodeJob", "ScoredEpisode"]


@dataclass(frozen=True, slots=True)
class Episode:
    id: int
    user: str
    session_key: str
    text: str
    theme: str
    day: str
    week: str
    year: int
    created_ms: int
    updated_ms: int
    covered_ms: int
    merges: int

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> Episode:
        return cls(int(row[0]), str(row[1]), str(row[2]), str(row[3]), str(row[4]), str(row[5]), str(row[6]),
                   int(row[7]), int(row[8]), int(row[9]), int(row[10]), int(row[11]))


@dataclass(frozen=True, slots=True)
class EpisodeDraft:
    user: str
    session_key: str
    text: str
    theme: str
    moment: datetime  # when it was written, in the user's time zone
    covered_ms: int
    vector: Sequence[float] | None = None
    vector_model: str | None = None
    job_id: int | None = None  # the queued job this finishes, in the same transaction


@dataclass(frozen=True, slots=True)
class EpisodeJob:
    id: int
    user: str
    session_key: str
    attempts: int


@dataclass(frozen=True, slots=True)
class ScoredEpisode:
    episode: Episode
    score: float
