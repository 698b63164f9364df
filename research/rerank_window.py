"""How deep and how wide should the budgeted cross-encoder read: candidates N × passage window W.

    python -m research.rerank_window DATASET:GRANULARITY [...] [--conversations STEM:ID,ID ...]
                                     [--every N] [--candidates N] [--windows 24,48,96] [--threads N]

Within ``rerank_budget_ms`` the product's re-ranker (:mod:`memory.embedders.rerank`) trades
depth for width: it narrows each passage to its best window of W words so that more of the
fused top N fit. This study scores, for every question, the fused top ``--candidates`` (today's
default fusion, :func:`research.splade.default_hybrid`, over :mod:`research.corpusdump`'s dumps)
with the cross-encoder at each window W, and reports for N = 3, 5, 8, 10, 15 the R@5 / R@10 /
nDCG@10 of the top N re-ordered by those scores (the rest kept in fused order), and what
reading N pairs costs: padded tokens (N × the longest of the N pairs, what the model's time
follows) and milliseconds at this run's measured cost per padded token (p50 of the batches;
run it on an idle machine and read ``uptime``).

A second table re-orders by a blend instead of the cross-encoder alone: ``b · rank score of
the cross-encoder + (1 - b) · rank score of the fusion`` over the N read (rank scores
1/(60 + rank)), b = 0.5, 0.7 — whether keeping some of the fused order helps where the
cross-encoder alone loses R@10 to the fusion.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

_REPO = Path(__file__).resolve().parent.parent
if str(_REPO) not in sys.path:
    sys.path.insert(0, str(_REPO))

from memory.embedders.rerank import _STAMP, CrossEncoder, best_window  # noqa: E402
from research.corpusdump import Corpus, load  # noqa: E402
from research.splade import default_hybrid, metrics  # noqa: E402

DEPTHS = (3, 5, 8, 10, 15)
BLENDS = (0.5, 0.7)


def study(corpus: Corpus, cross: CrossEncoder, every: int, candidates: int,
          windows: Sequence[int]) -> dict[str, Any]:
    """Per question and window: the fused top ``candidates``' scores and token lengths."""
    qs = corpus.legs["questions"]
    picked = list(range(0, len(qs), every))
    fused: list[list[int]] = []
    scores: dict[int, list[list[float]]] = {w: [] for w in windows}
    lengths: dict[int, list[list[int]]] = {w: [] for w in windows}
    per_token: list[float] = []
    for n, qi in enumerate(picked):
        kw = [(int(c), float(s)) for c, s in qs[qi]["kw"]]
        vec = [(int(c), float(s)) for c, s in qs[qi]["vec"]]
        ranking = default_hybrid(kw, vec)
        fused.append(ranking)
        asked = corpus.legs["asked"][qi]
        texts = [_STAMP.sub(":", corpus.legs["texts"][str(c)]) for c in ranking[:candidates]]
        for w in windows:
            if not texts:
                scores[w].append([])
                lengths[w].append([])
                continue
            encodings = cross._tokenizer.encode_batch([(asked, best_window(t, asked, w))
                                                       for t in texts])
            started = time.perf_counter()
            scores[w].append(cross._run(encodings))
            width = max(len(e.ids) for e in encodings)
            per_token.append((time.perf_counter() - started) * 1000 / (len(encodings) * width))
            lengths[w].append([len(e.ids) for e in encodings])
        if n % 20 == 0:
            print(f"  {corpus.name}: {n + 1}/{len(picked)}", file=sys.stderr, flush=True)
    return {"picked": picked, "fused": fused, "scores": scores, "lengths": lengths,
            "per_token": per_token}


def reordered(fused: list[int], scores: Sequence[float], n: int,
              blend: float | None = None) -> list[int]:
    """The top ``n`` re-ordered by the scores (or a rank blend with the fused order), the rest as
    fused."""
    head = fused[:min(n, len(scores))]
    if blend is None:
        order = sorted(range(len(head)), key=lambda i: (-scores[i], i))
    else:
        by_ce = sorted(range(len(head)), key=lambda i: (-scores[i], i))
        ce_rank = {i: r for r, i in enumerate(by_ce)}
        order = sorted(range(len(head)),
                       key=lambda i: (-(blend / (60 + ce_rank[i]) + (1 - blend) / (60 + i)), i))
    return [head[i] for i in order] + fused[len(head):]


def report(corpus: Corpus, r: dict[str, Any], windows: Sequence[int]) -> None:
    picked = r["picked"]
    rankings: list[list[int]] = [[] for _ in corpus.legs["questions"]]
    ms_token = statistics.median(r["per_token"]) if r["per_token"] else 0.0

    def score(ranks: Sequence[list[int]]) -> str:
        for qi, ranking in zip(picked, ranks):
            rankings[qi] = ranking
        a, b, c = metrics(corpus, rankings, picked)
        return f"{a:.3f} / {b:.3f} / {c:.3f}"

    print(f"\n{corpus.name} ({len(picked)} questions), R@5 / R@10 / nDCG@10; cost of reading N: "
          f"padded tokens p50 and ms at {ms_token:.3f} ms a padded token "
          "(p50 of this run's batches)")
    print(f"  fused (today's default)          {score(r['fused'])}")
    for blend in (None, *BLENDS):
        label = "cross-encoder" if blend is None else f"blend {blend}"
        for w in windows:
            for n in DEPTHS:
                ranks = [reordered(f, sc, n, blend) for f, sc in zip(r["fused"], r["scores"][w])]
                padded = [min(n, len(ls)) * max(ls[:n]) for ls in r["lengths"][w] if ls]
                tokens = statistics.median(padded) if padded else 0
                print(f"  {label:<13} W {w:<3} N {n:<3}    {score(ranks)}    {tokens:6.0f} tok  "
                      f"{tokens * ms_token:6.0f} ms")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m research.rerank_window",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", metavar="DATASET:GRANULARITY")
    parser.add_argument("--conversations", nargs="*", default=[], metavar="STEM:ID,ID")
    parser.add_argument("--every", type=int, default=1, help="score every Nth question (1: all)")
    parser.add_argument("--candidates", type=int, default=DEPTHS[-1])
    parser.add_argument("--windows", default="24,48,96",
                        help="passage windows in words, comma-separated")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    subsets = {s.split(":", 1)[0]: s.split(":", 1)[1].split(",")
               for s in args.conversations if ":" in s}
    windows = [int(w) for w in args.windows.split(",")]
    cross = CrossEncoder(threads=args.threads)
    cross.warm()
    for run in args.runs:
        corpus = load(run, subsets)
        report(corpus, study(corpus, cross, args.every, args.candidates, windows), windows)
    return 0


if __name__ == "__main__":
    from gateway.logs import configure_logging

    configure_logging("warning")
    raise SystemExit(main())
