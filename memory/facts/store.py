"""The ``facts`` table: blocking reads and writes of remembered facts, one user at a time.

Every write runs under the index's write lock in one transaction, so the dedup decision
(exact hash, then the closest active vector) and the write it leads to cannot interleave with
another run saving a fact for the same user. Callers run these functions off the event loop.

A change never edits a fact's text in place: it inserts the next version (``previous_id``
pointing back, ``origin_id`` shared by every version) and marks the old one inactive, so
``history`` can show how a fact changed. Deleting a fact removes every version of it.

The values (:class:`Fact`, :class:`FactChange`, :class:`FactDraft`) live in
:mod:`memory.facts.values`, storage-neutral; they are re-exported here.
"""

from __future__ import annotations

import hashlib
import math
import operator
import re
import unicodedata
from array import array
from collections.abc import Sequence
from datetime import UTC, datetime

import apsw

from memory.errors import FactNotFound, InvalidFact
from memory.facts.values import Action, Fact, FactChange, FactDraft

__all__ = ["Action", "Fact", "FactChange", "FactDraft", "FactStore", "normalise", "text_hash"]

_SPACE = re.compile(r"\s+")
_COLUMNS = ("id, user, text, active, previous_id, origin_id, source, session_key, run_id, "
            "created_at, updated_at")


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


def _now() -> tuple[str, int]:
    now = datetime.now(UTC)
    return now.isoformat(timespec="milliseconds").replace("+00:00", "Z"), int(now.timestamp() * 1000)


def _blob(vector: Sequence[float] | None) -> bytes | None:
    return None if vector is None else array("f", vector).tobytes()


def _vector(blob: bytes) -> list[float]:
    return list(array("f", bytes(blob)))


