"""The values of episodic memory, on either backend: an episode's row (:class:`Episode`), one
about to be written (:class:`EpisodeDraft`), a queued summary still to write
(:class:`EpisodeJob`) and one found by a search (:class:`ScoredEpisode`).

Plain values with no storage behind them, so :mod:`memory.protocols`, :mod:`memory.context`
and both backends (:mod:`memory.sqlite.episodes` over SQLite, :mod:`memory.pg.episodes` over
PostgreSQL) import them from here rather than from an implementation.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

__all__ = ["Episode", "EpisodeColumns", "EpisodeDraft", "EpisodeJob", "ScoredEpisode", "dated"]


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
        return cls(int(row[0]), str(row[1]), str(row[2]), str(row[3]), str(row[4]), str(row[5]),
                   str(row[6]), int(row[7]), int(row[8]), int(row[9]), int(row[10]), int(row[11]))


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

    def columns(self) -> EpisodeColumns:
        """What both stores write for this draft, computed once."""
        day, week, year = dated(self.moment)
        blob = None if self.vector is None else array("f", self.vector).tobytes()
        return EpisodeColumns(self.text, self.theme, day, week, year,
                              int(self.moment.timestamp() * 1000), self.covered_ms, blob,
                              self.vector_model if blob is not None else None)


@dataclass(frozen=True, slots=True)
class EpisodeColumns:
    """An episode draft as table columns: its dates (:func:`dated`), its time in ms (created or
    updated), its vector as float32 bytes and that vector's model (None without a vector)."""

    text: str
    theme: str
    day: str
    week: str
    year: int
    ms: int
    covered_ms: int
    vector: bytes | None
    vector_model: str | None


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


def dated(moment: datetime) -> tuple[str, str, int]:
    """ISO date, ISO week (``2026-W47``) and year of ``moment`` in its own time zone."""
    iso = moment.isocalendar()
    return moment.date().isoformat(), f"{iso.year}-W{iso.week:02d}", moment.year
