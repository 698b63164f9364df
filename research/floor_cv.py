"""Which adaptive relevance floor for recall into a prompt: how much of a question's evidence
stays (positives) against how often a question asked in an index without its conversation
still recalls something (negatives), by leave-one-conversation-out cross-validation.

Indexes a dataset in ``bench/recall.py`` format once (through the real store, indexer and
search; ``--embedding-cache`` as there), asks each question's recall search once as its own
user (positive) and once as the next conversation's user (negative, ``bench.recall``'s
pairing), keeps the hits, and then scores every (``recall_vector_only_margin``,
``recall_relative_drop``) of the grid offline through memory's own steps
(``excerpts.relevant``, ``for_prompt``, ``without_repeats``; neighbour widening, which only
adds to what was placed, is left out). Each held-out conversation is scored with the setting
chosen on the others: the one with the fewest negatives among those whose prompt-recall is
within ``--max-loss`` (0.01) of the fixed floor's there.

    .venv/bin/python -m research.floor_cv bench/data/sample.json --embedder local \\
        --embedding-cache bench/.cache/recall-embeddings.sqlite
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.recall import (
    RECALL_K,
    _keeping,
    _share_cache,
    load_corpus,
    load_dataset,
    longest_turn_tokens,
    memory_config,
    negative_pairs,
    prompt_scores,
    question_moments,
)
from memory.config import MemoryConfig
from memory.embedders.embeddings import select_embedder
from memory.retrieval.excerpts import relevant, without_repeats
from memory.retrieval.recall import for_prompt
from memory.retrieval.request import SearchHit
from memory.sqlite.service import MemoryService

MARGINS = (0.0, 0.03, 0.05, 0.08, 0.1, 0.12, 0.15, 0.2)
DROPS = (1.0, 0.15, 0.1, 0.08, 0.05)


async def collect(path: Path, embedder_name: str, granularity: str,
                  cache: Path | None) -> dict[str, Any]:
    dataset = load_dataset(path)
    pairs = negative_pairs(dataset)
    with tempfile.TemporaryDirectory(prefix="recalld-floor-") as tmp:
        root = Path(tmp)
        config = memory_config(granularity, embedder=embedder_name, k=max(10, RECALL_K), rrf_k=60,
                               candidates=50, max_turn_tokens=longest_turn_tokens(dataset),
                               base=MemoryConfig())
        embedder, reason = select_embedder(config)
        if embedder is None:
            raise SystemExit(f"no embedder: {reason}")
        service = MemoryService(root, config, embedder, embedder_reason=reason)
        await service.start(catch_up=False)
        try:
            corpus = await asyncio.to_thread(load_corpus, dataset, root, granularity,
                                             lambda *a, **k: None)
            if cache is not None:
                await asyncio.to_thread(_share_cache, root / "memory.db", cache, "seed")
                await _keeping(service.sync_now(), root / "memory.db", cache)
            else:
                await service.sync_now()
            floor = service._search.relevance_floor  # noqa: SLF001 - the product's own floor
            turn_text = {t.id: t.text for c in dataset.conversations for s in c.sessions
                         for t in s.turns}
            rows = []
            for q, moment in zip(dataset.questions, question_moments(dataset), strict=True):
                asked = {}
                for side, conv in (("pos", q.conversation), ("neg", pairs[q.conversation])):
                    response = await service.search(corpus.users[conv], q.question[:2000],
                                                    k=RECALL_K, mode="hybrid", now=moment,
                                                    recency=True)
                    asked[side] = (response.results, response.mode != "keyword", floor(response))
                rows.append((q, asked))
            return {"rows": rows, "line_map": corpus.line_map, "turn_text": turn_text,
                    "config": config}
        finally:
            await service.close()


def score(data: dict[str, Any], margin: float, drop: float,
          keep: set[str] | None) -> dict[str, float]:
    config: MemoryConfig = replace(data["config"], recall_vector_only_margin=margin,
                                   recall_relative_drop=drop)
    pos: list[float] = []
    neg: list[float] = []
    tokens: list[float] = []
    for q, asked in data["rows"]:
        if keep is not None and q.conversation not in keep:
            continue
        for side in ("pos", "neg"):
            hits, vector_ran, floor = asked[side]
            chosen: list[SearchHit] = without_repeats(for_prompt(
                relevant(hits, q.question[:2000], vector_ran=vector_ran, floor=floor,
                         config=config),
                vector_ran=False, floor=None, budget_tokens=config.recall_budget_tokens))
            if side == "pos":
                s = prompt_scores(chosen, data["line_map"], data["turn_text"], q.evidence)
                pos.append(s["prompt-recall"])
            else:
                neg.append(1.0 if chosen else 0.0)
                tokens.append(float(sum(len(h.content.split()) for h in chosen)))
    n = max(1, len(pos))
    return {"prompt-recall": sum(pos) / n, "negatives": sum(neg) / max(1, len(neg)),
            "neg-words": sum(tokens) / max(1, len(tokens)), "questions": float(len(pos))}


def choose(data: dict[str, Any], keep: set[str], max_loss: float) -> tuple[float, float]:
    """The setting with the fewest negatives among those that keep prompt-recall within
    ``max_loss`` of the fixed floor's on ``keep`` (ties: more prompt-recall, then the smaller
    change)."""
    base = score(data, 0.0, 1.0, keep)["prompt-recall"]
    grid = [(m, d, score(data, m, d, keep)) for m, d in itertools.product(MARGINS, DROPS)]
    ok = [g for g in grid if g[2]["prompt-recall"] >= base - max_loss]
    best = min(ok, key=lambda g: (g[2]["negatives"], -g[2]["prompt-recall"], g[0], -g[1]))
    return best[0], best[1]


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m research.floor_cv", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dataset", type=Path)
    parser.add_argument("--embedder", default="local")
    parser.add_argument("--granularity", choices=("chunk", "turn"), default="chunk")
    parser.add_argument("--embedding-cache", type=Path, default=None)
    parser.add_argument("--max-loss", type=float, default=0.01,
                        help="the prompt-recall a setting may lose against the fixed floor"
                             " (default 0.01)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    data = asyncio.run(collect(args.dataset, args.embedder, args.granularity, args.embedding_cache))
    convs = sorted({q.conversation for q, _ in data["rows"]})
    print(f"{args.dataset} · {args.granularity} · {len(data['rows'])} questions · "
          f"{len(convs)} conversations")
    print(f"{'margin':>7} {'drop':>5} {'prompt-recall':>14} {'negatives':>10} {'neg words':>10}")
    table = []
    for m, d in itertools.product(MARGINS, DROPS):
        s = score(data, m, d, None)
        table.append({"margin": m, "drop": d, **s})
        print(f"{m:>7.2f} {d:>5.2f} {s['prompt-recall']:>14.3f} {s['negatives']:>10.3f} "
              f"{s['neg-words']:>10.1f}")
    folds = []
    for held in convs:
        m, d = choose(data, set(convs) - {held}, args.max_loss)
        s = score(data, m, d, {held})
        base = score(data, 0.0, 1.0, {held})
        folds.append({"held_out": held, "margin": m, "drop": d, **s, "base": base})
    n = sum(f["questions"] for f in folds)
    pooled = {k: sum(f[k] * f["questions"] for f in folds) / n
              for k in ("prompt-recall", "negatives")}
    base = {k: sum(f["base"][k] * f["questions"] for f in folds) / n
            for k in ("prompt-recall", "negatives")}
    print("\nleave-one-conversation-out (setting chosen on the others, scored on the held-out "
          "one):")
    for f in folds:
        print(f"  {f['held_out']:<24} margin {f['margin']:.2f} drop {f['drop']:.2f}: prompt-recall "
              f"{f['prompt-recall']:.3f} (fixed floor {f['base']['prompt-recall']:.3f}), negatives "
              f"{f['negatives']:.3f} (fixed floor {f['base']['negatives']:.3f})")
    print(f"  held-out, pooled: prompt-recall {pooled['prompt-recall']:.3f} (fixed floor "
          f"{base['prompt-recall']:.3f}), negatives {pooled['negatives']:.3f} (fixed floor "
          f"{base['negatives']:.3f})")
    if args.json is not None:
        args.json.write_text(json.dumps({"grid": table, "folds": folds}, indent=1, default=str)
                             + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