class FactStore:
    """Facts on an apsw connection; every method is blocking."""

    def __init__(self, dedup_threshold: float, max_chars: int, max_per_user: int) -> None:
        self.dedup_threshold = dedup_threshold
        self.max_chars = max_chars
        self.max_per_user = max_per_user

    # -- reads ---------------------------------------------------------------------------

    def get(self, db: apsw.Connection, user: str, fact_id: int) -> Fact:
        row = db.execute(f"SELECT {_COLUMNS} FROM facts WHERE id = ? AND user = ?", (fact_id, user)).fetchone()
        if row is None:
            raise FactNotFound(f"fact {fact_id} not found")
        return Fact.from_row(row)

    def page(self, db: apsw.Connection, user: str, *, limit: int, before: int | None = None,
             include_inactive: bool = False) -> list[Fact]:
        """Newest first; ``before`` is the id of the last fact of the previous page."""
        rows = db.execute(
            f"SELECT {_COLUMNS} FROM facts WHERE user = ? AND (? OR active = 1) AND id < ? "
            "ORDER BY id DESC LIMIT ?",
            (user, include_inactive, before if before is not None else 1 << 62, limit),
        )
        return [Fact.from_row(r) for r in rows]

    def history(self, db: apsw.Connection, user: str, fact_id: int) -> list[Fact]:
        """Every version of the fact ``fact_id`` belongs to, oldest first."""
        fact = self.get(db, user, fact_id)
        rows = db.execute(f"SELECT {_COLUMNS} FROM facts WHERE user = ? AND (id = ? OR origin_id = ?) ORDER BY id",
                          (user, fact.origin_id, fact.origin_id))
        return [Fact.from_row(r) for r in rows]

    def active_with_vectors(self, db: apsw.Connection, user: str,
                            vector_model: str | None) -> list[tuple[Fact, list[float] | None]]:
        """The user's active facts, each with its vector when it was made by ``vector_model``."""
        rows = db.execute(f"SELECT {_COLUMNS}, vector, vector_model FROM facts WHERE user = ? AND active = 1 "
                          "ORDER BY id", (user,))
        out: list[tuple[Fact, list[float] | None]] = []
        for row in rows:
            vec = _vector(row[11]) if row[11] is not None and vector_model and row[12] == vector_model else None
            out.append((Fact.from_row(row), vec))
        return out

    # -- writes --------------------------------------------------------------------------

    def check_text(self, text: str) -> str:
        clean = " ".join(text.split())
        if not clean:
            raise InvalidFact("text", "must not be empty")
        if len(clean) > self.max_chars:
            raise InvalidFact("text", f"is {len(clean)} characters; the limit is {self.max_chars} "
                                      "(memory.facts_max_chars)")
        return clean

    def save(self, db: apsw.Connection, draft: FactDraft) -> FactChange:
        """Insert, merge or replace, in one transaction (see the module docstring)."""
        text = self.check_text(draft.text)
        digest = text_hash(text)
        with db:
            replaced: Fact | None = None
            if draft.replaces is not None:
                replaced = self.get(db, draft.user, draft.replaces)
                if not replaced.active:
                    raise InvalidFact("replaces", f"fact {draft.replaces} was already replaced or deleted")
            same = db.execute(f"SELECT {_COLUMNS} FROM facts WHERE user = ? AND text_hash = ? AND active = 1",
                              (draft.user, digest)).fetchone()
            if same is not None:
                fact = Fact.from_row(same)
                if replaced is not None and replaced.id != fact.id:
                    # The correction says what another fact already says: the old one goes.
                    self._retire(db, replaced.id)
                return FactChange("unchanged", self._touch(db, fact))
            similarity: float | None = None
            if replaced is None and draft.vector is not None:
                replaced, similarity = self._closest(db, draft)
            if replaced is None:
                count = db.execute("SELECT count(*) FROM facts WHERE user = ? AND active = 1",
                                   (draft.user,)).fetchone()
                if count is not None and int(count[0]) >= self.max_per_user:
                    raise InvalidFact("text", f"{self.max_per_user} facts are remembered already "
                                              "(memory.facts_max_per_user); delete some first")
            new = self._insert(db, draft, text, digest, replaced)
        if replaced is None:
            return FactChange("added", new)
        action: Action = "updated" if similarity is not None else "replaced"
        return FactChange(action, new, replaced.id, similarity)

    def delete(self, db: apsw.Connection, user: str, fact_id: int) -> FactChange:
        """Remove the fact and every earlier version of it."""
        with db:
            fact = self.get(db, user, fact_id)
            db.execute("DELETE FROM facts WHERE user = ? AND (id = ? OR origin_id = ?)",
                       (user, fact.origin_id, fact.origin_id))
        return FactChange("deleted", fact)

    def delete_derived(self, db: apsw.Connection, user: str, session_key: str | None,
                       after_ms: int | None, before_ms: int | None) -> int:
        """Delete every fact (all versions) any of whose versions came from the matching
        conversation: memory.forget's "facts derived from them"."""
        with db:
            origins = [int(r[0]) for r in db.execute(
                "SELECT DISTINCT coalesce(origin_id, id) FROM facts WHERE user = ? AND source = 'model' "
                "AND (? IS NULL OR session_key = ?) AND (? IS NULL OR said_ms >= ?) "
                "AND (? IS NULL OR said_ms < ?)",
                (user, session_key, session_key, after_ms, after_ms, before_ms, before_ms))]
            for origin in origins:
                db.execute("DELETE FROM facts WHERE user = ? AND (id = ? OR origin_id = ?)", (user, origin, origin))
        return len(origins)

    def delete_older_than(self, db: apsw.Connection, cutoff_ms: int) -> int:
        """Retention: facts whose newest version is older than the cutoff, all versions."""
        with db:
            origins = [int(r[0]) for r in db.execute(
                "SELECT coalesce(origin_id, id) FROM facts WHERE active = 1 AND said_ms < ?", (cutoff_ms,))]
            for origin in origins:
                db.execute("DELETE FROM facts WHERE id = ? OR origin_id = ?", (origin, origin))
        return len(origins)

    def store_vectors(self, db: apsw.Connection, rows: Sequence[tuple[int, Sequence[float]]], model: str) -> None:
        with db:
            for fact_id, vec in rows:
                db.execute("UPDATE facts SET vector = ?, vector_model = ? WHERE id = ?", (_blob(vec), model, fact_id))

    def _closest(self, db: apsw.Connection, draft: FactDraft) -> tuple[Fact | None, float | None]:
        assert draft.vector is not None
        best: tuple[Fact, float] | None = None
        for fact, vec in self.active_with_vectors(db, draft.user, draft.vector_model):
            if vec is None or len(vec) != len(draft.vector):
                continue
            sim = cosine(draft.vector, vec)
            if sim >= self.dedup_threshold and (best is None or sim > best[1]):
                best = (fact, sim)
        return (best[0], best[1]) if best else (None, None)

    def _insert(self, db: apsw.Connection, draft: FactDraft, text: str, digest: str,
                replaced: Fact | None) -> Fact:
        stamp, ms = _now()
        if replaced is not None:
            self._retire(db, replaced.id)
        origin = replaced.origin_id if replaced is not None else None
        db.execute(
            "INSERT INTO facts(user, text, text_hash, active, previous_id, origin_id, source, session_key, "
            "run_id, created_at, updated_at, said_ms, vector, vector_model) "
            "VALUES (?, ?, ?, 1, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (draft.user, text, digest, replaced.id if replaced else None, origin, draft.source,
             draft.session_key, draft.run_id, stamp, stamp, ms, _blob(draft.vector),
             draft.vector_model if draft.vector is not None else None),
        )
        return self.get(db, draft.user, db.last_insert_rowid())

    def _retire(self, db: apsw.Connection, fact_id: int) -> None:
        stamp, _ = _now()
        db.execute("UPDATE facts SET active = 0, updated_at = ? WHERE id = ?", (stamp, fact_id))

    def _touch(self, db: apsw.Connection, fact: Fact) -> Fact:
        stamp, ms = _now()
        db.execute("UPDATE facts SET updated_at = ?, said_ms = ? WHERE id = ?", (stamp, ms, fact.id))
        return self.get(db, fact.user, fact.id)
