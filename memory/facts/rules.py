"""The rules of remembering a fact, on either backend: what makes two facts one, which
near-duplicate a new fact merges into, the limits a save is checked against, and how a
fact's times and vector are kept.

Pure functions over plain values, so the SQLite store (:mod:`memory.sqlite.facts`) and the
PostgreSQL one (:mod:`memory.pg.facts`) run the same dedup decision inside their own
transaction, each with its own SQL, and cannot drift apart.
"""

from __future__ import annotations

import hashlib
import math
import operator
import re
import unicodedata
from array import array
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from memory.errors import InvalidFact
from memory.facts.values import Action, Fact, FactChange

__all__ = [
    "FactRules",
    "check_replaceable",
    "cosine",
    "normalise",
    "now_stamps",
    "saved",
    "text_hash",
    "vector_blob",
    "vector_of",
    "with_vectors",
]

_SPACE = re.compile(r"\s+")


def normalise(text: str) -> str:
    """What exact dedup compares: NFKC, case-folded, spaces collapsed, end punctuation dropped,
    so "Luna is 3." and "luna is 3" are one fact."""
    folded = unicodedata.normalize("NFKC", text).casefold()
    return _SPACE.sub(" ", folded).strip().rstrip(".!。 ")


def text_hash(text: str) -> str:
    return hashlib.sha256(normalise(text).encode()).hexdigest()


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    # map/hypot loop in C; a Python generator over zip made the facts pick the slowest step of
    # a run with facts on (bench/facts.py).
    na, nb = math.hypot(*a), math.hypot(*b)
    return sum(map(operator.mul, a, b)) / (na * nb) if na and nb else 0.0


class FactRules:
    """The limits a save is checked against (``memory.facts_*``) and the semantic dedup pick;
    both fact stores are built on it, so they refuse and merge alike."""

    def __init__(self, dedup_threshold: float, max_chars: int, max_per_user: int) -> None:
        self.dedup_threshold = dedup_threshold
        self.max_chars = max_chars
        self.max_per_user = max_per_user

    def check_text(self, text: str) -> str:
        """The text a fact is saved with (spaces collapsed); InvalidFact when empty, too long or
        holding a NUL."""
        clean = " ".join(text.split())
        if not clean:
            raise InvalidFact("text", "must not be empty")
        if "\x00" in clean:
            # PostgreSQL text cannot hold it: refused on both fact stores alike, as bad input.
            raise InvalidFact("text", "must not contain NUL characters")
        if len(clean) > self.max_chars:
            raise InvalidFact("text", f"is {len(clean)} characters; the limit is {self.max_chars} "
                                      "(memory.facts_max_chars)")
        return clean

    def check_room(self, active: int) -> None:
        """A new fact (not a change of one) needs room under ``memory.facts_max_per_user``;
        ``active`` is how many the user has."""
        if active >= self.max_per_user:
            raise InvalidFact("text", f"{self.max_per_user} facts are remembered already "
                                      "(memory.facts_max_per_user); delete some first")

    def closest(self, vector: Sequence[float],
                candidates: Iterable[tuple[Fact, list[float] | None]],
                ) -> tuple[Fact | None, float | None]:
        """Semantic dedup: the active fact most like ``vector`` at a cosine of
        ``dedup_threshold`` or more, and that cosine; ``(None, None)`` when none is. Facts
        without a vector of the same model and size are passed over."""
        best: tuple[Fact, float] | None = None
        for fact, vec in candidates:
            if vec is None or len(vec) != len(vector):
                continue
            sim = cosine(vector, vec)
            if sim >= self.dedup_threshold and (best is None or sim > best[1]):
                best = (fact, sim)
        return (best[0], best[1]) if best else (None, None)


def check_replaceable(fact: Fact) -> Fact:
    """Only an active version can be replaced (a correction of a correction names the newest)."""
    if not fact.active:
        raise InvalidFact("replaces", f"fact {fact.id} was already replaced or deleted")
    return fact


def saved(new: Fact, replaced: Fact | None, similarity: float | None) -> FactChange:
    """What a save that wrote ``new`` did: added, or (merged by similarity) updated, or
    replaced the fact the caller named."""
    if replaced is None:
        return FactChange("added", new)
    action: Action = "updated" if similarity is not None else "replaced"
    return FactChange(action, new, replaced.id, similarity)


def now_stamps() -> tuple[str, int]:
    """A fact's times: ISO milliseconds with ``Z`` (``created_at``/``updated_at``), and epoch
    milliseconds (``said_ms``, what forgetting and retention compare)."""
    now = datetime.now(UTC)
    stamp = now.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return stamp, int(now.timestamp() * 1000)


def vector_blob(vector: Sequence[float] | None) -> bytes | None:
    """A fact's vector as stored: float32, native order."""
    return None if vector is None else array("f", vector).tobytes()


def vector_of(blob: bytes) -> list[float]:
    return list(array("f", bytes(blob)))


def with_vectors(rows: Iterable[Sequence[Any]],
                 vector_model: str | None) -> list[tuple[Fact, list[float] | None]]:
    """Fact rows read with their ``vector, vector_model`` columns last (both stores' query):
    each fact with its vector when ``vector_model`` made it, else None."""
    out: list[tuple[Fact, list[float] | None]] = []
    for row in rows:
        vec = (vector_of(row[12]) if row[12] is not None and vector_model
               and row[13] == vector_model else None)
        out.append((Fact.from_row(row), vec))
    return out
