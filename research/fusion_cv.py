"""Choosing the fusion by cross-validation: each leg's ranking dumped once, fusions scored offline.

    python -m research.fusion_cv DATASET:GRANULARITY [...] [--conversations STEM:ID,ID ...]
                              [--embedding-cache FILE] [--dumps DIR]

For every dataset × granularity the corpus is loaded and indexed like ``bench/recall.py`` does
(the real store and indexer, keyword-only), then for every question the keyword leg's top 100
(chunk id, BM25) is read from the index and the vector leg's top 100 (chunk id, cosine) is
computed exactly over the user's chunk vectors — the passage vectors come from the harness's
embedding cache (run ``make bench-recall`` first; missing ones are embedded), the queries are
embedded once. Each dump is kept in ``--dumps`` (``bench/.cache/fusion/``), so scoring another
fusion costs no model time.

The table gives R@10 / nDCG@10 of each leg and each fusion setting per dump, then
leave-one-dump-out cross-validation: the keyword weight is chosen on all other dumps (mean
R@10) and scored on the held-out one — the weight the defaults carry must win there, not only
on the data it was chosen on.

Where questions carry a moment (RealMem), a second table scores the recency term that recall
into a prompt adds (``recency_weight``, ``recency_half_life_days``) in two views: the whole
history, and "as of" each question (each leg's list cut to what was said before it, as a live
assistant meets the question).

A depth table (issue 25) scores convex fusion with each leg min-max scaled between its best
and its C-th score (``fusion_depth``) over a grid of keyword weights and depths, R@5 / R@10 /
nDCG@10, then leaves one *conversation* out: the setting is chosen on every other
conversation of every dump by the sum over dumps of min(hybrid − better leg) at R@5 and R@10,
and scored on the held-out one.

A third table scores a lift from time neighbours — each fused score plus a share of the best
(or mean) fused score of the candidates said within ten minutes of it — with its own
leave-one-out (tried, not adopted: docs/memory.md).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import math
import shutil
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

_REPO = Path(__file__).resolve().parent.parent
if str(_REPO) not in sys.path:
    sys.path.insert(0, str(_REPO))

from bench.recall import (  # noqa: E402
    hits_to_turns,
    load_corpus,
    load_dataset,
    longest_turn_tokens,
    memory_config,
    ndcg_at,
    only_conversations,
    question_moments,
    recall_at,
)
from memory import MemoryConfig, MemoryService  # noqa: E402
from memory.config import FusionMethod  # noqa: E402
from memory.retrieval.fusion import fuse, with_recency  # noqa: E402
from memory.retrieval.request import fts_query  # noqa: E402

CACHE = _REPO / "bench" / ".cache" / "recall-embeddings.sqlite"
DUMPS = _REPO / "bench" / ".cache" / "fusion"
DEPTH = 100
WEIGHTS = (0.2, 0.3, 0.4, 0.5, 0.6)

Leg = list[tuple[int, float]]


def _cached_vectors(cache: Path, texts: Sequence[str], model_id: str) -> dict[str, Any]:
    import apsw
    import numpy as np

    if not cache.exists():
        return {}
    db = apsw.Connection(str(cache), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        wanted = {hashlib.sha256(t.encode()).hexdigest() for t in texts}
        out: dict[str, Any] = {}
        for key, blob in db.execute("SELECT content_hash, vector FROM embedding_cache "
                                    "WHERE provider = 'local' AND model = ?", (model_id,)):
            if key in wanted:
                out[key] = np.frombuffer(bytes(blob), dtype=np.int8).astype(np.float32)
        return out
    finally:
        db.close()


async def dump(dataset_path: Path, granularity: str, conversations: list[str] | None, cache: Path,
               vectors: dict[str, Any] | None = None,
               keep_db: Path | None = None) -> dict[str, Any]:
    """Both legs of every question, with the line map reduced to each chunk's turn ids.

    ``vectors``, when given, receives the unit chunk vectors (``matrix``, rows in chunk-id
    order, ids in ``ids``, users in ``users``) and query vectors (``queries``) for scorers that
    need more than the two legs (research.feedback_cv), with the chunk ``texts`` and the
    question texts (``asked``); ``keep_db``, when given, receives a copy of the keyword-only
    index (research.splade runs its own keyword queries on it)."""
    import apsw
    import numpy as np

    from memory.embedders.local_embedder import LocalEmbedder

    dataset = load_dataset(dataset_path)
    if conversations:
        dataset = only_conversations(dataset, conversations)
    embedder = LocalEmbedder()
    with tempfile.TemporaryDirectory(prefix="recalld-fusion-") as tmp:
        root = Path(tmp)
        # Chunk sizes as the product would pick them for this embedder's window.
        sizes = MemoryConfig().sized_for(embedder.max_tokens)
        base = MemoryConfig(chunk_tokens=sizes.chunk_tokens, overlap_tokens=sizes.overlap_tokens)
        config = memory_config(granularity, embedder="none", k=10, rrf_k=60, candidates=DEPTH,
                               max_turn_tokens=longest_turn_tokens(dataset), base=base)
        service = MemoryService(root, config, None, embedder_reason="fusion_cv: keyword index only")
        await service.start(catch_up=False)
        corpus = await asyncio.to_thread(load_corpus, dataset, root, granularity)
        await service.sync_now()
        await service.close()
        db = apsw.Connection(str(root / "memory.db"))
        rows = list(db.execute("SELECT id, user, session_key, line_start, line_end, content "
                               "FROM chunks ORDER BY id"))
        turns = {cid: hits_to_turns(_Span(sk, ls, le), corpus.line_map)
                 for cid, _, sk, ls, le, _ in rows}
        said = dict(db.execute("SELECT id, COALESCE(end_ms, start_ms) FROM chunks"))
        moments = question_moments(dataset)
        texts = [r[5] for r in rows]
        found = _cached_vectors(cache, texts, embedder.model_id)
        missing = [t for t in texts if hashlib.sha256(t.encode()).hexdigest() not in found]
        if missing:
            print(f"  embedding {len(missing)} texts not in {cache}", file=sys.stderr)
            for start in range(0, len(missing), 64):
                part = missing[start:start + 64]
                for text, vec in zip(part, await embedder.embed(part, "passage")):
                    found[hashlib.sha256(text.encode()).hexdigest()] = np.asarray(
                        vec, dtype=np.float32)
        matrix = np.stack([found[hashlib.sha256(t.encode()).hexdigest()] for t in texts])
        matrix /= np.clip(np.linalg.norm(matrix, axis=1, keepdims=True), 1e-12, None)
        queries = np.asarray(await embedder.embed([q.question for q in dataset.questions],
                                                  "query"), dtype=np.float32)
        by_user: dict[str, list[int]] = {}
        for i, row in enumerate(rows):
            by_user.setdefault(row[1], []).append(i)
        out_q = []
        for qi, q in enumerate(dataset.questions):
            user = corpus.users[q.conversation]
            match = fts_query(q.question, 32)
            kw: Leg = [] if match is None else [(int(c), float(s)) for c, s in db.execute(
                "SELECT chunks.id, -bm25(chunks_fts) FROM chunks_fts "
                "JOIN chunks ON chunks.id = chunks_fts.rowid "
                "WHERE chunks_fts MATCH ? AND chunks.user = ? "
                "ORDER BY bm25(chunks_fts), chunks.id LIMIT ?",
                (match, user, DEPTH))]
            idx = by_user[user]
            sims = matrix[idx] @ queries[qi]
            order = np.argsort(-sims, kind="stable")[:DEPTH]
            near: Leg = [(int(rows[idx[j]][0]), float(sims[j])) for j in order]
            moment = moments[qi]
            out_q.append({"evidence": list(q.evidence), "category": q.category, "kw": kw,
                          "vec": near,
                          "conversation": q.conversation,
                          "now": None if moment is None else int(moment.timestamp() * 1000)})
        db.close()
        if keep_db is not None:
            shutil.copyfile(root / "memory.db", keep_db)
        if vectors is not None:
            vectors.update(matrix=matrix, queries=queries,
                           ids=np.array([r[0] for r in rows], dtype=np.int64),
                           users=[r[1] for r in rows],
                           user_of=[corpus.users[q.conversation] for q in dataset.questions],
                           texts=texts, asked=[q.question for q in dataset.questions])
    return {"turns": {str(k): v for k, v in turns.items()},
            "said": {str(k): v for k, v in said.items()},
            "questions": out_q}


class _Span:
    def __init__(self, session_key: str, line_start: int, line_end: int) -> None:
        self.session_key, self.line_start, self.line_end = session_key, line_start, line_end


def score(d: dict[str, Any], rank: Callable[[Leg, Leg], list[int]]) -> tuple[float, float]:
    r10 = nd = 0.0
    for q in d["questions"]:
        ranked = [d["turns"][str(c)] for c in rank(q["kw"], q["vec"])]
        r10 += recall_at(ranked, q["evidence"], 10)
        nd += ndcg_at(ranked, q["evidence"], 10)
    n = max(1, len(d["questions"]))
    return r10 / n, nd / n


def fused(fusion: FusionMethod, weight: float,
          candidates: int = 50) -> Callable[[Leg, Leg], list[int]]:
    # Min-max over every candidate, as in the tables before issue 25 (depth: depth_table).
    config = MemoryConfig(fusion=fusion, keyword_weight=weight, fusion_depth=DEPTH)
    return lambda kw, vec: [f.chunk_id for f in fuse(kw[:candidates], vec[:candidates], config)]


def _zscore(leg: Leg) -> dict[int, float]:
    scores = [s for _, s in leg]
    mean = sum(scores) / len(scores) if scores else 0.0
    spread = math.sqrt(sum((s - mean) ** 2 for s in scores) / len(scores)) if scores else 0.0
    return {cid: (s - mean) / (spread or 1.0) for cid, s in leg}


def _calibrated(leg: Leg, vector: bool) -> dict[int, float]:
    # Fixed maps instead of per-query ones: BM25 saturates as s/(s+5); cosine counts from 0.5
    # (the relevance floor) up. A query's best hit then keeps its absolute strength.
    return {cid: max(0.0, (s - 0.5) / 0.5) if vector else s / (s + 5.0) for cid, s in leg}


def combined(norm: Callable[[Leg, bool], dict[int, float]], weight: float,
             candidates: int = 50) -> Callable[[Leg, Leg], list[int]]:
    """A convex sum with another per-leg normalisation (an alternative that was tried)."""
    def rank(kw: Leg, vec: Leg) -> list[int]:
        k, v = norm(kw[:candidates], False), norm(vec[:candidates], True)
        k_floor, v_floor = min(k.values(), default=0.0), min(v.values(), default=0.0)
        score = {c: weight * k.get(c, k_floor) + (1 - weight) * v.get(c, v_floor)
                 for c in {**k, **v}}
        return sorted(score, key=lambda c: (-score[c], c))
    return rank


def settings() -> dict[str, Callable[[Leg, Leg], list[int]]]:
    out: dict[str, Callable[[Leg, Leg], list[int]]] = {
        "keyword": lambda kw, vec: [c for c, _ in kw],
        "vector": lambda kw, vec: [c for c, _ in vec],
        "rrf 0.5 (round 1)": fused("rrf", 0.5),
    }
    for w in WEIGHTS:
        out[f"convex {w}"] = fused("convex", w)
    for w in WEIGHTS:
        out[f"rrf {w}"] = fused("rrf", w)
    for w in (0.3, 0.4):
        out[f"z-score {w}"] = combined(lambda leg, _: _zscore(leg), w)
        out[f"calibrated {w}"] = combined(_calibrated, w)
    return out


RECENCY = ((0.0, 60.0), (0.1, 60.0), (0.2, 30.0), (0.2, 60.0), (0.2, 120.0), (0.3, 60.0),
           (0.4, 60.0))


def recency_scores(d: dict[str, Any], weight: float, half_life: float,
                   as_of: bool) -> tuple[float, float]:
    """R@10 / nDCG@10 of the default fusion plus the recency term, over the dated questions."""
    config = MemoryConfig(recency_weight=weight, recency_half_life_days=half_life)
    said = {int(k): v for k, v in d["said"].items()}
    r10 = nd = 0.0
    dated = [q for q in d["questions"] if q.get("now") is not None]
    for q in dated:
        kw, vec = q["kw"], q["vec"]
        if as_of:
            kw = [(c, s) for c, s in kw if (said.get(c) or 0) < q["now"]]
            vec = [(c, s) for c, s in vec if (said.get(c) or 0) < q["now"]]
        fused = with_recency(fuse(kw[:50], vec[:50], config), said, q["now"], config)
        ranked = [d["turns"][str(f.chunk_id)] for f in fused]
        r10 += recall_at(ranked, q["evidence"], 10)
        nd += ndcg_at(ranked, q["evidence"], 10)
    n = max(1, len(dated))
    return r10 / n, nd / n


NEIGHBOURS = tuple((mode, gamma) for mode in ("max", "mean") for gamma in (0.1, 0.2, 0.3, 0.5))
NEIGHBOUR_WINDOW_MS = 10 * 60_000


def neighbours(said: dict[int, int], mode: str, gamma: float) -> Callable[[Leg, Leg], list[int]]:
    """The default fusion plus ``gamma`` times the best (``max``) or the mean (``mean``, with
    the chunk itself counted as a zero) fused score of the other candidates said within
    NEIGHBOUR_WINDOW_MS of it: a conversation's strong hit lifting the turns around it
    (tried in round 2, not adopted: docs/memory.md)."""
    config = MemoryConfig()

    def rank(kw: Leg, vec: Leg) -> list[int]:
        base = {f.chunk_id: f.score for f in fuse(kw[:50], vec[:50], config)}
        score = {}
        for c, s in base.items():
            t = said.get(c)
            near = [] if t is None else [
                base[o] for o in base
                if o != c and (u := said.get(o)) is not None and abs(u - t) <= NEIGHBOUR_WINDOW_MS]
            lift = max(near, default=0.0) if mode == "max" else sum(near) / (1 + len(near))
            score[c] = s + gamma * lift
        return sorted(score, key=lambda c: (-score[c], c))
    return rank


def neighbour_table(dumps: dict[str, dict[str, Any]]) -> None:
    """The time-neighbour lift against the default, R@10 / nDCG@10, and its leave-one-out."""
    names = list(dumps)
    rows: dict[str, dict[str, tuple[float, float]]] = {"default": {n: score(d, fused("convex", 0.4))
                                                                  for n, d in dumps.items()}}
    for mode, gamma in NEIGHBOURS:
        rows[f"{mode} {gamma}"] = {
            n: score(d, neighbours({int(k): v for k, v in d["said"].items()}, mode, gamma))
            for n, d in dumps.items()}
    print(f"\ntime neighbours (within {NEIGHBOUR_WINDOW_MS // 60_000} min), R@10 / nDCG@10")
    for label, row in rows.items():
        print(label.ljust(20) + "".join(
            f"{row[n][0]:.3f} / {row[n][1]:.3f}".rjust(26) for n in names))
    for held in names:
        best = max(rows, key=lambda k: sum(rows[k][n][0] for n in names if n != held))
        print(f"  leave one out, {held:<28} {best}: R@10 {rows[best][held][0]:.3f} "
              f"(default {rows['default'][held][0]:.3f}, "
              f"{rows[best][held][0] - rows['default'][held][0]:+.3f})")


DEPTH_WEIGHTS = (0.15, 0.2, 0.25, 0.3, 0.35, 0.4)
DEPTHS = (10, 15, 20, 30, 50)


def _per_question(d: dict[str, Any],
                  rank: Callable[[Leg, Leg], list[int]]) -> list[tuple[str, float, float, float]]:
    out = []
    for q in d["questions"]:
        ranked = [d["turns"][str(c)] for c in rank(q["kw"], q["vec"])]
        out.append((q.get("conversation", ""), recall_at(ranked, q["evidence"], 5),
                    recall_at(ranked, q["evidence"], 10), ndcg_at(ranked, q["evidence"], 10)))
    return out


def depth_table(dumps: dict[str, dict[str, Any]]) -> None:
    """Convex fusion by keyword weight and normalisation depth, and its
    leave-one-conversation-out."""
    rules: dict[str, Callable[[Leg, Leg], list[int]]] = {
        "keyword": lambda kw, vec: [c for c, _ in kw],
        "vector": lambda kw, vec: [c for c, _ in vec]}
    for w in DEPTH_WEIGHTS:
        for depth in DEPTHS:
            config = MemoryConfig(keyword_weight=w, fusion_depth=depth)
            rules[f"convex {w} C{depth}"] = (lambda cfg: lambda kw, vec: [
                f.chunk_id for f in fuse(kw[:50], vec[:50], cfg)])(config)
    rows = {n: {label: _per_question(d, rank) for label, rank in rules.items()}
            for n, d in dumps.items()}

    def mean(values: list[tuple[str, float, float, float]], i: int) -> float:
        return sum(float(v[i]) for v in values) / max(1, len(values))

    print("\nnormalisation depth, R@5 / R@10 / nDCG@10")
    for label in rules:
        print(label.ljust(20) + "".join(
            (f"{mean(rows[n][label], 1):.3f} / {mean(rows[n][label], 2):.3f} / "
             f"{mean(rows[n][label], 3):.3f}").rjust(26)
            for n in dumps))

    def margin(label: str, out: tuple[str, str] | None) -> float:
        total = 0.0
        for n in dumps:
            def keep(values: list[tuple[str, float, float, float]]
                     ) -> list[tuple[str, float, float, float]]:
                return [v for v in values if (n, v[0]) != out]  # noqa: B023
            h, k, v = keep(rows[n][label]), keep(rows[n]["keyword"]), keep(rows[n]["vector"])
            total += min(mean(h, i) - max(mean(k, i), mean(v, i)) for i in (1, 2))
        return total

    candidates = [label for label in rules if label.startswith("convex")]
    held: dict[str, list[tuple[str, float, float, float]]] = {n: [] for n in dumps}
    picks: dict[str, int] = {}
    for n, conversation in sorted({(m, v[0]) for m in dumps for v in rows[m]["vector"]}):
        best = max(candidates, key=lambda label: margin(label, (n, conversation)))  # noqa: B023
        picks[best] = picks.get(best, 0) + 1
        held[n] += [v for v in rows[n][best] if v[0] == conversation]
    print(f"leave one conversation out, picks: {picks}")
    for n in dumps:
        print(f"  {n:<28} held out R@5 {mean(held[n], 1):.3f} R@10 {mean(held[n], 2):.3f} "
              f"nDCG@10 {mean(held[n], 3):.3f}")


def dump_args(prog: str, description: str,
              argv: list[str] | None) -> tuple[argparse.Namespace, dict[str, list[str]]]:
    """The arguments this module and research.feedback_cv share, and the conversation subsets by
    stem."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("runs", nargs="+", metavar="DATASET:GRANULARITY")
    parser.add_argument("--conversations", nargs="*", default=[], metavar="STEM:ID,ID")
    parser.add_argument("--embedding-cache", type=Path, default=CACHE)
    parser.add_argument("--dumps", type=Path, default=DUMPS)
    args = parser.parse_args(argv)
    return args, {s.split(":", 1)[0]: s.split(":", 1)[1].split(",")
                  for s in args.conversations if ":" in s}


