"""The ``facts`` table: blocking reads and writes of remembered facts, one user at a time.

Every write runs under the index's write lock in one transaction, so the dedup decision
(exact hash, then the closest active vector) and the write it leads to cannot interleave with
another run saving a fact for the same user. Callers run these functions off the event loop.

A change never edits a fact's text in place: it inserts the next version (``previous_id``
pointing back, ``origin_id`` shared by every version) and marks the old one inactive, so
``history`` can show how a fact changed. Deleting a fact removes every version of it.

The values (:class:`Fact`, :class:`FactChange`, :class:`FactDraft`) live in
:mod:`memory.facts.values` and the dedup rule and limits in :mod:`memory.facts.rules`, both
storage-neutral (PostgreSQL runs the same ones); the values and ``normalise``/``text_hash`` are
re-exported here.
"""

from __future__ import annotations

from collections.abc import Sequence

import apsw

from memory.errors import FactNotFound
from memory.facts.rules import (
    FactRules,
    check_replaceable,
    normalise,
    now_stamps,
    saved,
    text_hash,
    vector_blob,
    with_vectors,
)
from memory.facts.values import Action, Fact, FactChange, FactDraft

__all__ = ["Action", "Fact", "FactChange", "FactDraft", "FactStore", "normalise", "text_hash"]

_COLUMNS = ("id, user, text, active, previous_id, origin_id, source, session_key, run_id, "
            "created_at, updated_at, client")


class FactStore(FactRules):
    """Facts on an apsw connection; every method is blocking."""

    # -- reads ---------------------------------------------------------------------------

    def get(self, db: apsw.Connection, user: str, fact_id: int) -> Fact:
        row = db.execute(f"SELECT {_COLUMNS} FROM facts WHERE id = ? AND user = ?",
                         (fact_id, user)).fetchone()
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
        rows = db.execute(f"SELECT {_COLUMNS} FROM facts WHERE user = ? "
                          "AND (id = ? OR origin_id = ?) ORDER BY id",
                          (user, fact.origin_id, fact.origin_id))
        return [Fact.from_row(r) for r in rows]

    def active_with_vectors(self, db: apsw.Connection, user: str,
                            vector_model: str | None) -> list[tuple[Fact, list[float] | None]]:
        """The user's active facts, each with its vector when it was made by ``vector_model``."""
        rows = db.execute(f"SELECT {_COLUMNS}, vector, vector_model FROM facts WHERE user = ? "
                          "AND active = 1 ORDER BY id", (user,))
        return with_vectors(rows, vector_model)

    # -- writes --------------------------------------------------------------------------

    def save(self, db: apsw.Connection, draft: FactDraft) -> FactChange:
        """Insert, merge or replace, in one transaction (see the module docstring)."""
        text = self.check_text(draft.text)
        digest = text_hash(text)
        with db:
            replaced: Fact | None = None
            if draft.replaces is not None:
                replaced = check_replaceable(self.get(db, draft.user, draft.replaces))
            same = db.execute(f"SELECT {_COLUMNS} FROM facts WHERE user = ? AND text_hash = ? "
                              "AND active = 1",
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
                self.check_room(int(count[0]) if count is not None else 0)
            new = self._insert(db, draft, text, digest, replaced)
        return saved(new, replaced, similarity)

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
                "SELECT DISTINCT coalesce(origin_id, id) FROM facts WHERE user = ? "
                "AND source = 'model' AND (? IS NULL OR session_key = ?) "
                "AND (? IS NULL OR said_ms >= ?) AND (? IS NULL OR said_ms < ?)",
                (user, session_key, session_key, after_ms, after_ms, before_ms, before_ms))]
            for origin in origins:
                db.execute("DELETE FROM facts WHERE user = ? AND (id = ? OR origin_id = ?)",
                           (user, origin, origin))
        return len(origins)

    def delete_older_than(self, db: apsw.Connection, cutoff_ms: int) -> int:
        """Retention: facts whose newest version is older than the cutoff, all versions."""
        with db:
            origins = [int(r[0]) for r in db.execute(
                "SELECT coalesce(origin_id, id) FROM facts WHERE active = 1 AND said_ms < ?",
                (cutoff_ms,))]
            for origin in origins:
                db.execute("DELETE FROM facts WHERE id = ? OR origin_id = ?", (origin, origin))
        return len(origins)

    def store_vectors(self, db: apsw.Connection, rows: Sequence[tuple[int, Sequence[float]]],
                      model: str) -> None:
        with db:
            for fact_id, vec in rows:
                db.execute("UPDATE facts SET vector = ?, vector_model = ? WHERE id = ?",
                           (vector_blob(vec), model, fact_id))

    def _closest(self, db: apsw.Connection, draft: FactDraft) -> tuple[Fact | None, float | None]:
        assert draft.vector is not None
        return self.closest(draft.vector,
                            self.active_with_vectors(db, draft.user, draft.vector_model))

    def _insert(self, db: apsw.Connection, draft: FactDraft, text: str, digest: str,
                replaced: Fact | None) -> Fact:
        stamp, ms = now_stamps()
        if replaced is not None:
            self._retire(db, replaced.id)
        origin = replaced.origin_id if replaced is not None else None
        db.execute(
            "INSERT INTO facts(user, text, text_hash, active, previous_id, origin_id, source, "
            "session_key, run_id, created_at, updated_at, said_ms, vector, vector_model, client) "
            "VALUES (?, ?, ?, 1, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (draft.user, text, digest, replaced.id if replaced else None, origin, draft.source,
             draft.session_key, draft.run_id, stamp, stamp, ms, vector_blob(draft.vector),
             draft.vector_model if draft.vector is not None else None, draft.client),
        )
        return self.get(db, draft.user, db.last_insert_rowid())

    def _retire(self, db: apsw.Connection, fact_id: int) -> None:
        stamp, _ = now_stamps()
        db.execute("UPDATE facts SET active = 0, updated_at = ? WHERE id = ?", (stamp, fact_id))

    def _touch(self, db: apsw.Connection, fact: Fact) -> Fact:
        stamp, ms = now_stamps()
        db.execute("UPDATE facts SET updated_at = ?, said_ms = ? WHERE id = ?",
                   (stamp, ms, fact.id))
        return self.get(db, fact.user, fact.id)
