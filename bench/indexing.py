"""4. Appends to long transcripts, local-embedder backfill; 5. event-loop health during a
backfill; 7. sessions.list with 10,000 sessions."""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path

from bench.corpus import USER, bench_memory_config, write_transcripts
from bench.stats import Figure, summary_ms
from gateway.client import Client
from memory.index.db import WriteConnection, open_index
from memory.index.indexing import Indexer
from sessions import SessionsConfig, SessionStore, sessions_root
from testkit.gateway import TOKEN, gateway_config, running_gateway


async def run_appends(quick: bool) -> list[Figure]:
    figs = []
    sizes = [1_000, 10_000] if quick else [1_000, 10_000, 100_000]
    config = bench_memory_config()
    with tempfile.TemporaryDirectory() as tmp:
        for n in sizes:
            root = Path(tmp) / f"t{n}"
            write_transcripts(root, messages=n, per_session=n)
            opened = open_index(root / "memory.db")
            conn = WriteConnection(opened.db)
            indexer = Indexer.on(conn, opened.vectors, sessions_root(root), config)
            await indexer.sync(None)
            samples = []
            with SessionStore(root, SessionsConfig(fsync="never")) as store:
                (session,), _ = store.list(USER, limit=1)
                path = store.transcript_path(USER, session.session_key)
                for i in range(15 if quick else 30):
                    store.append_message(USER, session.session_key, role="user", run_id=f"x{i}",
                                         content=f"one more appended message number {i} about sourdough",
                                         ts="2025-01-01T00:00:00.000Z")
                    t = time.perf_counter()
                    report = await asyncio.to_thread(indexer.files.sync_file, path)
                    samples.append(time.perf_counter() - t)
                    assert report.chunks_written >= 1
            conn.close()
            m = summary_ms(samples)
            figs.append(Figure("4 indexing", f"one appended message, transcript of {n:,} messages", m["p50"], "ms",
                               "≤ 20", m["p50"] <= 20, note=f"p99 {m['p99']:.2f} ms (indexer sync_file, no embedding)"))
    return figs


async def run_query_embedding(quick: bool) -> list[Figure]:
    """The local embedder's time for one query (excluded from the search figures)."""
    try:
        from memory.embedders.local_embedder import LocalEmbedder
    except ImportError as exc:
        return [Figure("3 search", "local embedder query time", float("nan"), "ms", note=f"not installed: {exc}")]
    from bench.corpus import queries

    embedder = LocalEmbedder()
    await embedder.embed(["warm up"])
    samples = []
    for q in queries(10 if quick else 40):
        t = time.perf_counter()
        await embedder.embed([q])
        samples.append(time.perf_counter() - t)
    m = summary_ms(samples)
    return [Figure("3 search", "local embedder: one query embedding (not in search figures)", m["p50"], "ms",
                   note=f"p99 {m['p99']:.1f} ms")]


async def run_backfill_and_loop(quick: bool) -> list[Figure]:
    """Local-embedder backfill rate, and gateway.health latency while it runs."""
    figs: list[Figure] = []
    messages = 150 if quick else 20_000
    window_s = 15.0 if quick else 75.0
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_transcripts(root, messages=messages, per_session=50)
        cfg = gateway_config(root, memory={"embedder": "local", "debounce_ms": 50})
        async with running_gateway(cfg) as app:
            service = app.memory.service  # type: ignore[union-attr]
            if service.embedder is None or service.embedder.provider != "local":
                return [Figure("5 event loop", "local embedder unavailable", float("nan"), "", note=service.embedder_reason)]
            async with Client.connect(app.url, TOKEN) as c:
                lat: list[float] = []
                started = time.perf_counter()
                first_status = await c.call("memory.status")
                status, elapsed = first_status, 0.0
                # Vectors are committed per batch of 256 chunks: stop when done or at the window.
                while time.perf_counter() - started < window_s:
                    for _ in range(50):
                        t = time.perf_counter()
                        await c.call("gateway.health")
                        lat.append(time.perf_counter() - t)
                        await asyncio.sleep(0.01)
                    status = await c.call("memory.status")
                    if status["embedded"] > first_status["embedded"]:
                        elapsed = time.perf_counter() - started
                    if status["pending"] == 0 and status["chunks"] and not status["syncing"]:
                        break
        m = summary_ms(lat)
        figs.append(Figure("5 event loop", f"gateway.health p99 during local backfill ({messages:,} messages)",
                           m["p99"], "ms", "≤ 25", m["p99"] <= 25,
                           note=f"p50 {m['p50']:.2f} ms over {len(lat)} calls in a {window_s:.0f} s window; "
                                f"{status['embedded']} of {status['chunks']} chunks embedded by then"))
        model = f"{service.embedder.model_id} (window {service.embedder.max_tokens})"
        rate = (status["embedded"] - first_status["embedded"]) / elapsed if elapsed else float("nan")
        figs.append(Figure("4 indexing", "local-embedder backfill (through the gateway, 2 cores)", rate, "chunks/s",
                           note=f"{model}, chunks of {cfg.memory.chunk_tokens or 'auto'} approximate tokens "
                                f"({status['chunks']} chunks from {messages:,} messages)"))
    return figs


async def run_sessions_list(quick: bool) -> list[Figure]:
    n = 2_000 if quick else 10_000
    with tempfile.TemporaryDirectory() as tmp:
        cfg = gateway_config(Path(tmp))
        async with running_gateway(cfg) as app:
            t = time.perf_counter()
            for i in range(n):
                app.store.create("default", title=f"session {i}")
            create_s = time.perf_counter() - t
            async with Client.connect(app.url, TOKEN) as c:
                samples = []
                for _ in range(60):
                    t = time.perf_counter()
                    page = await c.call("sessions.list", {"limit": 50})
                    samples.append(time.perf_counter() - t)
                assert len(page["sessions"]) == 50
    m = summary_ms(samples)
    return [Figure("7 sessions", f"sessions.list newest page of 50, {n:,} sessions", m["p50"], "ms", "≤ 20",
                   m["p50"] <= 20, note=f"p99 {m['p99']:.2f} ms; creating them took {create_s:.1f} s")]
