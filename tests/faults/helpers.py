"""Shared tools of the fault suite: a subprocess daemon that never blocks on its log pipe, and
the two invariants every case checks — transcripts valid with every acknowledged message in
them, and the index equal to what the transcripts say it should be."""

from __future__ import annotations

import asyncio
import os
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from gateway.client import Client
from memory.chunking import chunk_messages
from memory.config import MemoryConfig
from memory.sqlite.index.db import open_index
from sessions import (
    SUMMARY_TYPE,
    ForwardReader,
    scan_transcripts,
    sessions_root,
    transcript_file,
    transcript_relpath,
)
from tests.conftest import TOKEN
from tests.daemon import Daemon
from tests.fake_openai import FakeOpenAI

__all__ = [
    "Acked",
    "FaultDaemon",
    "check_index",
    "check_transcripts",
    "daemon_env",
    "wait_synced",
]


class FaultDaemon(Daemon):
    """``recalld serve`` as a child process whose stdout/stderr are drained by threads, so a
    chatty daemon never stalls on a full pipe; log records accumulate in ``lines``."""

    def __init__(self, data_dir: Path, *args: str, env: dict[str, str] | None = None) -> None:
        super().__init__(data_dir, *args, env=env)
        self._drains = [threading.Thread(target=self._drain, args=(s, True), daemon=True)
                        for s in (self.proc.stderr,)]
        self._drains.append(threading.Thread(target=self._drain, args=(self.proc.stdout, False),
                                             daemon=True))
        for t in self._drains:
            t.start()

    def _drain(self, stream: Any, parse: bool) -> None:
        for line in stream:
            if parse:
                try:
                    record = orjson.loads(line)
                except orjson.JSONDecodeError:
                    continue
                if isinstance(record, dict):
                    self.lines.append(record)

    @classmethod
    async def start(cls, data_dir: Path, *args: str,
                    env: dict[str, str] | None = None) -> FaultDaemon:
        # Off the loop: the daemon may call a fake server that this test's loop serves.
        return await asyncio.to_thread(cls, data_dir, *args, env=env)

    def events(self, name: str) -> list[dict[str, Any]]:
        return [r for r in list(self.lines) if r.get("event") == name]

    def _finish(self, timeout: float) -> int:
        code = self.proc.wait(timeout=timeout)
        for t in self._drains:
            t.join(timeout=5)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()
        return code

    def stop(self, sig: int = 15, timeout: float = 30.0) -> tuple[int, str]:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self._finish(timeout), ""

    async def astop(self, sig: int = 15, timeout: float = 30.0) -> int:
        return (await asyncio.to_thread(self.stop, sig, timeout))[0]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self._finish(30)

    async def akill(self) -> None:
        await asyncio.to_thread(self.kill)


def daemon_env(fake: FakeOpenAI | None = None, *, embed: bool = False,
               **extra: str) -> dict[str, str]:
    """Environment for a subprocess daemon: fast index debounce, the fake model (and
    embedder)."""
    env = {"RECALLD_MEMORY_DEBOUNCE_MS": "50", "RECALLD_SESSIONS_FSYNC": "never"}
    if fake is not None:
        env.update({"RECALLD_LLM_BASE_URL": fake.base_url, "RECALLD_LLM_API_KEY": "sk-test",
                    "RECALLD_LLM_MODEL": "fake-model", "RECALLD_LLM_MAX_RETRIES": "0",
                    "RECALLD_LLM_TIMEOUT_S": "10"})
        if embed:
            env.update({"RECALLD_MEMORY_EMBEDDER": "openai",
                        "RECALLD_MEMORY_EMBEDDINGS_MODEL": "fake-embed",
                        "RECALLD_MEMORY_EMBEDDINGS_MAX_RETRIES": "1"})
    env.update(extra)
    return env


