"""The values of remembered facts, on either backend: a fact's version (:class:`Fact`), what a
save or delete did (:class:`FactChange`, :data:`Action`), a draft about to be saved
(:class:`FactDraft`), a page of them (:class:`FactsPage`) and one picked for a prompt
(:class:`ScoredFact`).

Plain values with no storage behind them, so :mod:`memory.protocols`, :mod:`memory.context`
and both backends (:mod:`memory.sqlite.facts` over SQLite, :mod:`memory.pg.facts` over
PostgreSQL) import them from here rather than from an implementation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["Action", "Fact", "FactChange", "FactDraft", "FactsPage", "ScoredFact"]

# What a save or delete did to a fact (docs/protocol.md, chat.final's facts).
Action = Literal["added", "updated", "replaced", "unchanged", "deleted"]


@dataclass(frozen=True, slots=True)
class Fact:
    """One version of a remembered fact."""

    id: int
    user: str
    text: str
    active: bool
    previous_id: int | None
    origin_id: int
    source: str
    session_key: str | None
    run_id: str | None
    created_at: str
    updated_at: str
    # The client token's name it was saved through ("claude"); None for the user's own token,
    # the CLI and the chat's model.
    client: str | None = None

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> Fact:
        return cls(int(row[0]), str(row[1]), str(row[2]), bool(row[3]),
                   None if row[4] is None else int(row[4]),
                   int(row[5] if row[5] is not None else row[0]), str(row[6]), row[7], row[8],
                   str(row[9]), str(row[10]), row[11])


@dataclass(frozen=True, slots=True)
class FactChange:
    """What one save or delete did: the fact as it now stands, and the version it replaced."""

    action: Action
    fact: Fact
    previous_id: int | None = None
    similarity: float | None = None  # for a semantic merge: the cosine that decided it


@dataclass(frozen=True, slots=True)
class FactDraft:
    """A fact about to be saved, with its vector when an embedder is active."""

    user: str
    text: str
    source: str
    replaces: int | None = None
    session_key: str | None = None
    run_id: str | None = None
    vector: Sequence[float] | None = None
    vector_model: str | None = None
    client: str | None = None  # the client token's name (Fact.client)


@dataclass(frozen=True, slots=True)
class FactsPage:
    facts: list[Fact]
    next: int | None  # pass as ``before`` for the next page


@dataclass(frozen=True, slots=True)
class ScoredFact:
    fact: Fact
    score: float
