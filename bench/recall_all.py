"""``make bench-recall``: every dataset at both granularities, with the defaults a new user gets.

    python -m bench.recall_all [--embedder auto|local|openai|none] [--only NAME ...] [--out FILE]

Datasets are every ``*.json`` in ``bench/data/`` that loads as a ``bench/recall.py`` dataset.
Each runs at ``turn`` and ``chunk`` granularity through ``bench.recall.run_benchmark`` — the real
store, indexer and search with the default :class:`memory.MemoryConfig` — and, when its questions
carry a moment (a ``date`` or ``asked_before_turn``), is asked a second time ``--as-of`` on the same
index; recall into a prompt is scored too (``bench/recall.py --recall``), and its negatives
(``--negatives``). Then each dataset is replayed through a real gateway (``bench/conversation.py``:
one session and separate sessions; ``--conversation-questions N`` keeps N questions a conversation,
``--no-conversation`` skips it). Each table is printed as it finishes (per category); all figures go
to ``bench/results/recall.json`` (the replays under ``"conversation"``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

_REPO = Path(__file__).resolve().parent.parent
if str(_REPO) not in sys.path:
    sys.path.insert(0, str(_REPO))

from bench.conversation import format_report, limited, run_conversation_benchmark  # noqa: E402
from bench.recall import (  # noqa: E402
    DatasetError,
    RunResult,
    format_table,
    load_dataset,
    only_conversations,
    question_moments,
    run_benchmark,
)
from memory import MemoryConfig  # noqa: E402

DATA_DIRS = (_REPO / "bench" / "data",)
OUT = _REPO / "bench" / "results" / "recall.json"
CACHE = _REPO / "bench" / ".cache" / "recall-embeddings.sqlite"
GRANULARITIES = ("turn", "chunk")


def datasets(only: list[str] | None) -> list[Path]:
    found: list[Path] = []
    for folder in DATA_DIRS:
        for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
            if only and path.stem not in only:
                continue
            found.append(path)
    return found


def _summary(result: RunResult) -> dict[str, Any]:
    out = dict(result.report)
    out.update(chunks=result.chunks, turns=result.turns, embedderReason=result.embedder_reason,
               seconds={k: round(v, 1) for k, v in result.seconds.items()})
    return out


async def run(paths: list[Path], embedder: str, cache: Path | None,
              conversations: dict[str, list[str]], *, replay: bool = True,
              replay_questions: int | None = None
              ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    reports: list[dict[str, Any]] = []
    replays: list[dict[str, Any]] = []
    base = MemoryConfig(local_threads=os.cpu_count() or 1,
                        embeddings_api_key=os.environ.get("OPENAI_API_KEY"),
                        embeddings_base_url=os.environ.get("OPENAI_BASE_URL"))
    for path in paths:
        try:
            dataset = load_dataset(path)
            if path.stem in conversations:
                dataset = only_conversations(dataset, conversations[path.stem])
        except DatasetError as exc:
            print(f"skipping {path}: not a recall dataset ({exc})", file=sys.stderr)
            continue
        timed = any(m is not None for m in question_moments(dataset))
        for granularity in GRANULARITIES:
            print(f"\n=== {path.name} · {granularity} ===", flush=True)
            started = time.perf_counter()
            name = path.name + (f" [{','.join(conversations[path.stem])}]"
                                if path.stem in conversations else "")
            result = await run_benchmark(dataset, dataset_name=name, embedder_name=embedder,
                                         granularity=granularity, base_config=base,
                                         progress_stream=sys.stderr, also_as_of=timed,
                                         embedding_cache=cache, prompt=True,
                                         negatives=len(dataset.conversations) > 1)
            for view in (result, result.as_of):
                if view is None:
                    continue
                print(format_table(view), flush=True)
                reports.append(_summary(view))
            print(f"({time.perf_counter() - started:.0f} s)", flush=True)
        if replay:
            # The gateway's embedder: the local model unless keyword-only was asked for.
            replay_embedder = "none" if embedder == "none" else "local"
            print(f"\n=== {path.name} · through the gateway ({replay_embedder}) ===", flush=True)
            started = time.perf_counter()
            report = await run_conversation_benchmark(
                limited(dataset, None, replay_questions), dataset_name=path.name,
                embedder=replay_embedder, embedding_cache=cache, progress_stream=sys.stderr)
            print(format_report(report), flush=True)
            report.pop("perQuestion", None)
            replays.append(report)
            print(f"({time.perf_counter() - started:.0f} s)", flush=True)
    return reports, replays


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.recall_all",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--embedder", choices=("auto", "local", "openai", "none"), default="auto",
                        help="default: auto, what a new user gets")
    parser.add_argument("--only", nargs="*", help="dataset file stems to run (default: all)")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--conversations", nargs="*", default=[], metavar="STEM:ID,ID",
                        help="run only these conversations of a dataset, e.g. "
                             "realmem_bench:oliver_smith,sophie_dubois")
    parser.add_argument("--embedding-cache", type=Path, default=CACHE, metavar="FILE",
                        help=f"vectors kept across runs (default {CACHE.relative_to(_REPO)}; "
                             "delete it to re-embed)")
    parser.add_argument("--no-conversation", action="store_true",
                        help="skip the replays through a gateway (bench/conversation.py)")
    parser.add_argument("--conversation-questions", type=int, default=None, metavar="N",
                        help="replays: at most the first N questions of each conversation (RealMem "
                             "whole is long)")
    args = parser.parse_args(argv)
    paths = datasets(args.only)
    if not paths:
        print("no datasets found", file=sys.stderr)
        return 2
    subsets = {spec.split(":", 1)[0]: spec.split(":", 1)[1].split(",")
               for spec in args.conversations if ":" in spec}
    reports, replays = asyncio.run(run(paths, args.embedder, args.embedding_cache, subsets,
                                       replay=not args.no_conversation,
                                       replay_questions=args.conversation_questions))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {"runs": reports}
    if replays:
        out["conversation"] = replays
    args.out.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    from gateway.logs import configure_logging

    configure_logging("warning")
    raise SystemExit(main())
