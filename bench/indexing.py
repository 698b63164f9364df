"""4. Appends to long transcripts, local-embedder backfill; 5. event-loop health during a
backfill; 7. sessions.list with 10,000 sessions."""

from __future__ import annotations

import asyncio
import tempfile
import time
from importlib import resources
from pathlib import Path

from bench.corpus import USER, bench_memory_config, write_transcripts
from bench.stats import Figure, summary_ms
from gateway.client import Client
from memory.config import MemoryConfig
from memory.embedders.local_embedder import LocalEmbedder, package_dir
from memory.sqlite.index.db import WriteConnection, open_index
from memory.sqlite.index.indexing import Indexer
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
                                         content=f"one more appended message number {i} "
                                                 "about sourdough",
                                         ts="2025-01-01T00:00:00.000Z")
                    t = time.perf_counter()
                    report = await asyncio.to_thread(indexer.files.sync_file, path)
                    samples.append(time.perf_counter() - t)
                    assert report.chunks_written >= 1
            conn.close()
            m = summary_ms(samples)
            figs.append(Figure("4 indexing", f"one appended message, transcript of {n:,} messages",
                               m["p50"], "ms", "≤ 20", m["p50"] <= 20,
                               note=f"p99 {m['p99']:.2f} ms (indexer sync_file, no embedding)"))
    return figs


async def run_query_embedding(quick: bool) -> list[Figure]:
    """The local embedder's time for one query (excluded from the search figures)."""
    try:
        from memory.embedders.local_embedder import LocalEmbedder
    except ImportError as exc:
        return [Figure("3 search", "local embedder query time", float("nan"), "ms",
                       note=f"not installed: {exc}")]
    from bench.corpus import queries

    embedder = LocalEmbedder()
    await embedder.embed(["warm up"])
    samples = []
    for q in queries(10 if quick else 40):
        t = time.perf_counter()
        await embedder.embed([q])
        samples.append(time.perf_counter() - t)
    m = summary_ms(samples)
    return [Figure("3 search", "local embedder: one query embedding (not in search figures)",
                   m["p50"], "ms", note=f"p99 {m['p99']:.1f} ms")]


async def run_backfill_and_loop(quick: bool) -> list[Figure]:
    """Local-embedder backfill rate, its share of the model's own compute bound, and
    gateway.health latency while it runs."""
    from memory.embedders.embeddings import select_embedder

    figs: list[Figure] = []
    messages = 150 if quick else 20_000
    window_s = 15.0 if quick else 75.0
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_transcripts(root, messages=messages, per_session=50)
        cfg = gateway_config(root, memory={"embedder": "local", "debounce_ms": 50})
        local, reason = select_embedder(cfg.memory)  # the gateway's choice, not loaded
        if not isinstance(local, LocalEmbedder):
            return [Figure("5 event loop", "local embedder unavailable", float("nan"), "",
                           note=reason)]
        texts = await _chunk_texts(root, cfg.memory, local,
                                   BOUND_CHUNKS_QUICK if quick else BOUND_CHUNKS_FULL)
        # The bound before and after the backfill: a shared machine's load drifts in between.
        bound_before = await asyncio.to_thread(direct_model_rate, local, texts)
        async with running_gateway(cfg) as app:
            service = app.memory.service  # type: ignore[union-attr]
            if service.embedder is None or service.embedder.provider != "local":
                return [Figure("5 event loop", "local embedder unavailable", float("nan"), "",
                               note=service.embedder_reason)]
            async with Client.connect(app.url, TOKEN) as c:
                lat: list[float] = []
                started = time.perf_counter()
                status = await c.call("memory.status")
                # (seconds since start, chunks embedded) at each change: the gateway commits
                # the vectors of each embedder call, so the rate is read between commits.
                seen: list[tuple[float, int]] = [(0.0, status["embedded"])]
                while time.perf_counter() - started < window_s:
                    for _ in range(10):
                        t = time.perf_counter()
                        await c.call("gateway.health")
                        lat.append(time.perf_counter() - t)
                        await asyncio.sleep(0.01)
                    status = await c.call("memory.status")
                    if status["embedded"] != seen[-1][1]:
                        seen.append((time.perf_counter() - started, status["embedded"]))
                    if status["pending"] == 0 and status["chunks"] and not status["syncing"]:
                        break
        bound_after = await asyncio.to_thread(direct_model_rate, local, texts)
        m = summary_ms(lat)
        figs.append(Figure("5 event loop",
                           f"gateway.health p99 during local backfill ({messages:,} messages)",
                           m["p99"], "ms", "≤ 25", m["p99"] <= 25,
                           note=f"p50 {m['p50']:.2f} ms over {len(lat)} calls in a {window_s:.0f} "
                                f"s window; {status['embedded']} of {status['chunks']} chunks "
                                "embedded by then"))
        model = f"{service.embedder.model_id} (window {service.embedder.max_tokens})"
        # From the first commit to the last: the model's load and first call (the first commit's
        # wait) are a one-off, which the bound leaves out too.
        (t0, n0), (t1, n1) = seen[1] if len(seen) > 1 else seen[0], seen[-1]
        rate = (n1 - n0) / (t1 - t0) if t1 > t0 else float("nan")
        first = (f"first vectors committed {t0:.1f} s after the start" if len(seen) > 1
                 else "no vectors committed")
        figs.append(Figure("4 indexing", "local-embedder backfill (through the gateway, 2 cores)",
                           rate, "chunks/s",
                           note=f"{model}, chunks of {cfg.memory.chunk_tokens or 'auto'} "
                                f"approximate tokens ({status['chunks']} chunks from {messages:,} "
                                f"messages); {first}; rate from then to the last of "
                                f"{len(seen) - 1} commits"))
        bound = (bound_before + bound_after) / 2
        share = 100 * rate / bound
        figs.append(Figure("4 indexing", "local-embedder backfill, share of the model's "
                                         "compute bound", share, "%",
                           note="bound: the same ONNX model run directly (onnxruntime, "
                                f"{local.threads} threads, default session options, batches of "
                                f"{local.batch_size} sorted by length) on the first {len(texts)} "
                                f"of the same chunks in this process: {bound_before:.1f} chunks/s "
                                f"before the backfill, {bound_after:.1f} after"))
    return figs