@dataclass
class Acked:
    """User messages whose ``chat.send`` was acknowledged: (user, sessionKey) -> runId -> text."""

    by_session: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)

    def add(self, session_key: str, run_id: str, message: str, user: str = "default") -> None:
        self.by_session.setdefault((user, session_key), {})[run_id] = message

    def __len__(self) -> int:
        return sum(len(v) for v in self.by_session.values())


def check_transcripts(data_dir: Path,
                      acked: Acked | None = None) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """Every transcript is whole lines of JSON (header first, then messages and updates); every
    acknowledged user message is there exactly once. Returns the parsed lines per (user,
    sessionKey)."""
    found: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for path in sorted((data_dir / "sessions").glob("*/*.jsonl")):
        raw = path.read_bytes()
        assert raw.endswith(b"\n"), f"{path.name}: does not end on a whole line"
        lines = [orjson.loads(line) for line in raw.splitlines()]
        assert lines[0]["type"] == "session", f"{path.name}: no header"
        # Messages, the update lines a title written after the first reply adds, and the summary
        # lines compaction writes once enough messages have left the history window.
        assert all(line["type"] in ("message", "update", SUMMARY_TYPE)
                   for line in lines[1:]), path.name
        found[(path.parent.name, path.stem)] = lines
    for ident, runs in (acked.by_session if acked else {}).items():
        assert ident in found, f"session {ident} with acknowledged messages is gone"
        users = Counter((m.get("runId"), m["content"]) for m in found[ident][1:]
                        if m["type"] == "message" and m["role"] == "user")
        for run_id, text in runs.items():
            assert users[(run_id, text)] == 1, (f"acknowledged message of run {run_id} seen "
                                                f"{users[(run_id, text)]}x")
    return found


def check_index(data_dir: Path, config: MemoryConfig | None = None, *,
                embedded: bool = False) -> dict[str, int]:
    """The index equals a fresh chunking of every transcript: same files, same chunks (by index,
    text hash and line range), one FTS row per chunk, no duplicates; with ``embedded`` every
    chunk has exactly one vector. Returns the counts."""
    # The fault daemons embed through the loopback OpenAI-compatible fake or not at all: no
    # known input window, so chunk sizes are the ones settled for an unknown window.
    sizes = (config or MemoryConfig()).sized_for(None)
    root = sessions_root(data_dir)
    expected: dict[str, list[tuple[int, str, int, int]]] = {}
    for user, key in sorted(scan_transcripts(root)):
        reader = ForwardReader(transcript_file(root, user, key))
        chunks = chunk_messages(reader, sizes.chunk_tokens, sizes.overlap_tokens)
        expected[transcript_relpath(user, key)] = [
            (c.idx, c.content_hash, c.line_start, c.line_end) for c in chunks]
    db = open_index(data_dir / "memory.db", readonly=True).db
    try:
        def q(sql: str) -> list[Any]:
            return list(db.execute(sql).fetchall())

        dups = q("SELECT path, chunk_idx, count(*) FROM chunks GROUP BY path, chunk_idx "
                 "HAVING count(*) > 1")
        assert not dups, f"duplicated chunks: {dups[:5]}"
        same_text = q("SELECT path, content_hash, line_start, count(*) FROM chunks "
                      "GROUP BY path, content_hash, line_start HAVING count(*) > 1")
        assert not same_text, f"the same chunk stored twice: {same_text[:5]}"
        actual: dict[str, list[tuple[int, str, int, int]]] = {}
        for path, idx, chash, ls, le in q("SELECT path, chunk_idx, content_hash, line_start, "
                                          "line_end FROM chunks ORDER BY path, chunk_idx"):
            actual.setdefault(path, []).append((idx, chash, ls, le))
        files = {r[0] for r in q("SELECT path FROM files")}
        assert files == set(expected), (f"files table {sorted(files ^ set(expected))[:5]} differ "
                                        "from disk")
        for rel, want in expected.items():
            assert actual.get(rel, []) == want, f"{rel}: chunks differ from a fresh chunking"
        assert set(actual) <= set(expected), "chunks of a transcript that is gone"
        n_chunks = q("SELECT count(*) FROM chunks")[0][0]
        n_fts = q("SELECT count(*) FROM chunks_fts")[0][0]
        assert n_fts == n_chunks, f"{n_fts} FTS rows for {n_chunks} chunks"
        orphans = q("SELECT count(*) FROM chunks_fts "
                    "WHERE rowid NOT IN (SELECT id FROM chunks)")[0][0]
        assert orphans == 0, f"{orphans} FTS rows without a chunk"
        n_embedded = q("SELECT count(*) FROM chunks WHERE embedded = 1")[0][0]
        if embedded:
            assert n_embedded == n_chunks, f"{n_chunks - n_embedded} chunks without a vector"
        if q("SELECT 1 FROM sqlite_schema WHERE name = 'chunks_vec'"):
            vec_ids = {r[0] for r in q("SELECT chunk_id FROM chunks_vec")}
            done_ids = {r[0] for r in q("SELECT id FROM chunks WHERE embedded = 1")}
            assert vec_ids == done_ids, f"vectors {len(vec_ids)} != embedded chunks {len(done_ids)}"
        return {"files": len(files), "chunks": n_chunks, "embedded": n_embedded}
    finally:
        db.close()


