"""make bench-cluster's own parts: the bulk load that puts the scale corpus into PostgreSQL writes
what the sessions store itself would, and the report reads a results file into its table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest

from bench.clusterreport import recall_gaps, rows, write_markdown
from bench.clustersearch import load_transcripts
from bench.corpus import USER
from sessions import PgSessionStore, SessionsConfig, SessionStore


def test_bulk_load_reads_back_through_the_store_and_appends_after_it(
    tmp_path: Path, pg_dsn: str
) -> None:
    """Sessions copied from transcripts read back through PgSessionStore with the same messages,
    counts and byte totals as the file store's, and the next append gets the next seq."""
    files = SessionStore(tmp_path, SessionsConfig(fsync="never"))
    keys = []
    for s in range(2):
        key = files.create(USER, title=f"t{s}").session_key
        keys.append(key)
        for i in range(3 + s):
            files.append_message(USER, key, role="user" if i % 2 == 0 else "assistant",
                                 content=f"s{s} m{i}", run_id=f"r{i // 2}")
    want = {k: files.recent_messages(USER, k, 50) for k in keys}
    sizes = {k: files.transcript_path(USER, k).stat().st_size for k in keys}
    files.close()

    loaded = load_transcripts(tmp_path, pg_dsn)

    assert (loaded["sessions"], loaded["messages"]) == (2, 7)
    with PgSessionStore(pg_dsn, pool_size=1) as store:
        for key in keys:
            got = store.recent_messages(USER, key, 50)
            assert [(m.id, m.role, m.content, m.ts, m.run_id) for m in got] == \
                   [(m.id, m.role, m.content, m.ts, m.run_id) for m in want[key]]
            assert store.get(USER, key).message_count == len(want[key])
        extra = store.append_message(USER, keys[0], role="user", content="one more")
        assert [m.id for m in store.recent_messages(USER, keys[0], 50)][-1] == extra.id
    with psycopg.connect(pg_dsn) as conn:
        header = {k: len(files_header(tmp_path, k)) for k in keys}
        for key in keys[1:]:
            row = conn.execute("SELECT bytes FROM recalld_sessions WHERE session_key = %s",
                               (key,)).fetchone()
            assert row is not None and row[0] == sizes[key] - header[key]


def files_header(root: Path, key: str) -> bytes:
    """The header line of a transcript (with its newline): not a message, so not counted."""
    path = next(root.rglob(f"{key}.jsonl"))
    return path.read_bytes().split(b"\n", 1)[0] + b"\n"


def test_the_report_tables_every_measured_figure_and_the_recall_gaps(tmp_path: Path) -> None:
    """A results file with RPC, fan-out, index and recall figures gives one row each, and
    recall_gaps is PostgreSQL minus SQLite per granularity and mode."""
    topo: dict[str, Any] = {
        "rpc": {k: {"rate": 1000.0}
                for k in ("health ping-pong", "health pipelined", "sessions.list pipelined")},
        "fanout": {"last": {"p50": 10.0, "p99": 20.0}},
        "index": {"rate": 5.0, "messages": 10, "lagAfterLastFinalMs": 100.0},
    }
    recall = {f"{b}/{g}": {"keyword": 0.5, "vector": 0.9,
                           "hybrid": 0.9 - (0.005 if b == "postgres" else 0)}
              for b in ("sqlite", "postgres") for g in ("chunk", "turn")}
    out = {"at": "2026-11-26T09:00:00", "machine": {"cpuCount": 2, "cpu": "x"},
           "loadAverage": [1.0, 1.0, 1.0],
           "seconds": 1.0, "quick": True, "sizes": {}, "sections": ["rpc"],
           "results": {"sqlite-1": topo, "pg-1": topo, "pg-2": topo, "recall": recall}}

    labels = [r[0] for r in rows(out)]

    assert len(labels) == 3 + 3 + 2
    assert recall_gaps(out)["turn/hybrid"] == pytest.approx(-0.005)
    assert recall_gaps(out)["chunk/keyword"] == 0
    text = write_markdown(out, tmp_path / "cluster.md")
    assert "| RPC health pipelined (calls/s, 16 connections) | 1,000 | 1,000 | 1,000 |" in text
