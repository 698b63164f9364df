"""``make bench-scale``: the cost curve of search from 10k to 1M chunks (bench/README.md, "Scale").

For each size the corpus comes from :mod:`bench.scalecorpus` (built once, cached), and a fresh
child process measures it, so its RSS and its warm restart are a daemon's and not this
driver's: open the service over the built index and time the first hybrid search (the
restart), then every query in each mode alternately (library ``searchMs``), the vector leg's
recall@10 against an exact float scan, and the same queries through a gateway in that
process (client round trips). Writes ``bench/results/scale.json`` and, with the ``bench``
extra installed (matplotlib), the log-log plot ``bench/results/scale.png``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import subprocess
import sys
import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from bench.corpus import (
    USER,
    bench_memory_config,
    bench_memory_section,
    corpus_fingerprint,
    queries,
)
from bench.stats import Figure, machine_info, print_table, summary_ms

RESULTS = Path(__file__).resolve().parent / "results"
SIZES = (10_000, 100_000, 1_000_000)
MODES = ("keyword", "vector", "hybrid")
TARGETS_1M = {"hybrid_p50": 50.0, "hybrid_p99": 150.0, "recall": 0.95, "restart_ms": 1000.0,
              "rss_mb": 1536.0}
TARGET_RESTART_100K_MS = 500.0


def _proc_status() -> dict[str, int]:
    """VmRSS, VmHWM, RssAnon, RssFile of this process in KiB."""
    out: dict[str, int] = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem"):
                out[key] = int(value.split()[0])
    return out


def exact_truth(data_dir: Path, embedder: Any, qs: list[str], k: int = 10) -> list[list[int]]:
    """Exact float cosine top-k of every query over every chunk, streamed in batches (a 1M x 384
    float matrix would not fit the RSS being measured); cached beside the corpus for as long as
    the corpus has the chunks it was computed from."""
    import apsw

    cache = data_dir / f"truth-{len(qs)}.json"
    fingerprint = corpus_fingerprint(data_dir / "memory.db")
    saved = json.loads(cache.read_text()) if cache.exists() else None
    if isinstance(saved, dict) and saved.get("fingerprint") == fingerprint:
        return [list(map(int, row)) for row in saved["truth"]]
    q = embedder.vectors(qs, "query").T  # (dims, queries)
    best_ids = np.full((len(qs), 0), -1, dtype=np.int64)
    best_scores = np.full((len(qs), 0), -np.inf, dtype=np.float32)
    db = apsw.Connection(str(data_dir / "memory.db"), flags=apsw.SQLITE_OPEN_READONLY)
    rows = db.execute("SELECT id, content FROM chunks WHERE user = ? ORDER BY id", (USER,))
    while True:
        batch = [r for _, r in zip(range(8192), rows)]
        if not batch:
            break
        ids = np.array([r[0] for r in batch], dtype=np.int64)
        scores = (embedder.vectors([r[1] for r in batch]) @ q).T  # (queries, batch)
        all_scores = np.concatenate([best_scores, scores], axis=1)
        all_ids = np.concatenate([best_ids, np.broadcast_to(ids, scores.shape)], axis=1)
        keep = np.argsort(-all_scores, axis=1)[:, :k]
        best_scores = np.take_along_axis(all_scores, keep, axis=1)
        best_ids = np.take_along_axis(all_ids, keep, axis=1)
    db.close()
    truth = best_ids.tolist()
    cache.write_text(json.dumps({"fingerprint": fingerprint, "truth": truth}))
    return truth


async def _measure(data_dir: Path, n_queries: int, gateway: bool,
                   overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """In the child: the figures of one corpus (see the module doc)."""
    from bench.scalecorpus import embedder as make_embedder
    from memory.sqlite.service import MemoryService

    qs = queries(n_queries)
    emb = make_embedder()
    out: dict[str, Any] = {"rssBeforeKiB": _proc_status()}
    started = time.perf_counter()
    config = bench_memory_config()
    config = replace(config, **(overrides or {}))
    svc = MemoryService(data_dir, config, emb)  # type: ignore[arg-type]
    await svc.start()
    opened = time.perf_counter()
    first = await svc.search(USER, qs[0], mode="hybrid")
    done = time.perf_counter()
    out["restart"] = {"ms": (done - started) * 1000, "startMs": (opened - started) * 1000,
                      "firstSearchMs": (done - opened) * 1000, "mode": first.mode,
                      "fallback": first.fallback_reason}
    await svc.wait_idle()  # the catch-up sync finds nothing to do; measured searches run quiet
    # ... and so does the start's integrity check: a one-off full read (10–60 s at 1M, on the
    # other core) that the restart figure above already lived with; steady state is without it.
    checked = time.perf_counter()
    await svc.wait_checked()
    out["restart"]["integrityWaitMs"] = (time.perf_counter() - checked) * 1000
    lib: dict[str, list[float]] = {m: [] for m in MODES}
    in_turn: list[float] = []  # the baseline: hybrid with the legs one after the other
    overlapped, serial = config, replace(config, overlap_min_chunks=0)
    for _ in range(2):
        for q in qs:
            for m in MODES:
                r = await svc.search(USER, q, k=6, mode=m)
                if r.mode != m:
                    raise RuntimeError(f"{m} ran as {r.mode}: {r.fallback_reason}")
                lib[m].append(r.timings_ms["searchMs"] / 1000)
            svc.config = serial
            r = await svc.search(USER, q, k=6, mode="hybrid")
            svc.config = overlapped
            in_turn.append(r.timings_ms["searchMs"] / 1000)
    out["library"] = {m: summary_ms(v) for m, v in lib.items()}
    out["hybridLegsInTurn"] = summary_ms(in_turn)
    got = [[h.chunk_id for h in (await svc.search(USER, q, k=10, mode="vector")).results]
           for q in qs]
    out["signIndexBytes"] = svc.sign_index_bytes
    out["rssServingKiB"] = _proc_status()
    await svc.close()
    truth = exact_truth(data_dir, emb, qs)
    out["recall10"] = float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(got, truth)]))
    if gateway:
        out["gateway"] = await _through_gateway(data_dir, emb, qs)
        out["rssGatewayKiB"] = _proc_status()
    return out


async def _through_gateway(data_dir: Path, emb: Any, qs: list[str]) -> dict[str, Any]:
    from gateway.client import Client
    from testkit.gateway import TOKEN, gateway_config, running_gateway

    gw: dict[str, list[float]] = {m: [] for m in MODES}
    started = time.perf_counter()
    # The library's chunk sizes, or the gateway's catch-up sync re-chunks the whole corpus.
    async with running_gateway(gateway_config(data_dir, user=USER, memory=bench_memory_section()),
                               embedder=(emb, "bench: synthetic clustered vectors")) as app:
        async with Client.connect(app.url, TOKEN) as c:
            await c.call("memory.search", {"query": qs[0], "k": 6, "mode": "hybrid"})
            restart_ms = (time.perf_counter() - started) * 1000
            await app.memory.service.wait_idle()  # type: ignore[union-attr]
            for q in qs:
                for m in MODES:
                    t = time.perf_counter()
                    res = await c.call("memory.search", {"query": q, "k": 6, "mode": m})
                    gw[m].append(time.perf_counter() - t)
                    if res["mode"] != m:
                        raise RuntimeError(f"gateway {m} ran as {res['mode']}")
    return {"restartMs": restart_ms, **{m: summary_ms(v) for m, v in gw.items()}}


def storage(data_dir: Path, chunks: int) -> dict[str, float]:
    """Bytes per chunk on disk (cached beside the corpus: dbstat reads every page)."""
    import apsw

    cache = data_dir / "storage.json"
    db_path = data_dir / "memory.db"
    fingerprint = corpus_fingerprint(db_path)
    saved = json.loads(cache.read_text()) if cache.exists() else None
    if isinstance(saved, dict) and saved.pop("fingerprint", None) == fingerprint:
        return {k: float(v) for k, v in saved.items()}
    total = sum(p.stat().st_size for p in data_dir.glob("memory.db*") if ".corrupt-" not in p.name)
    db = apsw.Connection(str(db_path), flags=apsw.SQLITE_OPEN_READONLY)
    by_table = dict(db.execute("SELECT name, sum(pgsize) FROM dbstat GROUP BY name"))
    row = db.execute("SELECT sum(length(CAST(content AS BLOB))) FROM chunks").fetchone()
    assert row is not None  # an aggregate always answers one row
    (text,) = row
    db.close()
    group = {"fts": "chunks_fts", "vec0": "chunks_vec", "cache": "embedding_cache"}
    out = {"totalPerChunk": total / chunks, "textPerChunk": text / chunks}
    for label, prefix in group.items():
        out[f"{label}PerChunk"] = sum(v for k, v in by_table.items()
                                      if k.startswith(prefix)) / chunks
    cache.write_text(json.dumps({**out, "fingerprint": fingerprint}))
    return out


def _child(size: int, n_queries: int, gateway: bool, overrides: dict[str, Any]) -> dict[str, Any]:
    from bench.scalecorpus import corpus_dir

    cmd = [sys.executable, "-m", "bench.scale", "--child", str(corpus_dir(size)),
           "--queries", str(n_queries)]
    if not gateway:
        cmd.append("--no-gateway")
    if overrides:
        cmd += ["--overrides", json.dumps(overrides)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"measuring {size:,} failed:\n{proc.stderr[-3000:]}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def figures_for(size: int, corpus_build: dict[str, Any], m: dict[str, Any],
                st: dict[str, float]) -> list[Figure]:
    chunks = int(corpus_build["chunks"])
    label = f"{size // 1000}k" if size < 1_000_000 else f"{size // 1_000_000}M"
    sec = f"scale {label}"
    big = size >= 1_000_000
    figs: list[Figure] = []
    for mode in MODES:
        s = m["library"][mode]
        target, ok = "", None
        if mode == "hybrid" and big:
            target = f"p50 ≤ {TARGETS_1M['hybrid_p50']:.0f}, p99 ≤ {TARGETS_1M['hybrid_p99']:.0f}"
            ok = s["p50"] <= TARGETS_1M["hybrid_p50"] and s["p99"] <= TARGETS_1M["hybrid_p99"]
        note = f"p99 {s['p99']:.1f} ms"
        if "gateway" in m:
            g = m["gateway"][mode]
            note += f"; gateway p50 {g['p50']:.1f} / p99 {g['p99']:.1f} ms"
        figs.append(Figure(sec, f"{mode} library p50 ({chunks:,} chunks)", s["p50"], "ms", target,
                           ok, extra={"p99": s["p99"], "gateway": m.get("gateway", {}).get(mode)},
                           note=note))
        if mode == "hybrid" and "hybridLegsInTurn" in m:
            t = m["hybridLegsInTurn"]
            figs.append(Figure(sec, "hybrid library p50, legs one after the other (same run)",
                               t["p50"], "ms", "", None, extra={"p99": t["p99"]},
                               note=f"p99 {t['p99']:.1f} ms; overlapped/in turn p50 "
                                    f"{s['p50'] / t['p50']:.2f}×"))
    recall = m["recall10"]
    figs.append(Figure(sec, "vector recall@10 vs exact float scan", recall, "",
                       "≥ 0.95" if big else "", recall >= TARGETS_1M["recall"] if big else None))
    r = m["restart"]
    restart_target = "≤ 1,000" if big else ("≤ 500" if size == 100_000 else "")
    restart_ok = (r["ms"] <= TARGETS_1M["restart_ms"] if big
                  else r["ms"] <= TARGET_RESTART_100K_MS if size == 100_000 else None)
    figs.append(Figure(sec, "warm restart to first hybrid search", r["ms"], "ms", restart_target,
                       restart_ok and r["mode"] == "hybrid" if restart_ok is not None else None,
                       extra=r,
                       note=(f"start() {r['startMs']:.0f} ms + first search "
                             f"{r['firstSearchMs']:.0f} ms (mode {r['mode']})"
                             + (f"; through a gateway {m['gateway']['restartMs']:.0f} ms"
                                if "gateway" in m else ""))))
    rss = m.get("rssGatewayKiB", m["rssServingKiB"])
    rss_mb = rss["VmRSS"] / 1024
    figs.append(Figure(sec, "daemon RSS after the searches", rss_mb, "MB", "≤ 1,536" if big else "",
                       rss_mb <= TARGETS_1M["rss_mb"] if big else None, extra=rss,
                       note=(f"anon {rss['RssAnon'] / 1024:.0f} MB + file-backed (mapped index "
                             f"pages, reclaimable) {rss['RssFile'] / 1024:.0f} MB; "
                             f"peak {rss['VmHWM'] / 1024:.0f} MB; "
                             f"sign bits {m['signIndexBytes'] / 2**20:.1f} MiB")))
    figs.append(Figure(sec, "DB bytes per chunk", st["totalPerChunk"], "B", "", None, extra=st,
                       note=(f"text {st['textPerChunk']:.0f}, FTS {st['ftsPerChunk']:.0f}, vec0 "
                             f"{st['vec0PerChunk']:.0f}, cache {st['cachePerChunk']:.0f}")))
    kw = chunks / corpus_build["keyword_s"]
    figs.append(Figure(sec, "index build rate, keyword-only", kw, "chunks/s", "", None,
                       note=(f"vectors {chunks / corpus_build['embed_s']:,.0f} chunks/s (synthetic "
                             f"embedder: store cost only); built {corpus_build['built_at'][:16]}")))
    return figs


def plot(results: list[dict[str, Any]], path: Path) -> bool:
    """The log-log plot; False when matplotlib (the ``bench`` extra) is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    x = [r["chunks"] for r in results]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.8))
    for mode, color in zip(MODES, ("tab:blue", "tab:orange", "tab:green")):
        ax1.plot(x, [r["measured"]["library"][mode]["p50"] for r in results], "o-", color=color,
                 label=f"{mode} p50")
        ax1.plot(x, [r["measured"]["library"][mode]["p99"] for r in results], "s--", color=color,
                 alpha=0.6, label=f"{mode} p99")
    ax1.plot(x, [r["measured"]["restart"]["ms"] for r in results], "^-", color="tab:red",
             label="warm restart")
    ax1.axhline(TARGETS_1M["hybrid_p50"], color="tab:green", lw=0.8, ls=":",
                label="1M hybrid p50 target")
    ax1.axhline(TARGETS_1M["restart_ms"], color="tab:red", lw=0.8, ls=":",
                label="1M restart target")
    ax1.set(xscale="log", yscale="log", xlabel="chunks", ylabel="ms",
            title="search latency (library) and warm restart")
    ax1.legend(fontsize=7)
    ax2.plot(x, [r["measured"].get("rssGatewayKiB", r["measured"]["rssServingKiB"])["VmRSS"]
                 / 1024 for r in results], "o-", label="daemon RSS (MB)")
    ax2.plot(x, [r["measured"].get("rssGatewayKiB", r["measured"]["rssServingKiB"])["RssAnon"]
                 / 1024 for r in results], "o--", label="of which anonymous (MB)")
    ax2.plot(x, [r["storage"]["totalPerChunk"] for r in results], "s-", label="DB bytes / chunk")
    ax2.plot(x, [r["build"]["chunks"] / r["build"]["keyword_s"] for r in results], "^-",
             label="keyword index chunks/s")
    ax2.set(xscale="log", yscale="log", xlabel="chunks", title="memory, storage, build rate")
    ax2.legend(fontsize=7)
    for ax in (ax1, ax2):
        ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__)
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)),
                        help="comma-separated chunk counts")
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--no-gateway", action="store_true", help="library figures only")
    parser.add_argument("--keyword-common-share", type=float, default=None, metavar="SHARE",
                        help="memory.keyword_common_share for the searches (default: the memory "
                             "default; 0 keeps every query word)")
    parser.add_argument("--read-mmap-mb", type=int, default=None, metavar="MIB",
                        help="memory.read_mmap_mb for the searches (default: the memory default, "
                             "0: no mapped reads)")
    parser.add_argument("--rerank", choices=("auto",), default=None,
                        help="measure the re-ranker's budget and search/recall with it off and on "
                             "instead (bench/scalererank.py)")
    parser.add_argument("--budget-ms", type=int, default=None,
                        help="with --rerank: memory.rerank_budget_ms")
    parser.add_argument("--keyword-build", type=int, default=0, metavar="RUNS",
                        help="only time the keyword-only index build RUNS times over each size's "
                             "cached transcripts with this checkout's code (the figure otherwise "
                             "comes from the corpus's READY, written by whichever code built it)")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--overrides", type=json.loads, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    structlog_quiet()
    if args.child is not None:
        print(json.dumps(asyncio.run(_measure(args.child, args.queries, not args.no_gateway,
                                              args.overrides))))
        return 0
    if args.rerank is not None:
        from bench.scalererank import run

        return run([int(s) for s in args.sizes.split(",")], args.queries, args.budget_ms)
    if args.keyword_build:
        return keyword_builds([int(s) for s in args.sizes.split(",")], args.keyword_build)
    overrides = {key: value for key, value in (("keyword_common_share", args.keyword_common_share),
                                               ("read_mmap_mb", args.read_mmap_mb))
                 if value is not None}
    from bench.scalecorpus import build

    started = time.perf_counter()
    results: list[dict[str, Any]] = []
    figures: list[Figure] = []
    for size in (int(s) for s in args.sizes.split(",")):
        print(f"· {size:,} chunks …", flush=True)
        corpus = build(size, log=lambda line: print(line, flush=True))
        measured = _child(size, args.queries, not args.no_gateway, overrides)
        st = storage(corpus.data_dir, corpus.chunks)
        results.append({"size": size, "chunks": corpus.chunks, "build": corpus.build,
                        "builtNow": corpus.fresh, "measured": measured, "storage": st})
        figures.extend(figures_for(size, corpus.build, measured, st))
    print()
    print_table(figures)
    fit = results[0]["build"].get("fit", {})
    print(f"\nvectors: {results[0]['build'].get('vectors')} — synthetic, drawn from a Gaussian fit "
          f"of the real local embedder ({fit.get('model')}) over {fit.get('passages')} passages / "
          f"{fit.get('questions')} questions of {fit.get('source')} (bench/realdist.py); not the "
          "embedder run per chunk")
    info = machine_info()
    took = time.perf_counter() - started
    print(f"{info['cpuCount']} CPUs ({info['cpu']}), load average {os.getloadavg()[0]:.1f} "
          f"at the end; took {took:.0f} s")
    RESULTS.mkdir(exist_ok=True)
    out = {"at": datetime.now(UTC).isoformat(), "machine": info, "seconds": round(took, 1),
           "loadAverage": os.getloadavg(), "results": results,
           "figures": [f.to_json() for f in figures]}
    if overrides or sorted(r["size"] for r in results) != sorted(SIZES) or args.no_gateway:
        # A partial run (other sizes, settings or no gateway) leaves the full curve and its plot
        # alone.
        (RESULTS / "scale-partial.json").write_text(json.dumps(out, indent=2, default=str))
        print(f"wrote {RESULTS / 'scale-partial.json'} (not the full run: scale.json and "
              "scale.png left as they were)")
        return 0 if all(f.ok is not False for f in figures) else 1
    (RESULTS / "scale.json").write_text(json.dumps(out, indent=2, default=str))
    print(f"wrote {RESULTS / 'scale.json'}"
          + (f" and {RESULTS / 'scale.png'}" if plot(results, RESULTS / "scale.png")
             else " (no plot: pip install -e '.[bench]' for matplotlib)"))
    return 0 if all(f.ok is not False for f in figures) else 1


def keyword_builds(sizes: list[int], runs: int) -> int:
    """``--keyword-build``: the keyword-only build rate of each size, ``runs`` times, printed."""
    from bench.scalecorpus import build, keyword_build

    for size in sizes:
        corpus = build(size, log=lambda line: print(line, flush=True))
        rates = []
        for run in range(runs):
            chunks, seconds = keyword_build(corpus.data_dir)
            rates.append(chunks / seconds)
            print(f"{size:,}: run {run + 1}: {chunks:,} chunks keyword-only in {seconds:.1f} s = "
                  f"{rates[-1]:,.0f} chunks/s (load average {os.getloadavg()[0]:.1f})", flush=True)
        print(f"{size:,}: median {float(np.median(rates)):,.0f} chunks/s over {runs} runs; "
              f"the cached build's READY says {corpus.chunks / corpus.build['keyword_s']:,.0f}")
    return 0


def structlog_quiet() -> None:
    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    logging.getLogger().setLevel(logging.ERROR)


if __name__ == "__main__":
    raise SystemExit(main())