async def wait_synced(c: Client, *, embedded: bool = False,
                      timeout: float = 120.0) -> dict[str, Any]:
    """Poll memory.status until a sync has run, none is running and (optionally) nothing is
    pending; on timeout the error carries the last status seen. The bound only stops a hung
    daemon: a restart re-chunking and embedding a grown index on a loaded 2-core machine can take
    a minute."""
    status: dict[str, Any] = {}
    try:
        return await _wait_synced(c, embedded, timeout, status)
    except TimeoutError:
        raise TimeoutError(f"memory not synced after {timeout} s; "
                           f"last memory.status: {status}") from None


async def _wait_synced(c: Client, embedded: bool, timeout: float,
                       status: dict[str, Any]) -> dict[str, Any]:
    async with asyncio.timeout(timeout):
        while True:
            status.clear()
            status.update(await c.call("memory.status"))
            if (status["syncCount"] >= 1 and not status["syncing"]
                    and (not embedded or status["pending"] == 0)):
                # One more look: a debounced sync may have been about to start.
                await asyncio.sleep(0.15)
                again: dict[str, Any] = await c.call("memory.status")
                if not again["syncing"] and again["syncCount"] == status["syncCount"]:
                    return again
            await asyncio.sleep(0.05)


async def health_latencies(url: str, n: int, *, interval: float = 0.0,
                           token: str = TOKEN) -> list[float]:
    """``n`` sequential gateway.health round trips on a fresh connection, in seconds."""
    out: list[float] = []
    async with Client.connect(url, token) as c:
        for _ in range(n):
            t0 = time.perf_counter()
            await c.call("gateway.health")
            out.append(time.perf_counter() - t0)
            if interval:
                await asyncio.sleep(interval)
    return out


def percentile(values: Iterable[float], p: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return 0.0
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def status_kib(pid: int, field: str) -> int:
    """One ``kB`` field of ``/proc/PID/status`` (``VmRSS``, ``RssAnon``, …); 0 when absent."""
    prefix = f"{field}:"
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(prefix):
            return int(line.split()[1])
    return 0


def rss_kib(pid: int) -> int:
    return status_kib(pid, "VmRSS")


def rss_anon_kib(pid: int) -> int:
    """The anonymous part of the resident set (the heap, the allocator's arenas): what a leak
    grows. The rest is file-backed, memory.db's pages mapped by its readers among them, which
    grow as the index grows and the kernel may drop."""
    return status_kib(pid, "RssAnon")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def kill_quietly(proc: subprocess.Popen[Any]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=10)