def main(argv: list[str] | None = None) -> int:
    args, subsets = dump_args("python -m research.fusion_cv", __doc__.split("\n\n")[0], argv)
    dumps: dict[str, dict[str, Any]] = {}
    for run in args.runs:
        path_text, _, granularity = run.rpartition(":")
        path = Path(path_text)
        subset = subsets.get(path.stem)
        name = f"{path.stem}{'[' + str(len(subset)) + ']' if subset else ''}:{granularity}"
        # v3: dumps carry when each chunk was said, when each question was asked and its
        # conversation.
        file = args.dumps / (name.replace(":", "-").replace("[", "-").replace("]", "") + "-v3.json")
        if not file.exists():
            print(f"dumping {name} …", file=sys.stderr)
            data = asyncio.run(dump(path, granularity, subset, args.embedding_cache))
            file.parent.mkdir(parents=True, exist_ok=True)
            file.write_text(json.dumps(data), encoding="utf-8")
        dumps[name] = json.loads(file.read_text(encoding="utf-8"))
    table = {name: {label: score(d, rank) for label, rank in settings().items()}
             for name, d in dumps.items()}
    names = list(dumps)
    print("R@10 / nDCG@10".ljust(20) + "".join(n.rjust(26) for n in names))
    for label in settings():
        print(label.ljust(20) + "".join(
            f"{table[n][label][0]:.3f} / {table[n][label][1]:.3f}".rjust(26) for n in names))
    if len(names) > 1:
        print("\nleave one out: keyword_weight chosen on the others (mean R@10), scored on the one "
              "left out")
        for held in names:
            others = [n for n in names if n != held]
            best = max(WEIGHTS, key=lambda w: sum(table[n][f"convex {w}"][0] for n in others))
            r10 = table[held][f"convex {best}"][0]
            legs = max(table[held]["keyword"][0], table[held]["vector"][0])
            print(f"  {held:<28} weight {best}: R@10 {r10:.3f} (better leg {legs:.3f}, "
                  f"{r10 - legs:+.3f})")
    dated = [n for n in names if any(q.get("now") is not None for q in dumps[n]["questions"])]
    if dated:
        print("\nrecency (recall into a prompt), R@10 / nDCG@10 of the default fusion + the term, "
              "dated questions only")
        print("weight, half-life".ljust(20) + "".join(
            f"{n} {view}".rjust(30) for n in dated for view in ("whole", "as of")))
        for weight, half_life in RECENCY:
            cells = [recency_scores(dumps[n], weight, half_life, as_of) for n in dated
                     for as_of in (False, True)]
            print(f"{weight}, {half_life:g} d".ljust(20) + "".join(
                f"{r:.3f} / {g:.3f}".rjust(30) for r, g in cells))
    if len(names) > 1:
        neighbour_table(dumps)
    depth_table(dumps)
    return 0 if all(math.isfinite(v[0]) for t in table.values() for v in t.values()) else 1


if __name__ == "__main__":
    from gateway.logs import configure_logging

    configure_logging("warning")
    raise SystemExit(main())
