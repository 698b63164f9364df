"""Fact ids are never given twice: an agent holding a deleted fact's id must not reach
another fact."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import apsw

from gateway.client import Client
from gateway.config import Config
from memory.sqlite.facts import FactDraft, FactStore
from memory.sqlite.index.migrations import MIGRATIONS, migrate
from sessions import apply_migrations, sqlite_ledger
from tests.conftest import TOKEN, running


async def test_a_deleted_facts_id_is_not_given_to_the_next(
        backend_config_factory: Callable[..., Config]) -> None:
    """Deleting the newest fact (and, after a restart, every fact) leaves its id unused: each
    new fact gets an id above every id ever given."""
    cfg = backend_config_factory()
    async with running(cfg) as app, Client.connect(app.url, TOKEN) as c:
        first = (await c.call("memory.facts.add",
                              {"text": "I have a dog called Rex"}))["fact"]["id"]
        second = (await c.call("memory.facts.add", {"text": "I live by the sea"}))["fact"]["id"]
        await c.call("memory.facts.delete", {"id": second})
        third = (await c.call("memory.facts.add", {"text": "I drink my tea black"}))["fact"]["id"]
        assert third > second > first
        for fact_id in (first, third):
            await c.call("memory.facts.delete", {"id": fact_id})
    async with running(cfg) as app, Client.connect(app.url, TOKEN) as c:
        fourth = (await c.call("memory.facts.add", {"text": "I work on Tuesdays"}))["fact"]["id"]
        assert fourth > third


def test_m007_keeps_every_fact_and_stops_reusing_ids(tmp_path: Path) -> None:
    """An index written before m007 keeps its facts, ids and versions through the migration,
    and its newest fact's id, once deleted, is not given to the next."""
    db = apsw.Connection(str(tmp_path / "memory.db"))
    apply_migrations(sqlite_ledger(db), MIGRATIONS[:6])
    # Today's store writes m008's column too; m007 rebuilds the table without it, m008 adds it back.
    db.execute("ALTER TABLE facts ADD COLUMN client TEXT")
    facts = FactStore(dedup_threshold=0.92, max_chars=200, max_per_user=10)
    first = facts.save(db, FactDraft("alice", "Luna is 3", "user")).fact
    fixed = facts.save(db, FactDraft("alice", "Luna is 4", "user", replaces=first.id)).fact
    newest = facts.save(db, FactDraft("alice", "I live by the sea", "model", vector=[1.0, 0.0],
                                      vector_model="m")).fact
    assert migrate(db)[0] == "m007_fact_ids_never_reused"
    assert [f.text for f in facts.history(db, "alice", fixed.id)] == ["Luna is 3", "Luna is 4"]
    assert facts.get(db, "alice", newest.id) == newest
    assert facts.active_with_vectors(db, "alice", "m")[1][1] == [1.0, 0.0]
    facts.delete(db, "alice", newest.id)
    assert facts.save(db, FactDraft("alice", "I drink my tea black", "user")).fact.id > newest.id
