"""Compare the offline models of ``memory.embedders.local_embedder.MODELS``: speed and
retrieval quality.

    python -m research.models speed [--models A,B] [--threads 2] [--rounds 5]
    python -m research.models recall DATASET [--models A,B] [--granularity turn|chunk]
                                  [--out-dir DIR] [-- <more bench/recall.py options>]

``speed`` embeds 32 passages of ~250 WordPiece tokens (batches of 16) and 32 short questions
(one at a time, with the query prefix) with every installed model in one process, round-robin
over ``--rounds`` rounds, and prints the median ms per text and the ratio to the first model
(MiniLM unless ``--models`` says otherwise). Texts come from ``bench/data/sample.json`` turns
joined until they reach the length.

``recall`` runs ``bench/recall.py --embedder local`` once per model through the real harness,
with each model at its own window (``max_tokens``), the configured ``local_threads``, the
passage prefix at index time and the query prefix at search time, and writes
``DIR/models.<model>.<dataset>.<granularity>.json`` (default DIR: bench/results) (the harness's
``--json``) plus a summary table.

The query prefix reaches the model through ``EmbeddingPipeline.embed_query``, which asks the
embedder for ``kind="query"``. Models whose package is missing are skipped with the reason
(``memory.embedders.local_embedder.unavailable_reason``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

_REPO = Path(__file__).resolve().parent.parent
if str(_REPO) not in sys.path:
    sys.path.insert(0, str(_REPO))

from memory.embedders.local_embedder import MODELS, LocalEmbedder, unavailable_reason  # noqa: E402

SAMPLE = _REPO / "bench" / "data" / "sample.json"
BASELINE = "all-MiniLM-L6-v2"


def _models(arg: str | None) -> list[str]:
    names = arg.split(",") if arg else [BASELINE] + [n for n in MODELS if n != BASELINE]
    out = []
    for name in names:
        why = unavailable_reason(name)
        if why:
            print(f"skip {name}: {why}", file=sys.stderr)
        else:
            out.append(name)
    return out


def _texts() -> tuple[list[str], list[str]]:
    """~250-token passages (consecutive turns joined) and the questions of the sample."""
    from tokenizers import Tokenizer

    data = json.loads(SAMPLE.read_text("utf-8"))
    tok = Tokenizer.from_file(str(_REPO / "memory" / "data" / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    passages: list[str] = []
    current: list[str] = []
    for conv in data["conversations"]:
        for session in conv["sessions"]:
            for turn in session["turns"]:
                current.append(f"{turn['speaker']}: {turn['text']}")
                text = "\n".join(current)
                enc = tok.encode(text)
                if len(enc.ids) >= 250:
                    passages.append(text[:enc.offsets[248][1]])
                    current = []
    questions = [q["question"] for q in data["questions"]]
    return passages[:32], questions[:32]


def run_speed(models: list[str], threads: int, rounds: int) -> dict[str, Any]:
    passages, questions = _texts()
    embedders = {n: LocalEmbedder(n, threads=threads) for n in models}

    async def timed(e: LocalEmbedder, items: list[str], kind: str, batch: int) -> float:
        start = time.perf_counter()
        for i in range(0, len(items), batch):
            await e.embed(items[i:i + batch], kind="query" if kind == "query" else "passage")
        return (time.perf_counter() - start) / len(items) * 1000

    async def go() -> dict[str, dict[str, list[float]]]:
        for e in embedders.values():
            await e.embed(["warm up"])
        samples: dict[str, dict[str, list[float]]] = {n: {"passage": [], "query": []}
                                                      for n in models}
        for _ in range(rounds):
            for n, e in embedders.items():
                samples[n]["passage"].append(await timed(e, passages, "passage", 16))
                samples[n]["query"].append(await timed(e, questions, "query", 1))
        return samples

    samples = asyncio.run(go())
    base = models[0]
    report: dict[str, Any] = {"threads": threads, "rounds": rounds, "passages": len(passages),
                              "questions": len(questions), "baseline": base, "models": {}}
    for n in models:
        p, q = statistics.median(samples[n]["passage"]), statistics.median(samples[n]["query"])
        report["models"][n] = {
            "ms_per_passage": round(p, 2), "ms_per_query": round(q, 2),
            "passage_ratio": round(p / statistics.median(samples[base]["passage"]), 2),
            "query_ratio": round(q / statistics.median(samples[base]["query"]), 2),
            "samples": samples[n],
        }
    print(f"{'model':22} {'ms/passage':>11} {'ratio':>6} {'ms/query':>9} {'ratio':>6}   "
          f"(~250-token passages in batches of 16; threads {threads}; median of {rounds})")
    for n, r in report["models"].items():
        print(f"{n:22} {r['ms_per_passage']:11.1f} {r['passage_ratio']:6.2f} "
              f"{r['ms_per_query']:9.1f} {r['query_ratio']:6.2f}")
    return report


def run_recall(dataset: Path, models: list[str], granularity: str, out_dir: Path,
               extra: Sequence[str]) -> dict[str, Any]:
    from bench import recall

    out_dir.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {}
    for name in models:
        def select(config: Any, _name: str = name) -> tuple[LocalEmbedder, str]:
            return (LocalEmbedder(_name, batch_size=config.local_batch_size,
                                  threads=config.local_threads),
                    f"research.models: {_name}")

        setattr(recall, "select_embedder", select)  # noqa: B010 (the harness looks it up by name)
        out = out_dir / f"models.{name}.{dataset.stem}.{granularity}.json"
        code = recall.main([str(dataset), "--embedder", "local", "--granularity", granularity,
                            "--json", str(out), *extra])
        if code != 0:
            print(f"{name}: bench/recall.py exited {code}", file=sys.stderr)
            continue
        summary[name] = json.loads(out.read_text("utf-8"))["modes"]
    print(f"\n{dataset.name}, granularity {granularity}")
    print(f"{'model':22} {'mode':8} {'R@5':>6} {'R@10':>6} {'nDCG@10':>8}")
    for name, modes in summary.items():
        for mode in ("keyword", "vector", "hybrid"):
            o = modes[mode]["overall"]
            print(f"{name:22} {mode:8} {o['recall@5']:6.3f} {o['recall@10']:6.3f} "
                  f"{o['ndcg@10']:8.3f}")
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1:]
    parser = argparse.ArgumentParser(prog="python -m research.models",
                                     description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    sp = sub.add_parser("speed")
    sp.add_argument("--models")
    sp.add_argument("--threads", type=int, default=2)
    sp.add_argument("--rounds", type=int, default=5)
    sp.add_argument("--json", type=Path)
    rp = sub.add_parser("recall")
    rp.add_argument("dataset", type=Path)
    rp.add_argument("--models")
    rp.add_argument("--granularity", choices=("turn", "chunk"), default="turn")
    rp.add_argument("--out-dir", type=Path, default=_REPO / "bench" / "results")
    args = parser.parse_args(argv)
    models = _models(args.models)
    if not models:
        print("no local model installed", file=sys.stderr)
        return 2
    if args.cmd == "speed":
        report = run_speed(models, args.threads, args.rounds)
        if args.json:
            args.json.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
        return 0
    run_recall(args.dataset, models, args.granularity, args.out_dir, extra)
    return 0


if __name__ == "__main__":
    from gateway.logs import configure_logging

    configure_logging("warning")
    raise SystemExit(main())
