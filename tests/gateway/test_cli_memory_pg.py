"""`recalld memory` on PostgreSQL beside the nodes: a command never changes the cluster's
embedder, whatever its own configuration picks."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import psycopg

from memory.pg.service import PgMemory
from tests.memory.conftest import quiet_config
from tests.memory.pg.conftest import add_session, pg_index
from tests.memory.test_rebuild_serving import BREAD, LYNX, model_a

__all__ = ["pg_index"]  # the fixture, used by name


async def _index_with_a(dsn: str, data_dir: Path) -> None:
    node = await PgMemory.open(dsn, quiet_config(), model_a(), data_dir=data_dir)
    try:
        await node.sync_now()
    finally:
        await node.close()


def _vectors(dsn: str) -> tuple[str, int]:
    """The recorded embedder and how many chunks have its vector."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT value FROM recalld_memory_meta WHERE key = 'embedder'").fetchone()
        count = conn.execute("SELECT count(embedding) FROM recalld_memory_chunks").fetchone()
    assert row is not None and count is not None
    return str(row[0]), int(count[0])


def recalld(pg_dsn: str, data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`recalld memory …` in its own process (its logging configured there, not in the tests'),
    on PostgreSQL, with the bundled local model as its configuration's embedder."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RECALLD_", "OPENAI_"))}
    env.update(RECALLD_STORAGE_BACKEND="postgres", RECALLD_STORAGE_DSN=pg_dsn,
               RECALLD_MEMORY_EMBEDDER="local")
    return subprocess.run([sys.executable, "-m", "gateway", "--data-dir", str(data_dir),
                           "memory", *args], capture_output=True, text=True, timeout=120,
                          env=env, stdin=subprocess.DEVNULL)


def test_a_command_with_another_embedder_leaves_the_clusters(pg_index: str,
                                                              tmp_path: Path) -> None:
    """`memory index` and `memory status` run where the configuration picks another embedder
    than the nodes' (no daemon on this data dir): the recorded embedder and every vector stay,
    and the status says the command embeds nothing (before, the command started a rebuild of
    every vector for the whole cluster)."""
    add_session(pg_index, "alice", "s1", [LYNX])
    add_session(pg_index, "alice", "s2", [BREAD], start_minute=600)
    asyncio.run(_index_with_a(pg_index, tmp_path / "node"))
    before = _vectors(pg_index)
    indexed = recalld(pg_index, tmp_path / "shell", "index")
    assert indexed.returncode == 0, indexed.stderr
    shown = recalld(pg_index, tmp_path / "shell", "status", "--json")
    assert shown.returncode == 0, shown.stderr
    status = json.loads(shown.stdout)
    assert before == ('["fake", "model-a", "none"]', 2)
    assert _vectors(pg_index) == before
    assert status["provider"] == "local"
    assert "not this command's" in status["vectorSearch"]["reason"]


def test_a_command_on_a_cluster_with_no_embedder_yet_records_its_own(pg_index: str,
                                                                     tmp_path: Path) -> None:
    """Where no embedder is recorded yet (a first build: nothing to undo), `memory index`
    records the one its configuration picks and embeds every chunk, as before."""
    add_session(pg_index, "alice", "s1", [LYNX])
    add_session(pg_index, "alice", "s2", [BREAD], start_minute=600)
    indexed = recalld(pg_index, tmp_path / "shell", "index")
    assert indexed.returncode == 0, indexed.stderr
    recorded, embedded = _vectors(pg_index)
    assert json.loads(recorded)[0] == "local" and embedded == 2