# Chunks the compute bound runs on, in the order the gateway embeds them (id order): all of the
# quick corpus; in the full run a sample, so that a pass takes seconds and not the backfill's time.
BOUND_CHUNKS_QUICK = 1_000
BOUND_CHUNKS_FULL = 400


async def _chunk_texts(root: Path, config: MemoryConfig, embedder: LocalEmbedder,
                       limit: int) -> list[str]:
    """The first ``limit`` chunk texts the gateway's catch-up sync will embed: the same
    transcripts chunked by the real indexer with the gateway's settings, into a scratch index."""
    with tempfile.TemporaryDirectory() as scratch:
        opened = open_index(Path(scratch) / "memory.db", vec_extension=None)
        conn = WriteConnection(opened.db)
        try:
            indexer = Indexer.on(conn, opened.vectors, sessions_root(root), config,
                                 window=embedder.max_tokens)
            await indexer.sync(None)
            rows = opened.db.execute("SELECT content FROM chunks ORDER BY id LIMIT ?",
                                     (limit,)).fetchall()
        finally:
            conn.close()
    return [str(r[0]) for r in rows]


def direct_model_rate(embedder: LocalEmbedder, texts: list[str]) -> float:
    """Chunks/s of ``embedder``'s ONNX model run directly on ``texts``: the file and tokenizer
    the embedder loads, a plain onnxruntime session with its thread count and default options,
    texts sorted by length in batches of its ``batch_size`` (tokenising included). One untimed
    batch first pays the session's one-off allocations. Blocking."""
    import numpy as np
    import onnxruntime as ort
    from tokenizers import Tokenizer

    spec = embedder.spec
    root = package_dir(spec.package)
    if root is None:
        raise RuntimeError(f"{spec.package} is not installed")
    if spec.tokenizer_file.startswith("memory:"):
        tokenizer_json = resources.files("memory").joinpath(
            spec.tokenizer_file[len("memory:"):]).read_text("utf-8")
    else:
        tokenizer_json = (root / spec.tokenizer_file).read_text("utf-8")
    tokenizer = Tokenizer.from_str(tokenizer_json)
    tokenizer.enable_truncation(max_length=embedder.window)
    tokenizer.no_padding()
    options = ort.SessionOptions()
    options.intra_op_num_threads = embedder.threads
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(root / spec.model_file), sess_options=options,
                                   providers=["CPUExecutionProvider"])
    needs_types = "token_type_ids" in {i.name for i in session.get_inputs()}

    def run(batch_texts: list[str]) -> None:
        encodings = tokenizer.encode_batch([spec.passage_prefix + t for t in batch_texts])
        order = sorted(range(len(encodings)), key=lambda i: len(encodings[i].ids))
        for k in range(0, len(order), embedder.batch_size):
            rows = [encodings[i].ids for i in order[k:k + embedder.batch_size]]
            ids = np.zeros((len(rows), max(map(len, rows))), dtype=np.int64)
            mask = np.zeros_like(ids)
            for r, row in enumerate(rows):
                ids[r, :len(row)], mask[r, :len(row)] = row, 1
            feeds = {"input_ids": ids, "attention_mask": mask}
            if needs_types:
                feeds["token_type_ids"] = np.zeros_like(ids)
            session.run([spec.output], feeds)

    run(texts[:embedder.batch_size])
    started = time.perf_counter()
    run(texts)
    return len(texts) / (time.perf_counter() - started)


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
    return [Figure("7 sessions", f"sessions.list newest page of 50, {n:,} sessions", m["p50"], "ms",
                   "≤ 20", m["p50"] <= 20,
                   note=f"p99 {m['p99']:.2f} ms; creating them took {create_s:.1f} s")]
