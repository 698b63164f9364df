"""Pseudo-relevance feedback for the vector leg, scored offline — an alternative that was tried.

    python -m research.feedback_cv DATASET:GRANULARITY [...] [--conversations STEM:ID,ID ...]
                                [--embedding-cache FILE] [--dumps DIR]

Same datasets, dumps and conversation subsets as ``research.fusion_cv`` (whose dump it reuses, and
whose cached vectors it keeps beside the dump as ``…-vectors.npz``). For every question the
default fusion's top ``m`` chunks are averaged into the query vector (``q + β·mean``,
renormalised, Rocchio's feedback), every candidate of either leg is scored again by cosine to
that query, and the legs are fused again: keyword evidence steers the vector leg without
adding a third score. It costs one cosine per candidate (~100) in the product, no second KNN.

Printed: R@5 / R@10 / nDCG@10 per dump for the grid of ``m`` and ``β`` beside the default;
leave-one-dump-out cross-validation (the setting chosen by mean R@10 on the other dumps,
scored on the held-out one); and the union bound — R@10 of both legs' top 10 together (twenty
results), a ceiling no ranking of ten drawn from those lists passes.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

_REPO = Path(__file__).resolve().parent.parent
if str(_REPO) not in sys.path:
    sys.path.insert(0, str(_REPO))

from bench.recall import ndcg_at, recall_at  # noqa: E402
from memory import MemoryConfig  # noqa: E402
from memory.retrieval.fusion import fuse  # noqa: E402
from research.fusion_cv import dump, dump_args  # noqa: E402

GRID = tuple((m, beta) for m in (1, 2, 3, 5) for beta in (0.3, 0.5, 0.7, 1.0))
CANDIDATES = 50

Leg = list[tuple[int, float]]


def load(run: str, subsets: dict[str, list[str]], cache: Path,
         dumps: Path) -> tuple[str, dict[str, Any], Any]:
    import numpy as np

    path_text, _, granularity = run.rpartition(":")
    path = Path(path_text)
    subset = subsets.get(path.stem)
    name = f"{path.stem}{'[' + str(len(subset)) + ']' if subset else ''}:{granularity}"
    stem = name.replace(":", "-").replace("[", "-").replace("]", "")
    legs_file, vec_file = dumps / f"{stem}-v2.json", dumps / f"{stem}-vectors.npz"
    if not (legs_file.exists() and vec_file.exists()):
        print(f"dumping {name} …", file=sys.stderr)
        vectors: dict[str, Any] = {}
        data = asyncio.run(dump(path, granularity, subset, cache, vectors))
        dumps.mkdir(parents=True, exist_ok=True)
        legs_file.write_text(json.dumps(data), encoding="utf-8")
        np.savez(vec_file, matrix=vectors["matrix"], queries=vectors["queries"], ids=vectors["ids"],
                 users=np.array(vectors["users"]), user_of=np.array(vectors["user_of"]))
    return name, json.loads(legs_file.read_text(encoding="utf-8")), np.load(vec_file)


def ranker(d: dict[str, Any], v: Any, m: int,
           beta: float) -> Callable[[int, dict[str, Any]], list[int]]:
    """Chunk ids for question ``qi``: the default fusion, then (``m`` > 0) feedback and again."""
    import numpy as np

    config = MemoryConfig()
    matrix, ids = v["matrix"], v["ids"]
    row = {int(c): i for i, c in enumerate(ids)}
    queries = v["queries"] / np.linalg.norm(v["queries"], axis=1, keepdims=True)

    def rank(qi: int, q: dict[str, Any]) -> list[int]:
        kw: Leg = [(int(c), float(s)) for c, s in q["kw"][:CANDIDATES]]
        vec: Leg = [(int(c), float(s)) for c, s in q["vec"][:CANDIDATES]]
        first = [f.chunk_id for f in fuse(kw, vec, config)]
        if m == 0 or not first:
            return first
        shifted = queries[qi] + beta * matrix[[row[c] for c in first[:m]]].mean(axis=0)
        shifted /= np.linalg.norm(shifted)
        pool = {c for c, _ in kw} | {c for c, _ in vec}
        rescored = sorted(((c, float(matrix[row[c]] @ shifted)) for c in pool), key=lambda x: -x[1])
        return [f.chunk_id for f in fuse(kw, rescored[:CANDIDATES], config)]
    return rank


def scores(d: dict[str, Any],
           rank: Callable[[int, dict[str, Any]], list[int]]) -> tuple[float, float, float]:
    r5 = r10 = nd = 0.0
    for qi, q in enumerate(d["questions"]):
        ranked = [d["turns"][str(c)] for c in rank(qi, q)]
        r5 += recall_at(ranked, q["evidence"], 5)
        r10 += recall_at(ranked, q["evidence"], 10)
        nd += ndcg_at(ranked, q["evidence"], 10)
    n = max(1, len(d["questions"]))
    return r5 / n, r10 / n, nd / n


def union_bound(d: dict[str, Any]) -> float:
    total = 0.0
    for q in d["questions"]:
        both = [c for c, _ in q["kw"][:10]] + [c for c, _ in q["vec"][:10]]
        total += recall_at([d["turns"][str(c)] for c in both], q["evidence"], len(both) or 1)
    return total / max(1, len(d["questions"]))


def main(argv: list[str] | None = None) -> int:
    args, subsets = dump_args("python -m research.feedback_cv", __doc__.split("\n\n")[0], argv)
    loaded = [load(run, subsets, args.embedding_cache, args.dumps) for run in args.runs]
    names = [n for n, _, _ in loaded]
    settings = {"default (no feedback)": (0, 0.0), **{f"m {m}, beta {b}": (m, b) for m, b in GRID}}
    table = {label: [scores(d, ranker(d, v, m, b)) for _, d, v in loaded]
             for label, (m, b) in settings.items()}
    print("R@5 / R@10 / nDCG@10".ljust(24) + "".join(n.rjust(24) for n in names))
    for label, row in table.items():
        print(label.ljust(24) + "".join(f"{a:.3f}/{b:.3f}/{c:.3f}".rjust(24) for a, b, c in row))
    print("union of both legs' top 10".ljust(24) + "".join(f"R@20 {union_bound(d):.3f}".rjust(24)
                                                           for _, d, _ in loaded))
    if len(names) > 1:
        print("\nleave one out: setting chosen on the others (mean R@10), scored on the one left"
              " out")
        for h, held in enumerate(names):
            best = max(table, key=lambda label: sum(table[label][i][1] for i in range(len(names))
                                                    if i != h))
            print(f"  {held}: {best} → R@10 {table[best][h][1]:.3f}"
                  f" (default {table['default (no feedback)'][h][1]:.3f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
